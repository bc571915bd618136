"""A home's timers (cluster/deadlines.py): the due ones found without looking at the rest, in the
order a dict of them would give, and a peer's dropped with it."""

from __future__ import annotations

from operator import itemgetter

from sluicegate.cluster.deadlines import STALE_CHUNK, Deadlines
from tests.collector import held


def test_the_due_keys_come_in_the_order_they_were_first_set_not_by_deadline():
    deadlines: Deadlines[tuple[int, str]] = Deadlines(itemgetter(0))
    deadlines.set((1, "A"), 5.0)
    deadlines.set((2, "A"), 1.0)
    deadlines.set((3, "B"), 3.0)
    deadlines.set((4, "B"), 9.0)
    assert deadlines.next_deadline() == 1.0
    assert deadlines.due(0.5) == []
    assert deadlines.due(5.0) == [(1, "A"), (2, "A"), (3, "B")]
    # Due keys stay until they are set again or popped.
    assert deadlines.due(5.0) == [(1, "A"), (2, "A"), (3, "B")]


def test_a_key_set_again_keeps_its_place_and_a_key_popped_and_set_goes_last():
    deadlines: Deadlines[int] = Deadlines(int)
    for key in (1, 2, 3):
        deadlines.set(key, 1.0)
    deadlines.set(1, 2.0)  # later, same place
    assert deadlines.due(1.5) == [2, 3]
    assert deadlines.pop(2) == 1.0 and deadlines.pop(2) is None
    deadlines.set(2, 1.0)
    assert deadlines.due(2.0) == [1, 3, 2]
    assert deadlines.get(1) == 2.0 and 1 in deadlines and 7 not in deadlines


def test_a_deadline_moved_or_dropped_leaves_nothing_due_behind():
    deadlines: Deadlines[int] = Deadlines(int)
    deadlines.set(1, 1.0)
    deadlines.set(1, 4.0)
    deadlines.set(2, 2.0)
    deadlines.pop(2)
    assert deadlines.next_deadline() == 4.0
    assert deadlines.due(3.0) == []
    deadlines.pop(1)
    assert deadlines.next_deadline() == float("inf") and len(deadlines) == 0


def test_a_peers_keys_are_found_and_dropped_without_the_others():
    deadlines: Deadlines[tuple[int, str, int]] = Deadlines(itemgetter(0))
    deadlines.set((7, "A", 1), 1.0)
    deadlines.set((8, "A", 1), 1.0)
    deadlines.set((7, "B", 2), 1.0)
    deadlines.set((9, "A", 1), 0.5)
    deadlines.drop_peers({7, 9, 10})
    assert not deadlines.has_peer(7) and deadlines.has_peer(8) and len(deadlines) == 1
    assert deadlines.due(1.0) == [(8, "A", 1)] and deadlines.next_deadline() == 1.0


def test_dropping_most_peers_leaves_a_heap_of_those_left():
    deadlines: Deadlines[tuple[int, str]] = Deadlines(itemgetter(0))
    for peer in range(1000):
        deadlines.set((peer, "A"), float(peer))
    deadlines.drop_peers(set(range(990)))
    assert len(deadlines._heap) <= 2 * 10 + 64
    assert deadlines.next_deadline() == 990.0 and deadlines.due(995.0) == [
        (peer, "A") for peer in range(990, 996)
    ]
    deadlines.drop_peers(set(range(2000)))
    assert len(deadlines) == 0 and deadlines.next_deadline() == float("inf")
    deadlines.set((5, "A"), 1.0)
    assert deadlines.due(1.0) == [(5, "A")] and deadlines.has_peer(5)


def test_renewals_do_not_grow_the_heap_without_bound():
    """Every renewal leaves a stale entry behind; they are thrown out once they outnumber the
    keys."""
    deadlines: Deadlines[int] = Deadlines(int)
    for key in range(100):
        deadlines.set(key, 1.0)
    for round_ in range(2, 50):
        for key in range(100):
            deadlines.set(key, float(round_))
    assert len(deadlines._heap) <= 2 * 100 + 64
    assert deadlines.due(49.0) == list(range(100))


def test_the_garbage_collector_walks_only_the_heap_of_many_deadlines():
    """A home keeps a deadline per waiting lock, tens of thousands: a table of a peer's keys
    that is a dict per peer was two more references per lock for every full collection."""
    deadlines: Deadlines[tuple[int, str]] = Deadlines(itemgetter(0))
    objects, references = held(deadlines)
    for peer in range(2000):
        deadlines.set((peer, "A"), float(peer))
    more_objects, more_references = held(deadlines)
    assert more_objects - objects < 20 and more_references - references < 1.5 * 2000
    assert deadlines.has_peer(7)


def test_stale_entries_are_thrown_out_a_chunk_a_call():
    """Keys all set again to a later deadline leave as many stale entries at the front of the
    heap: each call throws out `STALE_CHUNK` of them at most, and says no later a deadline
    than the true one until they are gone."""
    deadlines: Deadlines[int] = Deadlines(int)
    keys = 3 * STALE_CHUNK
    for key in range(keys):
        deadlines.set(key, 1.0)
    for key in range(keys):
        deadlines.set(key, 5.0)
    heap = len(deadlines._heap)
    first = deadlines.next_deadline()
    assert first <= 5.0
    assert heap - len(deadlines._heap) <= STALE_CHUNK
    assert deadlines.due(4.0) == []
    calls = 1
    while deadlines.next_deadline() < 5.0:
        calls += 1
    assert deadlines.next_deadline() == 5.0 and calls <= 3
    assert deadlines.due(5.0) == list(range(keys))
