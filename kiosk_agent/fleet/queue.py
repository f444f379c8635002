"""Reports not yet sent: a bounded FIFO per destination.

What could not be sent while the network was down goes out, oldest first, once it is back; when
the queue is full the oldest report is dropped and counted, because the newest state is the one
an operator needs.
"""

from __future__ import annotations

from collections import deque
from typing import Any


class ReportQueue:
    """Bounded FIFO of reports not yet sent; drops the oldest when full and counts it."""

    def __init__(self, size: int) -> None:
        self._items: deque[dict[str, Any]] = deque()
        self._size = size
        self.dropped = 0

    def put(self, report: dict[str, Any]) -> None:
        if len(self._items) >= self._size:
            self._items.popleft()
            self.dropped += 1
        self._items.append(report)

    def peek(self) -> dict[str, Any] | None:
        return self._items[0] if self._items else None

    def pop(self) -> None:
        self._items.popleft()

    def __len__(self) -> int:
        return len(self._items)
