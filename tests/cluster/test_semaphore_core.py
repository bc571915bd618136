"""Unit tests of the pure semaphore core (`SemaphoreCore`) and the humantime duration parser.

Everything is synchronous: `now` is a float handed to the core, so a test is its own clock. The
rules tested here are those of /work/shared/THROTTLE_API.md ("Acquire checks, in this order",
pending resolution, expiry, restore).
"""

from __future__ import annotations

import random

import pytest

from sluicegate.cluster.errors import (
    AlreadyPending,
    InvalidLockCount,
    LockHierarchyViolation,
    LockNeverAcquirable,
    RestoreConflict,
    ShrinkingLockCount,
    UnknownPeer,
    UnknownSemaphore,
)
from sluicegate.cluster.semaphores import (
    LockGranted,
    PeerRemoved,
    SemaphoreConfig,
    SemaphoreCore,
    SemaphoreStats,
)

# A and D share level 0, B and E share level 1, C is level 2. F is a roomy level-0 semaphore for the
# FIFO tests.
CONFIG = {
    "A": SemaphoreConfig(max=3),
    "B": SemaphoreConfig(max=5, level=1),
    "C": SemaphoreConfig(max=1, level=2),
    "D": SemaphoreConfig(max=2, level=0),
    "E": SemaphoreConfig(max=2, level=1),
    "F": SemaphoreConfig(max=5),
}

UNKNOWN_PEER = 424242  # never produced by the seeded generator below
T0 = 0.0
TTL = 100.0


@pytest.fixture
def core() -> SemaphoreCore:
    return SemaphoreCore(CONFIG)


@pytest.fixture
def rng() -> random.Random:
    return random.Random(1234)


def new(core: SemaphoreCore, rng: random.Random, expires_at: float = T0 + TTL) -> int:
    return core.new_peer(expires_at, rng)


def holding(
    core: SemaphoreCore, rng: random.Random, *locks: tuple[str, int], expires_at: float = T0 + TTL
) -> int:
    """A new peer holding `locks`, acquired in the order given (each must be granted)."""
    peer = new(core, rng, expires_at)
    for name, count in locks:
        assert core.acquire(peer, name, count, T0) is True
    return peer


def waiting(
    core: SemaphoreCore,
    rng: random.Random,
    name: str,
    count: int,
    now: float = T0,
    expires_at: float = T0 + TTL,
) -> int:
    """A new peer whose lock on `name` is pending."""
    peer = new(core, rng, expires_at)
    assert core.acquire(peer, name, count, now) is False
    return peer


def stats_of(core: SemaphoreCore, name: str, now: float = T0) -> SemaphoreStats:
    (found,) = [s for s in core.stats(now) if s.name == name]
    return found


# -- acquire: each row of the check order -----------------------------------------------------


def test_row1_unknown_semaphore(core, rng):
    peer = new(core, rng)
    with pytest.raises(UnknownSemaphore) as info:
        core.acquire(peer, "nope", 1, T0)
    assert info.value.semaphore == "nope"
    assert core.events() == []


def test_row2_count_above_max(core, rng):
    peer = new(core, rng)
    with pytest.raises(LockNeverAcquirable) as info:
        core.acquire(peer, "A", 4, T0)
    assert (info.value.asked, info.value.max) == (4, 3)
    assert core.remainder("A") == 3
    assert core.is_acquired(peer) is True


def test_row2_count_equal_to_max_is_fine(core, rng):
    peer = new(core, rng)
    assert core.acquire(peer, "A", 3, T0) is True
    assert core.remainder("A") == 0


def test_row3_expires_in_sets_expiry_to_now_plus_expires_in(core, rng):
    peer = new(core, rng, expires_at=100.0)
    assert core.acquire(peer, "A", 1, now=10.0, expires_in=500.0) is True
    assert core.next_deadline() == 510.0
    assert core.expire(509.0) == []
    assert core.expire(510.0) == [peer]


def test_row3_expires_in_can_move_the_deadline_earlier(core, rng):
    peer = new(core, rng, expires_at=100.0)
    assert core.acquire(peer, "A", 1, now=10.0, expires_in=5.0) is True
    assert core.next_deadline() == 15.0
    assert core.expire(15.0) == [peer]
    assert core.remainder("A") == 3


def test_row3_expires_in_with_unknown_peer(core):
    with pytest.raises(UnknownPeer) as info:
        core.acquire(UNKNOWN_PEER, "A", 1, T0, expires_in=10.0)
    assert info.value.peer_id == UNKNOWN_PEER


@pytest.mark.parametrize("count", [0, -1, -7])
def test_row4_count_below_one(core, rng, count):
    peer = new(core, rng)
    with pytest.raises(InvalidLockCount) as info:
        core.acquire(peer, "A", count, T0)
    assert info.value.count == count
    assert core.remainder("A") == 3
    assert stats_of(core, "A").pending == 0


def test_row5_unknown_peer(core):
    with pytest.raises(UnknownPeer) as info:
        core.acquire(UNKNOWN_PEER, "A", 1, T0)
    assert info.value.peer_id == UNKNOWN_PEER
    assert core.remainder("A") == 3


def test_row6_same_count_on_held_lock_is_idempotent(core, rng):
    peer = holding(core, rng, ("A", 2))
    assert core.acquire(peer, "A", 2, T0) is True
    assert core.acquire(peer, "A", 2, T0) is True
    assert core.remainder("A") == 1
    assert stats_of(core, "A") == SemaphoreStats("A", 3, 2, 0, 0.0)


def test_row6_same_count_on_pending_lock_is_idempotent(core, rng):
    holding(core, rng, ("A", 3))
    peer = waiting(core, rng, "A", 2, now=1.0)
    assert core.acquire(peer, "A", 2, now=5.0) is False
    # Asking again does not re-queue it: it keeps its place and its arrival time.
    assert stats_of(core, "A", now=7.0) == SemaphoreStats("A", 3, 3, 2, 6.0)


def test_row6_same_count_answers_by_the_peer_wide_flag(core, rng):
    # The peer holds B and waits for A: asking again for the held B answers "not all acquired".
    holding(core, rng, ("A", 3))
    peer = holding(core, rng, ("B", 2))
    assert core.acquire(peer, "A", 1, T0) is False
    assert core.acquire(peer, "B", 2, T0) is False
    assert core.remainder("B") == 3


def test_row6_smaller_count_held(core, rng):
    peer = holding(core, rng, ("A", 2))
    with pytest.raises(ShrinkingLockCount):
        core.acquire(peer, "A", 1, T0)
    assert core.remainder("A") == 1


def test_row6_smaller_count_pending(core, rng):
    holding(core, rng, ("A", 3))
    peer = waiting(core, rng, "A", 2)
    with pytest.raises(ShrinkingLockCount):
        core.acquire(peer, "A", 1, T0)
    assert stats_of(core, "A").pending == 2


def test_row6_larger_count_held_is_a_deadlock_at_the_semaphores_level(core, rng):
    peer = holding(core, rng, ("B", 2))
    with pytest.raises(LockHierarchyViolation) as info:
        core.acquire(peer, "B", 3, T0)
    assert (info.value.current, info.value.requested) == (1, 1)
    assert core.remainder("B") == 3


def test_row6_larger_count_pending(core, rng):
    holding(core, rng, ("B", 5))
    peer = waiting(core, rng, "B", 2)
    with pytest.raises(LockHierarchyViolation) as info:
        core.acquire(peer, "B", 3, T0)
    assert (info.value.current, info.value.requested) == (1, 1)
    assert stats_of(core, "B").pending == 2


def test_row7_requested_level_above_current(core, rng):
    peer = holding(core, rng, ("B", 1))
    with pytest.raises(LockHierarchyViolation) as info:
        core.acquire(peer, "C", 1, T0)
    assert (info.value.current, info.value.requested) == (1, 2)
    assert core.remainder("C") == 1


def test_row7_requested_level_equal_to_current(core, rng):
    peer = holding(core, rng, ("A", 1))
    with pytest.raises(LockHierarchyViolation) as info:
        core.acquire(peer, "D", 1, T0)
    assert (info.value.current, info.value.requested) == (0, 0)
    assert core.remainder("D") == 2


def test_row7_lower_level_is_allowed(core, rng):
    peer = holding(core, rng, ("C", 1), ("B", 2), ("A", 1))
    assert core.is_acquired(peer) is True
    assert [core.remainder(n) for n in "ABC"] == [2, 3, 0]


def test_row7_current_is_the_lowest_held_level(core, rng):
    # Holds C (level 2) and B (level 1): current is 1, so E (level 1) is refused with (1, 1).
    # With the highest held level (2) it would have been allowed.
    peer = holding(core, rng, ("C", 1), ("B", 1))
    with pytest.raises(LockHierarchyViolation) as info:
        core.acquire(peer, "E", 1, T0)
    assert (info.value.current, info.value.requested) == (1, 1)
    assert core.remainder("E") == 2


def test_row7_released_locks_no_longer_count(core, rng):
    peer = holding(core, rng, ("A", 1))
    core.release_lock(peer, "A")
    assert core.acquire(peer, "C", 1, T0) is True


def test_row7_a_pending_lock_has_no_level(core, rng):
    # A peer that only waits holds nothing, so the level rule does not apply; row 8 does.
    holding(core, rng, ("A", 3))
    peer = waiting(core, rng, "A", 1)
    with pytest.raises(AlreadyPending):
        core.acquire(peer, "C", 1, T0)


def test_row8_already_pending(core, rng):
    holding(core, rng, ("A", 3))
    peer = waiting(core, rng, "A", 1)
    with pytest.raises(AlreadyPending):
        core.acquire(peer, "D", 1, T0)
    assert core.remainder("D") == 2
    assert stats_of(core, "D").pending == 0
    assert core.is_acquired(peer) is False


def test_row9_grant_when_it_fits(core, rng):
    a = new(core, rng)
    b = new(core, rng)
    assert core.acquire(a, "A", 2, T0) is True
    assert core.acquire(b, "A", 1, T0) is True
    assert core.remainder("A") == 0
    assert core.is_acquired(a) is True
    assert core.is_acquired(b) is True


def test_row9_pending_when_it_does_not_fit(core, rng):
    holding(core, rng, ("A", 2))
    peer = new(core, rng)
    assert core.acquire(peer, "A", 2, T0) is False
    assert core.is_acquired(peer) is False
    assert core.remainder("A") == 1
    assert stats_of(core, "A") == SemaphoreStats("A", 3, 2, 2, 0.0)


def test_row9_pending_counts_as_taken(core, rng):
    # 2 held + 2 pending: a third peer asking 1 waits, though the raw remainder is 1.
    holding(core, rng, ("A", 2))
    waiting(core, rng, "A", 2)
    peer = new(core, rng)
    assert core.acquire(peer, "A", 1, T0) is False
    assert core.remainder("A") == 1
    assert stats_of(core, "A").pending == 3


def test_acquire_emits_no_events(core, rng):
    holding(core, rng, ("A", 3))
    waiting(core, rng, "A", 1)
    assert core.events() == []


# -- acquire: the order of the checks ---------------------------------------------------------


def test_order_unknown_semaphore_before_count_above_max(core, rng):
    peer = new(core, rng)
    with pytest.raises(UnknownSemaphore):
        core.acquire(peer, "nope", 1000, T0)


def test_order_unknown_semaphore_before_everything_else(core):
    with pytest.raises(UnknownSemaphore):
        core.acquire(UNKNOWN_PEER, "nope", 0, T0, expires_in=5.0)


def test_order_count_above_max_before_unknown_peer(core):
    with pytest.raises(LockNeverAcquirable):
        core.acquire(UNKNOWN_PEER, "A", 4, T0)
    with pytest.raises(LockNeverAcquirable):
        core.acquire(UNKNOWN_PEER, "A", 4, T0, expires_in=5.0)


def test_order_count_above_max_before_the_expiry_update(core, rng):
    peer = new(core, rng, expires_at=100.0)
    with pytest.raises(LockNeverAcquirable):
        core.acquire(peer, "A", 4, now=50.0, expires_in=500.0)
    assert core.next_deadline() == 100.0


def test_order_unknown_semaphore_before_the_expiry_update(core, rng):
    peer = new(core, rng, expires_at=100.0)
    with pytest.raises(UnknownSemaphore):
        core.acquire(peer, "nope", 1, now=50.0, expires_in=500.0)
    assert core.next_deadline() == 100.0


def test_order_with_expires_in_unknown_peer_before_count_below_one(core):
    with pytest.raises(UnknownPeer):
        core.acquire(UNKNOWN_PEER, "A", 0, T0, expires_in=5.0)


def test_order_without_expires_in_count_below_one_before_unknown_peer(core):
    with pytest.raises(InvalidLockCount) as info:
        core.acquire(UNKNOWN_PEER, "A", 0, T0)
    assert info.value.count == 0


def test_order_expiry_is_updated_even_when_the_count_is_invalid(core, rng):
    peer = new(core, rng, expires_at=100.0)
    with pytest.raises(InvalidLockCount):
        core.acquire(peer, "A", 0, now=10.0, expires_in=500.0)
    assert core.next_deadline() == 510.0
    assert core.expire(100.0) == []
    assert core.expire(510.0) == [peer]


def test_order_expiry_is_updated_even_when_a_later_check_fails(core, rng):
    holding(core, rng, ("A", 3), expires_at=1000.0)
    peer = waiting(core, rng, "A", 1, expires_at=100.0)
    with pytest.raises(AlreadyPending):
        core.acquire(peer, "D", 1, now=20.0, expires_in=30.0)
    assert core.next_deadline() == 50.0


def test_order_count_below_one_before_the_existing_lock_checks(core, rng):
    peer = holding(core, rng, ("A", 2))
    with pytest.raises(InvalidLockCount):
        core.acquire(peer, "A", 0, T0)


def test_order_idempotency_before_levels(core, rng):
    # Asking for A again would break the level rule (0 <= 0), but same count answers first.
    peer = holding(core, rng, ("A", 2))
    assert core.acquire(peer, "A", 2, T0) is True


def test_order_idempotency_before_already_pending(core, rng):
    holding(core, rng, ("A", 3))
    peer = waiting(core, rng, "A", 2)
    assert core.acquire(peer, "A", 2, T0) is False


def test_order_idempotency_of_a_held_lock_while_pending_elsewhere(core, rng):
    # Holds B (level 1), waits for A: asking for B again would fail rows 7 and 8.
    holding(core, rng, ("A", 3))
    peer = holding(core, rng, ("B", 1))
    assert core.acquire(peer, "A", 1, T0) is False
    assert core.acquire(peer, "B", 1, T0) is False


def test_order_shrinking_before_levels_and_pending(core, rng):
    holding(core, rng, ("A", 3))
    peer = holding(core, rng, ("B", 2))
    assert core.acquire(peer, "A", 1, T0) is False
    with pytest.raises(ShrinkingLockCount):
        core.acquire(peer, "B", 1, T0)


def test_order_larger_count_reports_the_semaphores_level_not_the_lowest_held(core, rng):
    # Holds B (level 1) and A (level 0): row 7 would say (0, 1); row 6 says (1, 1).
    peer = holding(core, rng, ("B", 1), ("A", 1))
    with pytest.raises(LockHierarchyViolation) as info:
        core.acquire(peer, "B", 2, T0)
    assert (info.value.current, info.value.requested) == (1, 1)


def test_order_larger_count_on_pending_lock_before_already_pending(core, rng):
    holding(core, rng, ("A", 3))
    peer = waiting(core, rng, "A", 1)
    with pytest.raises(LockHierarchyViolation) as info:
        core.acquire(peer, "A", 2, T0)
    assert (info.value.current, info.value.requested) == (0, 0)


def test_order_levels_before_already_pending(core, rng):
    holding(core, rng, ("A", 3))
    peer = holding(core, rng, ("B", 1))
    assert core.acquire(peer, "A", 1, T0) is False
    with pytest.raises(LockHierarchyViolation) as info:
        core.acquire(peer, "C", 1, T0)
    assert (info.value.current, info.value.requested) == (1, 2)
    # A lower level passes row 7 and then fails row 8.
    with pytest.raises(AlreadyPending):
        core.acquire(peer, "D", 1, T0)


# -- strict FIFO -----------------------------------------------------------------------------


def test_fifo_small_waiters_do_not_pass_a_big_one(core, rng):
    h3 = holding(core, rng, ("F", 3))
    h2 = holding(core, rng, ("F", 2))
    w4 = waiting(core, rng, "F", 4)
    w1a = waiting(core, rng, "F", 1)
    w1b = waiting(core, rng, "F", 1)
    assert stats_of(core, "F").pending == 6

    core.release_lock(h2, "F")  # room 2: enough for the small ones, not for the head
    assert core.events() == []
    assert core.remainder("F") == 2
    assert [core.is_acquired(p) for p in (w4, w1a, w1b)] == [False, False, False]

    core.release_lock(h3, "F")  # room 5: the 4 and the first 1
    assert core.events() == [LockGranted(w4, "F", 4), LockGranted(w1a, "F", 1)]
    assert [core.is_acquired(p) for p in (w4, w1a, w1b)] == [True, True, False]
    assert core.remainder("F") == 0
    assert stats_of(core, "F").pending == 1

    core.release_lock(w4, "F")
    assert core.events() == [LockGranted(w1b, "F", 1)]
    assert core.remainder("F") == 3
    assert stats_of(core, "F").pending == 0


def test_fifo_new_arrival_does_not_overtake_even_if_it_fits_the_remainder(core, rng):
    holding(core, rng, ("F", 3))
    big = waiting(core, rng, "F", 4)
    small = new(core, rng)
    assert core.remainder("F") == 2
    assert core.acquire(small, "F", 1, T0) is False
    assert core.is_acquired(small) is False
    assert core.is_acquired(big) is False
    assert core.remainder("F") == 2


def test_fifo_large_count_is_never_starved(core, rng):
    holders = [holding(core, rng, ("F", 1)) for _ in range(5)]
    big = waiting(core, rng, "F", 5)
    latecomers = []
    for index, holder in enumerate(holders):
        core.release_lock(holder, "F")
        if index < 4:
            assert core.events() == []
            # Someone arriving after the big waiter queues behind it, though one unit is free.
            latecomers.append(waiting(core, rng, "F", 1))
    assert core.events() == [LockGranted(big, "F", 5)]
    assert [core.is_acquired(p) for p in latecomers] == [False] * 4
    core.release_lock(big, "F")
    assert core.events() == [LockGranted(p, "F", 1) for p in latecomers]
    assert core.remainder("F") == 1


def test_fifo_grants_come_in_arrival_order(core, rng):
    holder = holding(core, rng, ("C", 1))
    waiters = [waiting(core, rng, "C", 1) for _ in range(4)]
    core.release_lock(holder, "C")
    granted = []
    for waiter in waiters:
        events = core.events()
        assert events == [LockGranted(waiter, "C", 1)]
        granted.append(waiter)
        core.release_lock(waiter, "C")
    assert granted == waiters
    assert core.events() == []
    assert core.remainder("C") == 1


def test_fifo_one_release_grants_several_waiters(core, rng):
    holder = holding(core, rng, ("F", 5))
    waiters = [waiting(core, rng, "F", c) for c in (2, 2, 1, 1)]
    core.release_lock(holder, "F")
    assert core.events() == [
        LockGranted(waiters[0], "F", 2),
        LockGranted(waiters[1], "F", 2),
        LockGranted(waiters[2], "F", 1),
    ]
    assert core.is_acquired(waiters[3]) is False
    assert core.remainder("F") == 0


# -- release_lock ----------------------------------------------------------------------------


def test_release_lock_frees_the_count(core, rng):
    peer = holding(core, rng, ("B", 3), ("A", 2))
    core.release_lock(peer, "B")
    assert core.remainder("B") == 5
    assert core.remainder("A") == 1
    assert core.is_acquired(peer) is True
    assert core.has_peer(peer) is True
    core.release_lock(peer, "A")
    assert core.remainder("A") == 3
    assert core.events() == []
    # Released, it may be acquired again, with another count.
    assert core.acquire(peer, "B", 4, T0) is True
    assert core.remainder("B") == 1


def test_release_pending_lock_withdraws_it_and_lets_the_next_through(core, rng):
    holding(core, rng, ("F", 2))
    big = waiting(core, rng, "F", 4)
    s1 = waiting(core, rng, "F", 1)
    s2 = waiting(core, rng, "F", 1)
    core.release_lock(big, "F")
    assert core.events() == [LockGranted(s1, "F", 1), LockGranted(s2, "F", 1)]
    assert core.is_acquired(big) is True  # nothing pending any more
    assert core.has_peer(big) is True
    assert core.remainder("F") == 1
    assert stats_of(core, "F") == SemaphoreStats("F", 5, 4, 0, 0.0)


def test_release_pending_lock_not_at_the_head(core, rng):
    holding(core, rng, ("F", 3))
    head = waiting(core, rng, "F", 4)
    middle = waiting(core, rng, "F", 2)
    tail = waiting(core, rng, "F", 1)
    core.release_lock(middle, "F")
    assert core.events() == []
    assert stats_of(core, "F").pending == 5
    assert [core.is_acquired(p) for p in (head, middle, tail)] == [False, True, False]


def test_released_pending_peer_may_ask_again_and_queues_last(core, rng):
    holder = holding(core, rng, ("C", 1))
    first = waiting(core, rng, "C", 1)
    second = waiting(core, rng, "C", 1)
    core.release_lock(first, "C")
    assert core.acquire(first, "C", 1, T0) is False
    core.release_lock(holder, "C")
    assert core.events() == [LockGranted(second, "C", 1)]


def test_release_lock_not_held_is_fine(core, rng):
    peer = holding(core, rng, ("A", 2))
    core.release_lock(peer, "B")
    core.release_lock(peer, "A")
    core.release_lock(peer, "A")
    assert core.events() == []
    assert core.remainder("A") == 3
    assert core.remainder("B") == 5
    assert core.has_peer(peer) is True


def test_release_lock_not_held_grants_nobody_spuriously(core, rng):
    holding(core, rng, ("F", 3))
    big = waiting(core, rng, "F", 4)
    other = new(core, rng)
    core.release_lock(other, "F")
    assert core.events() == []
    assert core.is_acquired(big) is False


def test_release_lock_unknown_semaphore_checked_before_unknown_peer(core):
    with pytest.raises(UnknownSemaphore) as info:
        core.release_lock(UNKNOWN_PEER, "nope")
    assert info.value.semaphore == "nope"


def test_release_lock_unknown_peer(core):
    with pytest.raises(UnknownPeer) as info:
        core.release_lock(UNKNOWN_PEER, "A")
    assert info.value.peer_id == UNKNOWN_PEER


def test_release_lock_unknown_semaphore_for_known_peer(core, rng):
    peer = holding(core, rng, ("A", 1))
    with pytest.raises(UnknownSemaphore):
        core.release_lock(peer, "nope")
    assert core.remainder("A") == 2


# -- release_peer ----------------------------------------------------------------------------


def test_release_peer_frees_everything(core, rng):
    peer = holding(core, rng, ("C", 1), ("B", 4), ("A", 3))
    assert core.release_peer(peer) is True
    assert [core.remainder(n) for n in "ABC"] == [3, 5, 1]
    assert core.events() == [PeerRemoved(peer, expired=False)]
    assert core.has_peer(peer) is False
    assert peer not in core.peer_ids()
    with pytest.raises(UnknownPeer):
        core.is_acquired(peer)
    with pytest.raises(UnknownPeer):
        core.acquire(peer, "A", 1, T0)


def test_release_peer_grants_waiters_after_the_removal_event(core, rng):
    peer = holding(core, rng, ("B", 5), ("A", 3))
    wa = waiting(core, rng, "A", 3)
    wb1 = waiting(core, rng, "B", 2)
    wb2 = waiting(core, rng, "B", 3)
    assert core.release_peer(peer) is True
    events = core.events()
    assert events[0] == PeerRemoved(peer, expired=False)
    assert sorted(events[1:], key=repr) == sorted(
        [LockGranted(wa, "A", 3), LockGranted(wb1, "B", 2), LockGranted(wb2, "B", 3)], key=repr
    )
    # Within one semaphore, arrival order.
    b_events = [e for e in events if isinstance(e, LockGranted) and e.semaphore == "B"]
    assert b_events == [LockGranted(wb1, "B", 2), LockGranted(wb2, "B", 3)]


def test_release_peer_withdraws_its_pending_lock(core, rng):
    holder = holding(core, rng, ("F", 2))
    big = waiting(core, rng, "F", 4)
    small = waiting(core, rng, "F", 3)
    assert core.release_peer(big) is True
    assert core.events() == [PeerRemoved(big, expired=False), LockGranted(small, "F", 3)]
    assert stats_of(core, "F") == SemaphoreStats("F", 5, 5, 0, 0.0)
    assert core.has_peer(holder) is True


def test_release_peer_unknown_returns_false(core, rng):
    peer = new(core, rng)
    assert core.release_peer(UNKNOWN_PEER) is False
    assert core.events() == []
    assert core.release_peer(peer) is True
    assert core.release_peer(peer) is False
    assert core.events() == [PeerRemoved(peer, expired=False)]


def test_release_peer_removes_its_deadline(core, rng):
    a = new(core, rng, expires_at=10.0)
    b = new(core, rng, expires_at=20.0)
    core.release_peer(a)
    assert core.next_deadline() == 20.0
    assert core.expire(15.0) == []
    assert core.expire(20.0) == [b]


# -- expiry ----------------------------------------------------------------------------------


def test_peer_expires_exactly_at_its_deadline(core, rng):
    peer = new(core, rng, expires_at=100.0)
    assert core.expire(100.0 - 1e-9) == []
    assert core.has_peer(peer) is True
    assert core.events() == []
    assert core.expire(100.0) == [peer]
    assert core.has_peer(peer) is False
    assert core.events() == [PeerRemoved(peer, expired=True)]
    assert core.next_deadline() is None


def test_peers_without_locks_expire_too(core, rng):
    a = new(core, rng, expires_at=5.0)
    b = new(core, rng, expires_at=6.0)
    assert core.expire(1000.0) == [a, b]
    assert core.peer_ids() == []
    assert core.events() == [PeerRemoved(a, expired=True), PeerRemoved(b, expired=True)]


def test_expire_takes_only_peers_due(core, rng):
    a = new(core, rng, expires_at=10.0)
    b = new(core, rng, expires_at=30.0)
    c = new(core, rng, expires_at=20.0)
    assert core.expire(25.0) == [a, c]
    assert core.peer_ids() == [b]
    assert core.next_deadline() == 30.0


def test_next_deadline_none_without_peers(core, rng):
    assert core.next_deadline() is None
    peer = new(core, rng, expires_at=7.0)
    assert core.next_deadline() == 7.0
    core.release_peer(peer)
    assert core.next_deadline() is None


def test_next_deadline_tracks_the_earliest_live_peer(core, rng):
    a = new(core, rng, expires_at=50.0)
    b = new(core, rng, expires_at=40.0)
    c = new(core, rng, expires_at=60.0)
    assert core.next_deadline() == 40.0
    core.heartbeat(b, 70.0)
    assert core.next_deadline() == 50.0
    core.heartbeat(a, 80.0)
    assert core.next_deadline() == 60.0
    core.heartbeat(c, 90.0)
    assert core.next_deadline() == 70.0
    assert core.expire(69.0) == []
    assert core.expire(70.0) == [b]
    assert core.next_deadline() == 80.0


def test_heartbeat_moves_the_deadline_later(core, rng):
    peer = new(core, rng, expires_at=100.0)
    core.heartbeat(peer, 200.0)
    assert core.expire(100.0) == []
    assert core.expire(200.0 - 1e-9) == []
    assert core.expire(200.0) == [peer]


def test_heartbeat_moves_the_deadline_earlier(core, rng):
    peer = new(core, rng, expires_at=100.0)
    core.heartbeat(peer, 50.0)
    assert core.next_deadline() == 50.0
    assert core.expire(50.0) == [peer]
    assert core.next_deadline() is None
    assert core.expire(100.0) == []


def test_heartbeat_unknown_peer(core):
    with pytest.raises(UnknownPeer) as info:
        core.heartbeat(UNKNOWN_PEER, 100.0)
    assert info.value.peer_id == UNKNOWN_PEER
    assert core.next_deadline() is None


def test_acquire_expires_in_moves_the_deadline_like_a_heartbeat(core, rng):
    peer = new(core, rng, expires_at=100.0)
    other = new(core, rng, expires_at=150.0)
    assert core.acquire(peer, "A", 1, now=90.0, expires_in=100.0) is True
    assert core.next_deadline() == 150.0
    assert core.expire(150.0) == [other]
    assert core.expire(190.0) == [peer]
    assert core.remainder("A") == 3


def test_expiry_releases_locks_and_grants_waiters(core, rng):
    holder = holding(core, rng, ("B", 4), ("A", 3), expires_at=50.0)
    wa = waiting(core, rng, "A", 2, expires_at=500.0)
    wb = waiting(core, rng, "B", 5, expires_at=500.0)
    assert core.expire(50.0) == [holder]
    events = core.events()
    assert events[0] == PeerRemoved(holder, expired=True)
    assert set(events[1:]) == {LockGranted(wa, "A", 2), LockGranted(wb, "B", 5)}
    assert len(events) == 3
    assert core.is_acquired(wa) is True
    assert core.is_acquired(wb) is True
    assert core.remainder("A") == 1
    assert core.remainder("B") == 0


def test_expired_waiter_is_withdrawn(core, rng):
    holder = holding(core, rng, ("F", 2), expires_at=500.0)
    big = waiting(core, rng, "F", 4, expires_at=10.0)
    small = waiting(core, rng, "F", 3, expires_at=500.0)
    assert core.expire(10.0) == [big]
    assert core.events() == [PeerRemoved(big, expired=True), LockGranted(small, "F", 3)]
    assert stats_of(core, "F") == SemaphoreStats("F", 5, 5, 0, 0.0)
    core.release_lock(holder, "F")
    assert core.events() == []
    assert core.remainder("F") == 2


def test_expiry_grants_to_a_waiter_expiring_later_in_the_same_sweep(core, rng):
    holder = holding(core, rng, ("C", 1), expires_at=10.0)
    w1 = waiting(core, rng, "C", 1, expires_at=10.0)
    w2 = waiting(core, rng, "C", 1, expires_at=500.0)
    expired = core.expire(10.0)
    assert sorted(expired) == sorted([holder, w1])
    if expired[0] == holder:
        # w1 is granted the lock the holder left, then expires itself and hands it on.
        expected = [
            PeerRemoved(holder, expired=True),
            LockGranted(w1, "C", 1),
            PeerRemoved(w1, expired=True),
            LockGranted(w2, "C", 1),
        ]
    else:
        expected = [
            PeerRemoved(w1, expired=True),
            PeerRemoved(holder, expired=True),
            LockGranted(w2, "C", 1),
        ]
    assert core.events() == expected
    assert core.is_acquired(w2) is True
    assert core.remainder("C") == 0


# -- restore ---------------------------------------------------------------------------------


def test_restore_creates_the_peer_with_the_given_id(core):
    core.restore(42, {"A": 2, "B": 1}, expires_at=300.0)
    assert core.peer_ids() == [42]
    assert core.has_peer(42) is True
    assert core.is_acquired(42) is True
    assert core.remainder("A") == 1
    assert core.remainder("B") == 4
    assert core.next_deadline() == 300.0
    assert core.events() == []
    core.release_lock(42, "A")
    assert core.remainder("A") == 3


def test_restore_beyond_max_makes_the_remainder_negative(core, rng):
    core.restore(1, {"A": 3}, expires_at=300.0)
    core.restore(2, {"A": 2}, expires_at=300.0)
    assert core.remainder("A") == -2
    assert stats_of(core, "A") == SemaphoreStats("A", 3, 5, 0, 0.0)
    big = new(core, rng)
    small = new(core, rng)
    assert core.acquire(big, "A", 2, T0) is False
    assert core.acquire(small, "A", 1, T0) is False
    core.release_peer(1)  # acquired 2 of 3: room 1, not enough for the head waiter
    assert core.events() == [PeerRemoved(1, expired=False)]
    assert core.remainder("A") == 1
    assert core.is_acquired(big) is False
    assert core.is_acquired(small) is False
    core.release_peer(2)
    assert core.events() == [
        PeerRemoved(2, expired=False),
        LockGranted(big, "A", 2),
        LockGranted(small, "A", 1),
    ]
    assert core.remainder("A") == 0


def test_restore_a_count_above_max_on_its_own(core):
    core.restore(7, {"C": 4}, expires_at=300.0)
    assert core.remainder("C") == -3


def test_restore_unknown_semaphore_first(core):
    with pytest.raises(UnknownSemaphore) as info:
        core.restore(42, {"A": 0, "nope": 1}, expires_at=300.0)
    assert info.value.semaphore == "nope"
    assert core.peer_ids() == []


def test_restore_unknown_semaphore_before_conflict(core):
    core.restore(42, {"A": 1}, expires_at=300.0)
    with pytest.raises(UnknownSemaphore):
        core.restore(42, {"A": 2, "nope": 1}, expires_at=300.0)


@pytest.mark.parametrize("count", [0, -3])
def test_restore_count_below_one(core, count):
    with pytest.raises(InvalidLockCount) as info:
        core.restore(42, {"A": 1, "B": count}, expires_at=300.0)
    assert info.value.count == count
    assert core.peer_ids() == []
    assert core.remainder("A") == 3


def test_restore_count_below_one_before_conflict(core):
    core.restore(42, {"A": 1}, expires_at=300.0)
    with pytest.raises(InvalidLockCount):
        core.restore(42, {"A": 0}, expires_at=300.0)


def test_restore_identical_existing_peer_is_accepted_without_extending_expiry(core):
    core.restore(42, {"A": 2, "C": 1}, expires_at=100.0)
    core.restore(42, {"C": 1, "A": 2}, expires_at=900.0)
    assert core.next_deadline() == 100.0
    assert core.remainder("A") == 1  # not counted twice
    assert core.remainder("C") == 0
    assert core.expire(100.0) == [42]


def test_restore_identical_to_a_peer_made_by_acquire(core, rng):
    peer = holding(core, rng, ("B", 2), ("A", 1), expires_at=100.0)
    core.restore(peer, {"A": 1, "B": 2}, expires_at=900.0)
    assert core.next_deadline() == 100.0
    assert core.remainder("A") == 2
    assert core.remainder("B") == 3


def test_restore_identical_empty_peer(core, rng):
    peer = new(core, rng, expires_at=100.0)
    core.restore(peer, {}, expires_at=900.0)
    assert core.next_deadline() == 100.0
    with pytest.raises(RestoreConflict):
        core.restore(peer, {"A": 1}, expires_at=900.0)


@pytest.mark.parametrize("acquired", [{"A": 1}, {"A": 2, "B": 1}, {"A": 3}, {"B": 2}, {}], ids=repr)
def test_restore_different_existing_peer_conflicts(core, acquired):
    core.restore(42, {"A": 2}, expires_at=100.0)
    with pytest.raises(RestoreConflict):
        core.restore(42, acquired, expires_at=900.0)
    assert core.remainder("A") == 1
    assert core.remainder("B") == 5
    assert core.next_deadline() == 100.0


def test_restore_existing_peer_with_a_pending_lock_conflicts(core, rng):
    holding(core, rng, ("A", 3))
    peer = holding(core, rng, ("B", 1))
    assert core.acquire(peer, "A", 2, T0) is False
    with pytest.raises(RestoreConflict):
        core.restore(peer, {"B": 1}, expires_at=900.0)
    with pytest.raises(RestoreConflict):
        core.restore(peer, {"B": 1, "A": 2}, expires_at=900.0)
    assert core.is_acquired(peer) is False
    assert stats_of(core, "A").pending == 2


def test_restore_skips_level_checks(core):
    # Held through acquire, A (level 0) then C (level 2) would be a deadlock.
    core.restore(42, {"A": 1, "D": 1, "C": 1}, expires_at=100.0)
    assert [core.remainder(n) for n in "ACD"] == [2, 0, 1]
    # Acquire still applies the rule: the lowest held level is 0.
    with pytest.raises(LockHierarchyViolation) as info:
        core.acquire(42, "B", 1, T0)
    assert (info.value.current, info.value.requested) == (0, 1)


def test_restored_peer_expires_and_releases(core, rng):
    core.restore(42, {"C": 1}, expires_at=100.0)
    waiter = waiting(core, rng, "C", 1, expires_at=500.0)
    assert core.expire(100.0) == [42]
    assert core.events() == [PeerRemoved(42, expired=True), LockGranted(waiter, "C", 1)]


def test_restore_after_expiry_recreates_the_peer(core, rng):
    peer = holding(core, rng, ("A", 2), expires_at=10.0)
    assert core.expire(10.0) == [peer]
    core.restore(peer, {"A": 2}, expires_at=400.0)
    assert core.has_peer(peer) is True
    assert core.remainder("A") == 1
    assert core.next_deadline() == 400.0


# -- observation -----------------------------------------------------------------------------


def test_is_acquired_false_while_pending(core, rng):
    holder = holding(core, rng, ("C", 1))
    peer = waiting(core, rng, "C", 1)
    assert core.is_acquired(peer) is False
    core.release_lock(holder, "C")
    assert core.is_acquired(peer) is True


def test_is_acquired_true_for_a_peer_without_locks(core, rng):
    assert core.is_acquired(new(core, rng)) is True


def test_is_acquired_unknown_peer(core):
    with pytest.raises(UnknownPeer):
        core.is_acquired(UNKNOWN_PEER)


def test_remainder_unknown_semaphore(core):
    with pytest.raises(UnknownSemaphore) as info:
        core.remainder("nope")
    assert info.value.semaphore == "nope"


def test_remainder_does_not_count_pending(core, rng):
    holding(core, rng, ("F", 4))
    waiting(core, rng, "F", 3)
    assert core.remainder("F") == 1


def test_stats_all_semaphores_in_configuration_order(core, rng):
    assert core.stats(T0) == [
        SemaphoreStats(name, cfg.max, 0, 0, 0.0) for name, cfg in CONFIG.items()
    ]


def test_stats_acquired_pending_and_longest_pending(core, rng):
    holder = holding(core, rng, ("F", 3))
    first = waiting(core, rng, "F", 4, now=10.0)
    waiting(core, rng, "F", 2, now=20.0)
    assert stats_of(core, "F", now=25.0) == SemaphoreStats("F", 5, 3, 6, 15.0)
    assert stats_of(core, "A", now=25.0) == SemaphoreStats("A", 3, 0, 0, 0.0)
    # The head is granted: the longest wait is now the second waiter's.
    core.release_lock(holder, "F")
    assert core.events() == [LockGranted(first, "F", 4)]
    assert stats_of(core, "F", now=26.0) == SemaphoreStats("F", 5, 4, 2, 6.0)


def test_stats_longest_pending_after_the_head_is_withdrawn(core, rng):
    holding(core, rng, ("F", 5))
    first = waiting(core, rng, "F", 1, now=1.0)
    waiting(core, rng, "F", 1, now=4.0)
    assert stats_of(core, "F", now=10.0).longest_pending == 9.0
    core.release_lock(first, "F")
    assert stats_of(core, "F", now=10.0) == SemaphoreStats("F", 5, 5, 1, 6.0)


def test_stats_longest_pending_is_zero_when_nobody_waits(core, rng):
    holder = holding(core, rng, ("C", 1))
    waiter = waiting(core, rng, "C", 1, now=3.0)
    core.release_lock(holder, "C")
    assert core.is_acquired(waiter) is True
    assert stats_of(core, "C", now=50.0) == SemaphoreStats("C", 1, 1, 0, 0.0)


def test_peer_ids(core, rng):
    assert core.peer_ids() == []
    a = new(core, rng)
    b = new(core, rng)
    core.restore(42, {}, expires_at=100.0)
    assert sorted(core.peer_ids()) == sorted([a, b, 42])
    core.release_peer(a)
    assert sorted(core.peer_ids()) == sorted([b, 42])


def test_new_peer_uses_the_random_generator_for_u64_ids(core):
    assert core.new_peer(100.0, random.Random(99)) == random.Random(99).getrandbits(64)
    rng = random.Random(7)
    many = [core.new_peer(100.0, rng) for _ in range(500)]
    assert all(0 <= i < 2**64 for i in many)
    assert len(set(many)) == 500
    assert any(i >= 2**53 for i in many)  # beyond a JSON double's exact range, as Throttle's ids


def test_new_peer_never_returns_a_duplicate(core):
    class Scripted(random.Random):
        def __init__(self, values):
            super().__init__(0)
            self.values = list(values)

        def getrandbits(self, k):
            assert k == 64
            return self.values.pop(0)

    rng = Scripted([5, 5, 5, 9, 9, 5, 11])
    assert core.new_peer(100.0, rng) == 5
    assert core.new_peer(100.0, rng) == 9
    assert core.new_peer(100.0, rng) == 11
    assert rng.values == []
    core.restore(12, {}, expires_at=100.0)
    assert core.new_peer(100.0, Scripted([12, 13])) == 13


def test_new_peer_seeded_generators_are_reproducible():
    one = SemaphoreCore(CONFIG)
    two = SemaphoreCore(CONFIG)
    r1, r2 = random.Random(5), random.Random(5)
    assert [one.new_peer(1.0, r1) for _ in range(20)] == [two.new_peer(1.0, r2) for _ in range(20)]


# -- the expiry heap under many heartbeats ---------------------------------------------------


def test_many_heartbeats_on_few_peers_keep_next_deadline_right(core, rng):
    peers = [new(core, rng, expires_at=10.0 + i) for i in range(3)]
    deadlines = {p: 10.0 + i for i, p in enumerate(peers)}
    for step in range(2000):
        peer = peers[step % 3]
        # Mostly later, sometimes earlier, so both stale directions occur.
        deadline = 100.0 + step if step % 7 else 50.0 + step / 2
        core.heartbeat(peer, deadline)
        deadlines[peer] = deadline
        assert core.next_deadline() == min(deadlines.values())
    by_deadline = sorted(peers, key=lambda p: deadlines[p])
    for peer in by_deadline:
        assert core.expire(deadlines[peer] - 1e-6) == []
        assert core.expire(deadlines[peer]) == [peer]
    assert core.next_deadline() is None
    assert core.events() == [PeerRemoved(p, expired=True) for p in by_deadline]


def test_many_acquire_expiry_updates_keep_next_deadline_right(core, rng):
    peers = [new(core, rng, expires_at=10.0) for _ in range(2)]
    for step in range(500):
        peer = peers[step % 2]
        assert core.acquire(peer, "A", 1, now=float(step), expires_in=30.0) is True
        expected = float(step - 1) + 30.0 if step else 10.0
        assert core.next_deadline() == expected
    assert core.next_deadline() == 498.0 + 30.0
    assert core.expire(528.0) == [peers[0]]
    assert core.remainder("A") == 2


def test_heap_compaction_keeps_removed_peers_out(core, rng):
    keep = new(core, rng, expires_at=1000.0)
    gone = new(core, rng, expires_at=5.0)
    core.release_peer(gone)
    for step in range(300):
        core.heartbeat(keep, 1000.0 + step)
    assert core.next_deadline() == 1299.0
    assert core.expire(1298.0) == []
    assert core.expire(1299.0) == [keep]
    assert core.next_deadline() is None
