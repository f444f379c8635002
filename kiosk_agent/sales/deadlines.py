"""When a money call can no longer be answered, on this process's monotonic clock.

A money call's deadline (``answer_by``) is journaled with the call, together with the send's
:class:`~kiosk_agent.sales.clock.Anchor` (wall, monotonic, boot id). Inside a run and after a
restart on the same boot the deadline is exact. After a reboot it is fixed once, the first time
this process asks (:func:`~kiosk_agent.sales.clock.remaining`): a wall-clock step later in the run
moves it neither way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kiosk_agent.sales.clock import Anchor, Clock, remaining
from kiosk_agent.sales.journal import SaleRecord


class AnswerDeadlines:
    """The sales' answer deadlines (monotonic seconds), one clock per agent."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._fixed: dict[tuple[str, float], float] = {}  # (sale, journaled answer_by) -> due

    def sent(self, window: float) -> dict[str, Any]:
        """The journal fields of a money call sent now, whose answer window is ``window``."""
        anchor = Anchor.now(self.clock)
        return {
            "answer_by": anchor.wall + window,
            "sent_at": anchor.wall,
            "sent_mono": anchor.mono,
            "sent_boot": anchor.boot,
        }

    def due(
        self,
        record: SaleRecord,
        window: float,
        last_send: Callable[[], float] | None = None,
    ) -> float:
        """The monotonic time at which the sale's last money call can no longer be answered.

        ``window`` is the answer window the settings give the sale's flow: used only when the
        journal does not say it (a sale written before the send was anchored). ``last_send``
        gives the wall time of the last request step for a journal older still.
        """
        anchor, window = _send_of(record, window, last_send)
        if anchor.same_boot(self.clock):
            if anchor.mono is None:
                raise RuntimeError("an anchor of this boot without its monotonic time")
            return anchor.mono + window
        key = (record.sale_id, record.answer_by if record.answer_by is not None else anchor.wall)
        if key not in self._fixed:
            self._fixed[key] = self.clock.monotonic() + remaining(self.clock, anchor, window)
        return self._fixed[key]

    def left(self, record: SaleRecord, window: float) -> float:
        """Seconds until :meth:`due` (0 when passed)."""
        return max(0.0, self.due(record, window) - self.clock.monotonic())


def _send_of(
    record: SaleRecord, window: float, last_send: Callable[[], float] | None
) -> tuple[Anchor, float]:
    if record.sent_at is not None and record.answer_by is not None:
        # the window as it was when the call went out (settings may have changed since)
        return (
            Anchor(record.sent_at, record.sent_mono, record.sent_boot),
            max(0.0, record.answer_by - record.sent_at),
        )
    if record.answer_by is not None:
        return Anchor(record.answer_by - window), window
    sent = last_send() if last_send is not None else record.created_at
    return Anchor(sent), window
