"""A semaphore's waiters in arrival order (cluster/semaphore_leases.py, `WaitQueue`): the head
found past those who left, and kept as plain values, however many wait."""

from __future__ import annotations

from sluicegate.cluster.semaphore_leases import WaitQueue
from tests.collector import held


def heads(queue: WaitQueue) -> list[int]:
    """Take the waiters out from the head, in order."""
    taken = []
    while (first := queue.first()) is not None:
        taken.append(first[0])
        queue.pop(first[0])
    return taken


def test_waiters_leave_from_anywhere_and_the_rest_keep_their_order():
    queue = WaitQueue()
    for peer_id in range(1, 7):
        queue.put(peer_id, peer_id, float(peer_id))
    assert queue.pop(1) == (1, 1.0) and queue.pop(4) == (4, 4.0) and queue.pop(4) is None
    queue.put(3, 30, 0.5)  # already waiting: where it stood
    queue.put(1, 1, 9.0)  # back again: at the end
    assert len(queue) == 5 and queue.get(3) == (30, 0.5) and queue.get(4) is None
    assert queue.first() == (2, 2, 2.0)
    assert heads(queue) == [2, 3, 5, 6, 1]
    assert queue.first() is None and len(queue) == 0
    queue.put(8, 1, 10.0)
    assert queue.first() == (8, 1, 10.0)


def test_the_garbage_collector_does_not_walk_the_waiters():
    """An `OrderedDict` of 20,000 waiters was 60,000 references for every full collection."""
    queue = WaitQueue()
    objects, references = held(queue)
    for peer_id in range(2000):
        queue.put(peer_id, 1, float(peer_id))
    more_objects, more_references = held(queue)
    assert more_objects - objects < 20 and more_references - references < 100
    assert queue.first() == (0, 1, 0.0)
