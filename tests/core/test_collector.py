"""The collector of a long-lived agent: start-up's objects frozen once, its garbage freed first."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from kiosk_agent.core import collector


class Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only the collector frees it


@pytest.fixture
def fresh_process(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """As if no agent had started in this process yet; what the test froze is given back."""
    monkeypatch.setattr(collector, "_frozen", False)
    frozen_before = gc.get_freeze_count()
    yield
    if frozen_before == 0:
        gc.unfreeze()


@pytest.mark.usefixtures("fresh_process")
def test_start_up_objects_leave_the_collectors_sight_once_per_process() -> None:
    kept = [Node() for _ in range(100)]
    assert collector.freeze_start_up_objects()
    frozen = gc.get_freeze_count()
    assert frozen >= len(kept)  # a full collection no longer walks them
    assert not collector.freeze_start_up_objects()  # a second agent: its garbage stays collectable
    assert gc.get_freeze_count() == frozen


@pytest.mark.usefixtures("fresh_process")
def test_start_up_garbage_is_freed_not_frozen() -> None:
    gc.disable()  # only the freeze may collect it
    try:
        garbage = Node()
        gone = weakref.ref(garbage)
        del garbage
        assert gone() is not None
        collector.freeze_start_up_objects()
        assert gone() is None
    finally:
        gc.enable()
