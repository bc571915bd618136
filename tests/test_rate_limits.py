"""A node's rate limiters (`cluster/rate_limits.py`): limiters and keys, exact and gossip mode,
and the merging of gossiped "go" events, without any I/O."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluicegate.cluster.errors import InvalidWeight, UnknownLimiter
from sluicegate.cluster.rate_limits import RateEvents, RateLimiterConfig, RateLimits

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


def test_a_key_survives_its_owner_through_its_replica_and_moves_with_a_new_owner():
    owner, successor = node("n1", 1), node("n2", 2)
    for _ in range(3):
        assert owner.check("api", "k", 1, 0.0).go
    assert owner.changed_keys() == [("api", "k")]
    assert owner.changed_keys() == []
    successor.store(owner.export([("api", "k")]), owned=lambda limiter, key: False)
    assert successor.keys() == 0  # a replica, not yet its own
    # Its owner died: the first check here starts from the replica.
    assert successor.check("api", "k", 1, 0.0).go
    assert not successor.check("api", "k", 1, 0.0).go  # 3 there, 1 here: the bucket of 4
    # The members change again: the key goes to a third node, and is gone here.
    third = node("n3", 3)
    message = successor.export(successor.held_keys(), drop=True)
    assert successor.keys() == 0
    third.store(message, owned=lambda limiter, key: True)
    assert not third.check("api", "k", 1, 0.5).go
    assert third.check("api", "k", 1, 1.0).go  # refilled one token in a second


def test_a_node_that_loses_its_majority_forgets_its_exact_keys_but_not_its_gossip():
    limits = node("n1")
    assert limits.check("api", "own", 1, 0.0).go
    assert limits.check("crawl", "g", 1, 0.0).go
    other = node("n2", 2)
    assert other.check("api", "theirs", 1, 0.0).go
    limits.store(other.export([("api", "theirs")]), owned=lambda limiter, key: False)
    assert limits.held_keys() == [("api", "own")]
    assert limits.replica_keys() == [("api", "theirs")]
    limits.drop_exact()
    assert (limits.held_keys(), limits.replica_keys(), limits.changed_keys()) == ([], [], [])
    assert limits.keys() == 1  # the gossip key stays
    assert limits.check("api", "own", 4, 0.0).go  # a bucket of 4, as good as new here
