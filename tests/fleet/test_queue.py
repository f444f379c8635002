"""Reports not yet sent: bounded, oldest dropped first and counted."""

from kiosk_agent.fleet.queue import ReportQueue


def test_queue_drops_the_oldest_and_counts() -> None:
    queue = ReportQueue(2)
    for n in range(5):
        queue.put({"n": n})
    assert len(queue) == 2
    assert queue.dropped == 3
    assert queue.peek() == {"n": 3}
