"""Quota leases (`cluster/quota_leases.py`), without any I/O: slices sized by demand, spent
by holders that report, close, vanish and ask again, through failovers of the owner; what they
admit between them stays within the algorithm's rule."""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluicegate.cluster import quota_leases
from sluicegate.cluster.errors import NotLeased, UnknownLimiter
from sluicegate.cluster.quota_leases import (
    PREDECESSOR,
    BucketPool,
    KeyLeases,
    SliceReport,
    WindowPool,
    holder_term,
    predecessor_hold,
    spent,
)
from sluicegate.cluster.rate_limits import RateLease, RateLimiterConfig, RateLimits
from sluicegate.cluster.ring import rate_key
from sluicegate.cluster.slots import NO_BALLOT, Ballot, slot_of

TERM = 1.0


def bucket(capacity: int = 10, rate: float = 5.0, now: float = 0.0) -> KeyLeases:
    return KeyLeases(BucketPool(capacity, rate, float(capacity), now), TERM)


def test_a_lone_holder_gets_what_it_wants_and_the_rest_stays():
    leases = bucket()
    grant = leases.ask(1, holder=7, reports=(), want=4, now=0.0)
    assert (grant.slice_id, grant.tokens, grant.term) == (1, 4, TERM)
    assert leases.reserved == 4 and leases.pool.available(0.0, leases.reserved) == 6


def test_holders_share_max_min_fair_and_a_newcomer_gets_its_share_as_the_others_renew():
    leases = bucket(capacity=12, rate=1.0)
    assert leases.ask(1, holder=1, reports=(), want=2, now=0.0).tokens == 2
    assert leases.ask(2, holder=2, reports=(), want=8, now=0.0).tokens == 8
    # Of 12, the first wants 2; the other two 8 each, so 5 each: the newcomer gets what is left.
    assert leases.ask(3, holder=3, reports=(), want=8, now=0.0).tokens == 2
    renewal = leases.ask(4, holder=2, reports=[SliceReport(2, 0, closed=True)], want=8, now=0.0)
    assert renewal.tokens == 5


def test_a_report_frees_room_to_refill_and_a_close_gives_back_what_went_unspent():
    leases = bucket(capacity=10, rate=5.0)
    leases.ask(1, holder=1, reports=(), want=10, now=0.0)
    assert leases.pool.available(0.5, leases.reserved) == 0  # no room while all 10 may go
    leases.ask(2, holder=1, reports=[SliceReport(1, 4)], want=0, now=0.5)
    assert leases.reserved == 6 and leases.stats.spent_reported == 4
    assert leases.pool.available(0.9, leases.reserved) == pytest.approx(2)  # 0.4 s at 5/s
    leases.ask(3, holder=1, reports=[SliceReport(1, 5, closed=True)], want=0, now=0.9)
    assert leases.reserved == 0 and leases.stats.returned_unspent == 5
    assert leases.pool.available(0.9, 0.0) == pytest.approx(7)


def test_a_slice_that_ends_unclosed_gives_nothing_back():
    leases = bucket(capacity=10, rate=1.0)
    leases.ask(1, holder=1, reports=(), want=6, now=0.0)
    leases.expire(TERM)
    assert leases.open == {} and leases.stats.lost == 1 and leases.reserved == 0
    # No room to refill into while the slice could take all 6; from its end, 1 a second.
    assert leases.pool.available(TERM, 0.0) == pytest.approx(4)
    assert leases.pool.available(TERM + 1.0, 0.0) == pytest.approx(5)


def test_a_repeated_ask_gets_its_slice_with_the_term_left():
    leases = bucket()
    first = leases.ask(1, holder=1, reports=(), want=3, now=0.0, ask_id=99)
    again = leases.ask(2, holder=1, reports=(), want=3, now=0.25, ask_id=99)
    assert (again.slice_id, again.tokens, again.term) == (first.slice_id, 3, 0.75)
    assert len(leases.open) == 1


def test_a_holder_holds_two_slices_at_most():
    leases = bucket()
    leases.ask(1, holder=1, reports=(), want=1, now=0.0)
    leases.ask(2, holder=1, reports=(), want=1, now=0.5)
    refused = leases.ask(3, holder=1, reports=(), want=1, now=0.6)
    assert refused.tokens == 0 and refused.retry_after == pytest.approx(0.4)


def test_a_window_slice_ends_with_its_window():
    leases = KeyLeases(WindowPool(5, 1.0, 0.0, 0), term=0.8)
    grant = leases.ask(1, holder=1, reports=(), want=5, now=0.5)
    assert grant.tokens == 5 and grant.term == pytest.approx(0.5)
    refused = leases.ask(2, holder=2, reports=(), want=1, now=0.6)
    assert refused.tokens == 0 and refused.retry_after == pytest.approx(0.4)
    assert leases.ask(3, holder=2, reports=(), want=1, now=1.0).tokens == 1


def test_a_new_owner_starts_spent_and_refills_only_once_the_old_slices_ended():
    leases = spent(BucketPool(10, 5.0, 10.0, 0.0), TERM, now=3.0, hold=predecessor_hold(TERM))
    assert leases.open[PREDECESSOR].until == pytest.approx(3.0 + predecessor_hold(TERM))
    refused = leases.ask(1, holder=1, reports=(), want=1, now=3.5)
    assert refused.tokens == 0
    assert refused.retry_after == pytest.approx(predecessor_hold(TERM) - 0.5)
    later = 3.0 + predecessor_hold(TERM) + 0.4
    assert leases.ask(2, holder=1, reports=(), want=5, now=later).tokens == 2


# -- the bound, on random histories ----------------------------------------------------------


@dataclass
class _Held:
    slice_id: int
    tokens: int
    ends: float  # the holder's own end
    spent: int = 0


@dataclass
class _Holder:
    number: int
    held: list[_Held] = field(default_factory=list)
    gone: bool = False
    asks: itertools.count = field(default_factory=lambda: itertools.count(1))


def _history(seed: int, window: bool) -> tuple[list[float], tuple[float, float]]:
    """Admission times of a random history of holders and owners; and the rule's two numbers
    (capacity and rate, or limit and window)."""
    rng = random.Random(seed)
    term = rng.choice([0.2, 0.5, 1.0, 2.0])
    if window:
        rule = (float(rng.randint(1, 20)), rng.choice([0.25, 1.0, 3.0]))
        pool_of = lambda now: WindowPool(int(rule[0]), rule[1], 0.0, 0)  # noqa: E731
    else:
        rule = (float(rng.randint(1, 20)), rng.choice([0.5, 2.0, 10.0]))
        pool_of = lambda now: BucketPool(int(rule[0]), rule[1], rule[0], now)  # noqa: E731
    owner = KeyLeases(pool_of(0.0), term)
    ids = itertools.count(1)
    holders = [_Holder(number) for number in range(rng.randint(1, 4))]
    admitted: list[float] = []
    now = 0.0
    # The holder's clock may run slower than the owner's, within the bound.
    slow = 1.0 - rng.uniform(0.0, 0.01)
    for _ in range(rng.randint(20, 300)):
        now += rng.expovariate(1 / (term / 5))
        choice = rng.random()
        holder = rng.choice(holders)
        if choice < 0.02:  # the owner fails; the next takes the key after a moment
            now += rng.uniform(0.0, term)
            ids = itertools.count(10_000 * (len(admitted) + 1))
            owner = spent(pool_of(now), term, now, predecessor_hold(term))
            continue
        if holder.gone:
            continue
        if choice < 0.05:
            holder.gone = True  # it never reports again; its slices end unclosed
        elif choice < 0.4:
            # Slices over by the holder's clock are closed (the owner may not have ended them
            # yet, or may have: the report comes late); of two live ones, often the older.
            reports = []
            for held in list(holder.held):
                live = [h for h in holder.held if h.ends > now]
                close = held.ends <= now or (len(live) > 1 and rng.random() < 0.7)
                reports.append(SliceReport(held.slice_id, held.spent, close))
                if close:
                    holder.held.remove(held)
            if len(holder.held) >= 2:
                continue
            ask_id = next(holder.asks)
            grant = owner.ask(next(ids), holder.number, reports, rng.randint(1, 12), now, ask_id)
            if rng.random() < 0.1:  # the answer was lost; the holder asks again a bit later
                now += rng.uniform(0.0, term / 4)
                grant = owner.ask(next(ids), holder.number, (), 1, now, ask_id)
            if grant.tokens and grant.slice_id not in {h.slice_id for h in holder.held}:
                ends = now + holder_term(grant.term) / slow
                holder.held.append(_Held(grant.slice_id, grant.tokens, ends))
        else:
            for held in holder.held:
                take = min(held.tokens - held.spent, rng.randint(1, 3))
                if take > 0 and held.ends > now:
                    held.spent += take
                    admitted += [now] * take
                    break
    return admitted, rule


@settings(max_examples=400, deadline=None)
@given(st.integers(0, 2**32))
def test_holders_of_a_token_bucket_admit_at_most_capacity_plus_rate_times_t(seed):
    admitted, (capacity, rate) = _history(seed, window=False)
    for i, first in enumerate(admitted):
        for j in range(i + int(capacity), len(admitted)):
            went = j - i + 1
            assert went <= capacity + rate * (admitted[j] - first) + 1e-6, (i, j)


@settings(max_examples=400, deadline=None)
@given(st.integers(0, 2**32))
def test_holders_of_a_fixed_window_admit_at_most_its_limit_per_window(seed):
    admitted, (limit, window) = _history(seed, window=True)
    per_window: dict[int, int] = {}
    for at in admitted:
        number = math.floor(at / window)
        per_window[number] = per_window.get(number, 0) + 1
    assert max(per_window.values(), default=0) <= limit


# -- a limiter in lease mode (`cluster/rate_limits.py`) ---------------------------------------

LEASED = {
    "fetch": RateLimiterConfig("token_bucket", 10, rate=5.0, mode="lease", term=1.0),
    "api": RateLimiterConfig("token_bucket", 10, rate=5.0),
}


def test_a_lease_mode_limiter_hands_out_slices_and_decides_plain_checks_from_the_same_pool():
    limits = RateLimits(LEASED, "n1", random.Random(1))
    grant = limits.ask(RateLease("fetch", "k", holder=1, reports=(), want=6, ask_id=1), 0.0)
    assert grant.tokens == 6
    assert [limits.check("fetch", "k", 1, 0.0).go for _ in range(5)] == [True] * 4 + [False]
    with pytest.raises(NotLeased):
        limits.ask(RateLease("api", "k", holder=1, reports=(), want=1, ask_id=2), 0.0)
    with pytest.raises(UnknownLimiter):
        limits.ask(RateLease("nope", "k", holder=1, reports=(), want=1, ask_id=3), 0.0)


def test_a_gained_slot_starts_its_leased_keys_spent_unless_a_new_era_starts_them_whole():
    limits = RateLimits(LEASED, "n1", random.Random(1))
    key = "k"
    slot = slot_of(rate_key("fetch", key))
    limits.ask(RateLease("fetch", key, holder=1, reports=(), want=3, ask_id=1), 0.0)
    limits.gain_slot(slot, 1.0, Ballot(8, 1, "n1"), previous=NO_BALLOT, cold=True)
    assert limits.check("fetch", key, 10, 1.0).go
    # Even a slot resigned to this node: the holders keep the slices they had of the key.
    limits.gain_slot(slot, 5.0, Ballot(8, 3, "n1"), previous=Ballot(8, 2, "n2"))
    assert not limits.check("fetch", key, 1, 5.0).go
    later = 5.0 + predecessor_hold(1.0) + 0.2  # one token refilled after the hold
    assert limits.check("fetch", key, 1, later).go
    assert not limits.check("fetch", key, 1, later).go
    limits.lose_slot(slot, Ballot(8, 1, "n1"), resigned=True, now=later)
    assert limits.keys() == 0


def test_the_open_slices_are_counted_through_closes_ends_and_a_lost_slot():
    leases = bucket()
    leases.ask(1, holder=1, reports=(), want=2, now=0.0)
    leases.ask(2, holder=2, reports=(), want=2, now=0.0)
    leases.ask(3, holder=3, reports=(), want=2, now=0.0)
    assert leases.stats.open == 3
    leases.ask(4, holder=1, reports=[SliceReport(1, 2, closed=True)], want=0, now=0.1)
    assert leases.stats.open == 2 and leases.stats.spent_reported == 2
    leases.expire(TERM)
    assert leases.stats.open == 0 and leases.stats.lost == 2
    leases.ask(5, holder=1, reports=(), want=2, now=TERM)
    leases.drop()
    assert leases.stats.open == 0 and leases.open == {}


def test_a_limiter_keeps_a_bounded_number_of_slices_open(monkeypatch):
    monkeypatch.setattr(quota_leases, "MAX_OPEN_SLICES", 3)
    leases = bucket(capacity=100)
    for holder in range(3):
        assert leases.ask(holder + 1, holder=holder, reports=(), want=1, now=0.0).tokens == 1
    refused = leases.ask(9, holder=99, reports=(), want=1, now=0.0)
    assert refused.tokens == 0 and refused.retry_after == TERM / 2
    leases.ask(10, holder=0, reports=[SliceReport(1, 1, closed=True)], want=0, now=0.1)
    assert leases.ask(11, holder=99, reports=(), want=1, now=0.1).tokens == 1


def test_only_the_lease_mode_keys_of_a_gained_slot_start_spent_and_losing_it_drops_them():
    configs = {**LEASED, "crawl": RateLimiterConfig("fixed_window", 5, window=1.0, mode="gossip")}
    limits = RateLimits(configs, "n1", random.Random(1))
    slot = slot_of(rate_key("fetch", "k"))
    crawled = next(f"g{i}" for i in range(100_000) if slot_of(rate_key("crawl", f"g{i}")) == slot)
    limits.gain_slot(slot, 5.0, Ballot(8, 3, "n1"), previous=Ballot(8, 2, "n2"))
    assert not limits.check("fetch", "k", 1, 5.0).go
    assert limits.check("crawl", crawled, 5, 5.0).go  # gossip mode: every node decides it
    # A new era's slot starts whole; lost, its lease-mode keys and their slices go.
    fresh = RateLimits(LEASED, "n1", random.Random(1))
    fresh.gain_slot(slot, 1.0, Ballot(8, 1, "n1"), previous=NO_BALLOT, cold=True)
    fresh.ask(RateLease("fetch", "k", holder=1, reports=(), want=3, ask_id=1), 1.0)
    assert fresh.lease_stats()["fetch"].open == 1
    fresh.lose_slot(slot, Ballot(8, 1, "n1"), resigned=False, now=1.0)
    assert fresh.keys() == 0 and fresh.lease_stats()["fetch"].open == 0
