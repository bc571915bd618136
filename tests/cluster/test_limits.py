"""The node's limits as rules of the cores (`cluster/limits.py`), without a network."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from sluicegate.cluster.errors import BeyondLimit, QuotaFull
from sluicegate.cluster.limits import Limits
from sluicegate.cluster.ownership import Ownership
from sluicegate.cluster.rate_limits import RateLimiterConfig, RateLimits
from sluicegate.cluster.semaphore_ops import Acquire, Heartbeat, NewPeer, Restore
from sluicegate.cluster.semaphores import SemaphoreConfig, SemaphoreCore
from sluicegate.cluster.shard import Shard

LIMITS = Limits(
    peers=3,
    waits_per_peer=2,
    waits=3,
    longest_expires_in=60.0,
    longest_block_for=10.0,
    restore_count=5,
    rate_limit_keys=2,
    key_length=8,
)


@pytest.mark.parametrize(
    "op",
    [NewPeer(61), Heartbeat(1, 61), Restore(1, 61, {"A": 1}), Acquire(1, "A", 1, expires_in=61)],
)
def test_an_expiry_beyond_the_longest_is_refused(op):
    with pytest.raises(BeyondLimit) as refused:
        LIMITS.admit(op)
    assert (
        str(refused.value) == "expires_in of 61 s is longer than 60 s ([limits] longest_expires_in)"
    )


def test_a_long_poll_beyond_the_longest_is_cut_and_the_rest_pass_as_they_are():
    assert LIMITS.admit(Acquire(1, "A", 1, block_for=1e12)) == Acquire(1, "A", 1, block_for=10.0)
    for op in (NewPeer(60), Acquire(1, "A", 1, expires_in=60, block_for=10), Heartbeat(1, 0)):
        assert LIMITS.admit(op) is op


def test_peers_past_the_quota_are_refused_until_one_goes():
    core = SemaphoreCore({"A": SemaphoreConfig(1)}, limits=LIMITS)
    rng = random.Random(1)
    peers = [core.new_peer(100.0, rng) for _ in range(3)]
    with pytest.raises(QuotaFull) as full:
        core.new_peer(100.0, rng)
    assert full.value.limit == "peers"
    with pytest.raises(QuotaFull):
        core.restore(99, {"A": 1}, 100.0)
    core.release_peer(peers[0])
    core.new_peer(100.0, rng)


def test_a_restore_may_claim_above_max_but_not_beyond_restore_count():
    core = SemaphoreCore({"A": SemaphoreConfig(1)}, limits=LIMITS)
    core.restore(1, {"A": 5}, 100.0)
    with pytest.raises(BeyondLimit) as refused:
        core.restore(2, {"A": 2**63 - 1}, 100.0)
    assert refused.value.limit == "restore_count"
    assert core.peer_ids() == [1]


def test_rate_limit_keys_past_the_quota_are_refused_and_known_keys_still_decided():
    limits = RateLimits({"api": RateLimiterConfig("token_bucket", 4, rate=1.0)}, limits=LIMITS)
    limits.check("api", "a", 1, 0.0)
    limits.check("api", "b", 1, 0.0)
    with pytest.raises(QuotaFull) as full:
        limits.check("api", "c", 1, 0.0)
    assert full.value.limit == "rate_limit_keys"
    assert limits.check("api", "a", 1, 0.0).go
    # Once idle keys are evicted, new ones fit again.
    limits.evict(100.0)
    assert limits.check("api", "c", 1, 100.0).go


def test_a_rate_limit_key_longer_than_the_longest_is_refused():
    limits = RateLimits({"api": RateLimiterConfig("token_bucket", 4, rate=1.0)}, limits=LIMITS)
    with pytest.raises(BeyondLimit) as refused:
        limits.check("api", "k" * 9, 1, 0.0)
    assert str(refused.value) == "a key of 9 characters ([limits] key_length)"
    assert limits.keys() == 0


def serving_shard(limits: Limits) -> tuple[Shard, float]:
    """A cluster of one member that serves every slot, and the time it does from."""
    ownership = Ownership(
        "n1", life=1, lease=1.0, settle=1.0, era_floor=1000, rng=random.Random(1), now=0.0
    )
    shard = Shard("n1", {"A": SemaphoreConfig(1)}, ownership, random.Random(2), limits=limits)
    now = 0.0
    shard.members_changed({"n1": 1}, ["n1"], now)
    while not shard.ownership.serves_share(now):
        now += 0.1
        shard.tick(now)
        shard.flush(now)
    return shard, now


def test_a_peer_waits_for_at_most_waits_per_peer_acquires_at_a_cluster_home():
    shard, now = serving_shard(LIMITS)
    shard.submit(1, NewPeer(600), now)
    shard.submit(2, NewPeer(600), now)
    shard.flush(now)
    holder, waiter = (answer.result for answer in shard.answers())
    shard.submit(3, Acquire(holder, "A", 1), now)
    for request_id in (4, 5, 6):
        shard.submit(request_id, Acquire(waiter, "A", 1, block_for=30), now)
    shard.flush(now)
    answers = {answer.request_id: answer for answer in shard.answers()}
    assert answers[3].result.acquired
    assert 4 not in answers and 5 not in answers
    assert isinstance(answers[6].error, QuotaFull)


def test_an_acquire_that_may_wait_is_refused_while_the_node_has_its_waits():
    long_poll, at_once = Acquire(9, "A", 1, block_for=5), Acquire(9, "A", 1)
    LIMITS.make_room_to_wait(long_poll, of_peer=1, in_all=2)
    with pytest.raises(QuotaFull) as full:
        LIMITS.make_room_to_wait(long_poll, of_peer=0, in_all=3)
    assert str(full.value) == "this node has 3 acquires waiting ([limits] waits)"
    LIMITS.make_room_to_wait(at_once, of_peer=0, in_all=3)
    with pytest.raises(QuotaFull) as full:
        LIMITS.make_room_to_wait(at_once, of_peer=2, in_all=0)
    assert full.value.limit == "waits_per_peer"


def test_a_cluster_home_holds_at_most_its_waits_of_all_peers():
    shard, now = serving_shard(replace(LIMITS, peers=10))
    for request_id in range(5):
        shard.submit(request_id, NewPeer(600), now)
    shard.flush(now)
    holder, *waiters = (answer.result for answer in shard.answers())
    shard.submit(10, Acquire(holder, "A", 1), now)
    for request_id, waiter in enumerate(waiters, start=11):
        shard.submit(request_id, Acquire(waiter, "A", 1, block_for=30), now)
    shard.flush(now)
    answers = {answer.request_id: answer for answer in shard.answers()}
    assert answers[10].result.acquired
    assert not {11, 12, 13} & answers.keys()
    assert str(answers[14].error) == "this node has 3 acquires waiting ([limits] waits)"
    # One that waits no longer makes room.
    shard.submit(20, Heartbeat(waiters[0], 0), now)
    shard.flush(now)
    shard.submit(21, Acquire(waiters[3], "A", 1, block_for=30), now)
    shard.flush(now)
    assert 21 not in {answer.request_id for answer in shard.answers()}
