"""A node's rate limiters (`cluster/rate_limits.py`): limiters and keys, exact and gossip mode,
and the merging of gossiped "go" events, without any I/O."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluicegate.cluster import rate_limits
from sluicegate.cluster.errors import InvalidWeight, UnknownLimiter
from sluicegate.cluster.rate_algorithms import Decision
from sluicegate.cluster.rate_limits import (
    HANDOVER_KEPT,
    REMEMBER_GOES_FOR,
    RateEvents,
    RateLimiterConfig,
    RateLimits,
    SlotRates,
)
from sluicegate.cluster.ring import rate_key
from sluicegate.cluster.slots import Ballot, slot_of

CONFIGS = {
    "api": RateLimiterConfig("token_bucket", 4, rate=1.0),
    "crawl": RateLimiterConfig("fixed_window", 5, window=1.0, mode="gossip"),
}


def node(origin: str, seed: int = 1) -> RateLimits:
    return RateLimits(CONFIGS, origin, random.Random(seed))


def test_keys_are_limited_apart_and_errors_name_what_is_wrong():
    limits = node("n1")
    assert [limits.check("api", "u1", 1, 0.0).go for _ in range(5)] == [True] * 4 + [False]
    assert limits.check("api", "u2", 4, 0.0).go  # another key, its own bucket
    with pytest.raises(UnknownLimiter):
        limits.check("nope", "u1", 1, 0.0)
    with pytest.raises(InvalidWeight):
        limits.check("api", "u1", 5, 0.0)  # more than the bucket ever holds
    with pytest.raises(InvalidWeight):
        limits.check("api", "u1", 0, 0.0)
    assert (limits.stats["api"].go, limits.stats["api"].sorry) == (5, 1)


def test_only_gossip_mode_makes_events_and_a_peer_counts_them():
    n1, n2 = node("n1", 1), node("n2", 2)
    n1.check("api", "k", 1, 0.0)
    assert n1.take_events() is None  # exact mode: the owner alone decides
    for _ in range(3):
        assert n1.check("crawl", "k", 1, 0.1).go
    message = n1.take_events()
    assert isinstance(message, RateEvents) and len(message.events) == 3
    assert n1.take_events() is None
    n2.receive(message, 0.2)
    assert n2.check("crawl", "k", 2, 0.3).go
    assert not n2.check("crawl", "k", 1, 0.3).go  # 3 there + 2 here fill the window of 5


@pytest.mark.parametrize(
    "config",
    [
        RateLimiterConfig("fixed_window", 5, window=1.0, mode="gossip"),
        RateLimiterConfig("sliding_window", 5, window=1.0, mode="gossip"),
        RateLimiterConfig("sliding_log", 5, window=1.0, mode="gossip"),
        RateLimiterConfig("token_bucket", 5, rate=1.0, mode="gossip"),
    ],
    ids=lambda config: config.algorithm,
)
def test_goes_from_a_clock_ahead_never_make_a_node_forget_its_own(config):
    """A node whose clock is ahead stamps its goes in this node's future (here 1.5 s ahead:
    the next window). They count as of their arrival, not from then: taken at their stamp,
    they moved the key's window on, and this node forgot the 4 it had just admitted itself."""
    here = RateLimits({"crawl": config}, "n1", random.Random(1))
    ahead = RateLimits({"crawl": config}, "n2", random.Random(2))
    for _ in range(4):
        assert here.check("crawl", "k", 1, 10.2).go
    assert ahead.check("crawl", "k", 1, 10.2 + 1.5).go
    here.receive(ahead.take_events(), 10.3)
    assert not here.check("crawl", "k", 1, 10.4).go  # 4 here, 1 there: the 5 it allows


@given(st.permutations(range(6)), st.lists(st.integers(0, 5), max_size=6))
def test_duplicates_and_reordering_never_count_twice(order, repeats):
    n1, n2, n3 = node("n1", 1), node("n2", 2), node("n3", 3)
    messages = []
    for origin in [n1] * 5 + [n3]:
        assert origin.check("crawl", "k", 1, 0.5).go
        messages.append(origin.take_events())
    for index in list(order) + repeats:  # every message once, in any order, some again
        n2.receive(messages[index], 0.6)
    assert n2.stats["crawl"].overshoot == 1  # 6 admitted in a window of 5: exactly 1 over
    assert not n2.check("crawl", "k", 1, 0.7).go


def test_merging_finds_the_overshoot_that_deciding_apart_let_through():
    n1, n2 = node("n1", 1), node("n2", 2)
    for limits in (n1, n2):
        for _ in range(5):
            assert limits.check("crawl", "k", 1, 0.5).go  # neither has heard of the other
    n2.receive(n1.take_events(), 0.6)
    n1.receive(n2.take_events(), 0.6)
    assert n1.stats["crawl"].overshoot == n2.stats["crawl"].overshoot == 5
    assert n2.stats["crawl"].gossip_lag == pytest.approx(0.1)


def test_a_restarted_origin_is_heard_again():
    n1, n2 = node("n1", 1), node("n2", 2)
    n1.check("crawl", "k", 1, 0.1)
    n2.receive(n1.take_events(), 0.1)
    reborn = node("n1", 3)  # a new incarnation numbers its events from 1 again
    reborn.check("crawl", "k", 1, 0.2)
    n2.receive(reborn.take_events(), 0.2)
    assert n2.check("crawl", "k", 3, 0.3).go
    assert not n2.check("crawl", "k", 1, 0.3).go


def test_idle_keys_are_evicted():
    limits = node("n1")
    limits.check("api", "u1", 4, 0.0)
    limits.check("crawl", "u1", 1, 0.0)
    assert limits.keys() == 2
    assert limits.evict(1.0) == 1  # the window is over; the bucket is not full yet
    assert limits.evict(4.0) == 1
    assert limits.keys() == 0


def test_a_key_moves_with_its_state_when_the_members_change():
    owner, successor = node("n1", 1), node("n2", 2)
    for _ in range(3):
        assert owner.check("api", "k", 1, 0.0).go
    successor.store(owner.export(owner.held_keys(), 0.0, drop=True).states, 0.0)
    assert owner.keys() == 0
    assert successor.check("api", "k", 1, 0.0).go
    assert not successor.check("api", "k", 1, 0.0).go  # 3 there, 1 here: the bucket of 4
    assert successor.check("api", "k", 1, 1.0).go  # refilled one token in a second


def test_a_go_is_remembered_by_its_retry_id_and_moves_with_its_key():
    owner, successor = node("n1", 1), node("n2", 2)
    first = owner.check("api", "k", 3, 0.0, retry_id=7)
    assert first.go and first.remaining == 1
    assert owner.check("api", "k", 3, 0.5, retry_id=7) == first  # a retry: the same go
    assert owner.earlier_go("api", "k", 7) == first
    assert owner.earlier_go("api", "k", 8) is None and owner.earlier_go("api", "other", 7) is None
    assert owner.earlier_go("api", "k", None) is None
    assert not owner.check("api", "k", 3, 0.5, retry_id=9).go
    assert owner.earlier_go("api", "k", 9) is None  # a sorry took nothing: decided again
    assert (owner.stats["api"].go, owner.stats["api"].repeated) == (1, 2)
    assert len(owner.goes) == 1

    successor.store(owner.export(owner.held_keys(), 0.5, drop=True).states, 0.5)
    assert len(owner.goes) == 0
    assert successor.check("api", "k", 3, 1.0, retry_id=7) == first

    # The bucket is full again after 4 s, but the key stays while it remembers a go: at least
    # REMEMBER_GOES_FOR from when it came, at most twice that.
    assert successor.evict(10.0) == 0
    assert successor.evict(10.0 + REMEMBER_GOES_FOR) == 0
    assert successor.earlier_go("api", "k", 7) == first
    assert successor.evict(10.0 + 2 * REMEMBER_GOES_FOR) == 1
    assert successor.earlier_go("api", "k", 7) is None and len(successor.goes) == 0


def test_past_its_bound_the_memory_of_goes_forgets_the_older_half_early(monkeypatch):
    monkeypatch.setattr(rate_limits, "MAX_REMEMBERED_GOES", 4)
    goes = rate_limits.RememberedGoes()
    for retry_id in range(7):
        goes.remember(("api", "k"), retry_id, Decision(True, 0, 0.0), 0.0)
    # Generations of two, long before REMEMBER_GOES_FOR: the third forgot the first, the
    # fourth (6, so far) the second.
    assert [goes.find(("api", "k"), r) is not None for r in range(7)] == [False] * 4 + [True] * 3
    assert goes.forgotten_early == 4 and len(goes) == 3


def keys_in(slot: int | None = None, other_than: int | None = None, count: int = 1) -> list[str]:
    """Keys of the limiter "api" in `slot`, or in any slot but `other_than`."""
    keys = (f"k{i}" for i in range(100_000))
    return [
        key
        for key in keys
        if (slot is None or slot_of(rate_key("api", key)) == slot)
        and slot_of(rate_key("api", key)) != other_than
    ][:count]


OLD, NEW, NEWER = Ballot(7, 1, "n1"), Ballot(7, 2, "n2"), Ballot(7, 3, "n1")
# The ballot a gaining node takes a slot under.
TERM = Ballot(7, 9, "n9")


def test_the_keys_of_a_slot_gained_without_a_hand_over_start_spent_and_no_others():
    theirs = keys_in()[0]
    slot = slot_of(rate_key("api", theirs))
    mine = keys_in(other_than=slot)[0]
    gainer = node("n2", 2)
    gainer.gain_slot(slot, 10.0, TERM, previous=OLD)
    # The old owner may have admitted the whole bucket until 10.0: one token back a second on.
    decision = gainer.check("api", theirs, 1, 10.5)
    assert not decision.go and decision.retry_after == pytest.approx(0.5)
    assert gainer.check("api", theirs, 1, 11.0).go
    assert gainer.check("api", mine, 4, 10.5).go  # keys of other slots are as they were
    assert gainer.check("crawl", theirs, 5, 10.5).go  # gossip mode decides anywhere anyway
    assert gainer.spent_slots() == 1
    # A spent bucket of 4 at 1 a second is full again 4 s later: the slot is forgotten.
    gainer.evict(14.5)
    assert gainer.spent_slots() == 0


def test_a_resigning_owner_hands_its_keys_over_with_what_they_remember():
    key = keys_in()[0]
    slot = slot_of(rate_key("api", key))
    other = keys_in(other_than=slot)[0]
    owner, successor = node("n1", 1), node("n2", 2)
    first = owner.check("api", key, 3, 0.0, retry_id=7)
    owner.check("api", other, 4, 0.0)
    handover = owner.lose_slot(slot, OLD, resigned=True, now=0.1)
    assert [state.key for state in handover.rates.states] == [key]  # only that slot's keys go
    assert handover.rates.spent_for is None
    assert owner.keys() == 1
    successor.handed_over(handover, 0.2)
    successor.gain_slot(slot, 0.5, TERM, previous=OLD)
    assert successor.spent_slots() == 0
    assert successor.check("api", key, 3, 0.5, retry_id=7) == first  # remembered, not again
    assert successor.check("api", key, 1, 0.5).go  # 3 of 4 were spent: one left
    assert not successor.check("api", key, 1, 0.5).go


def test_a_resigning_owner_that_takes_its_slot_back_next_keeps_what_it_handed_over():
    """Resigned while slow, and the next to act for the slot once fast again, before anyone
    else wrote it: the keys stand as it handed them over, remembered goes too (five-node seed
    1641822788: a retry of a go answered sorry there)."""
    key = keys_in()[0]
    slot = slot_of(rate_key("api", key))
    owner = node("n1", 1)
    first = owner.check("api", key, 3, 0.0, retry_id=7)
    owner.lose_slot(slot, OLD, resigned=True, now=0.1)
    owner.gain_slot(slot, 0.5, TERM, previous=OLD)
    assert owner.spent_slots() == 0
    assert owner.check("api", key, 3, 0.5, retry_id=7) == first
    assert owner.check("api", key, 1, 0.5).go  # 3 of 4 were spent: one left
    assert not owner.check("api", key, 1, 0.5).go


def test_a_hand_over_counts_only_for_a_slot_gained_from_its_ballot_and_while_it_is_kept():
    key = keys_in()[0]
    slot = slot_of(rate_key("api", key))
    owner = node("n1", 1)
    owner.check("api", key, 1, 0.0)
    handover = owner.lose_slot(slot, OLD, resigned=True, now=0.0)
    # Another member took the slot from OLD, and this one took it from that member (who
    # failed): what OLD said no longer stands.
    successor = node("n3", 3)
    successor.handed_over(handover, 0.0)
    successor.gain_slot(slot, 1.0, TERM, previous=NEW)
    assert not successor.check("api", key, 1, 1.0).go and successor.spent_slots() == 1
    # Kept HANDOVER_KEPT, no longer.
    late = node("n2", 2)
    late.handed_over(handover, 0.0)
    late.gain_slot(slot, HANDOVER_KEPT + 1.0, TERM, previous=OLD)
    assert late.spent_slots() == 1
    # A lost slot (its lease ran out) hands nothing over.
    assert node("n1", 1).lose_slot(slot, NEWER, resigned=False, now=0.0) is None


def test_a_slot_gained_spent_is_handed_over_spent():
    """Taken over from a frozen owner, then handed back to it: the keys nobody checked in
    between are still spent as of the takeover, not new
    (tests/process/test_rate_limits_cluster.py)."""
    theirs = keys_in()[0]
    slot = slot_of(rate_key("api", theirs))
    taker, woken = node("n2", 2), node("n1", 1)
    taker.gain_slot(slot, 10.0, NEW, previous=OLD)
    handover = taker.lose_slot(slot, NEW, resigned=True, now=10.4)
    assert handover.rates == SlotRates((), spent_for=pytest.approx(0.4))
    assert taker.spent_slots() == 0
    # The woken node's clock reads 5010.4 as it arrives: spent since 5010.0, or a little later.
    woken.handed_over(handover, 5010.4)
    woken.gain_slot(slot, 5010.5, NEWER, previous=NEW)
    assert not woken.check("api", theirs, 1, 5010.5).go
    assert not woken.check("api", theirs, 1, 5011.0).go  # a token back a second on, no sooner
    assert woken.check("api", theirs, 1, 5011.1).go
    assert woken.spent_slots() == 1


def test_a_slot_gained_again_forgets_what_was_kept_of_it():
    key = keys_in()[0]
    slot = slot_of(rate_key("api", key))
    limits = node("n1")
    assert limits.check("api", key, 1, 0.0).go  # kept from an earlier term
    limits.gain_slot(slot, 1.0, TERM, previous=OLD, cold=True)  # a new era: nothing decided before
    assert limits.check("api", key, 4, 1.0).go


def test_a_node_decides_a_slots_keys_under_the_ballot_it_adopted_them_under_until_it_loses_it():
    slot = slot_of(rate_key("api", keys_in()[0]))
    limits = node("n2", 2)
    assert limits.adopted(slot) is None
    limits.gain_slot(slot, 1.0, NEW, previous=OLD)
    assert limits.adopted(slot) == NEW
    limits.lose_slot(slot, NEW, resigned=False, now=1.0)
    assert limits.adopted(slot) is None
