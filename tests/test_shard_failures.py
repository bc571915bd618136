"""Failures the simulations found (`simulations/`), each brought down to the cores it is about,
without a network: the seed that found it is named in each test.
"""

from __future__ import annotations

import random

from sluicegate.cluster.ring import Ring, peer_key
from sluicegate.cluster.semaphore_leases import SemaphoreLeases
from sluicegate.cluster.semaphore_ops import Acquire, apply
from sluicegate.cluster.semaphores import SemaphoreConfig, SemaphoreCore
from sluicegate.cluster.shard import Handoff, LockRefused, LockRequest, ShardCore

from .shard_network import ShardNetwork

CONFIG = {"A": SemaphoreConfig(1, level=0), "B": SemaphoreConfig(3, level=1)}
NODES = ["n1", "n2", "n3"]


def _peer_at(net: ShardNetwork, node_id: str, then_home: str, without: str) -> int:
    """A new peer homed at `node_id` whose home is `then_home` once `without` is gone."""
    ring = Ring({n: g for n, g in net.generations.items() if n != without})
    for _ in range(200):
        peer_id = net.new_peer(node_id)
        if ring.owner(peer_key(peer_id)) == then_home:
            return peer_id
    raise AssertionError("no such peer in 200 tries")


def test_what_was_said_to_a_node_before_it_restarted_does_not_reach_it_after():
    """Seed 2: a hand-off meant for n3's previous life brought back a lock released since."""
    net = ShardNetwork(CONFIG, NODES)
    peer = _peer_at(net, "n3", then_home="n1", without="n3")
    assert net.acquire(peer, "A") is True
    net.send_replicas()
    net.deliver_all()
    net.kill("n3")
    # n2 sees n3 gone first and pushes the peer, as its replica has it, to n1, its home now.
    # n1 still counts n3 in, so it sends the peer on to n3, where the message waits.
    net.change_members(only=["n2"])
    net.deliver_all()
    net.advance(2.0)
    assert any(isinstance(m, Handoff) and m.peers for _, m in net.queues.get(("n1", "n3"), ()))
    # Then n1 sees it too, takes the peer over, and the client releases the lock there.
    net.change_members(only=["n1"])
    net.deliver_all()
    net.release(peer, "A")
    assert net.acquired("A") == 0
    net.start("n3")  # restarted: a new life, with empty memory
    net.change_members()
    net.deliver_all()
    net.advance(5.0)
    assert net.home(peer).locks_of(peer) == []
    assert net.acquired("A") == 0


def test_a_semaphore_gained_without_a_hand_over_gives_tokens_above_the_change():
    """Seed 32: a node that rejoined owned A again, its owner in between cut off, and went on
    counting from its own old tokens."""
    core = ShardCore(
        "n1",
        CONFIG,
        rng=random.Random(1),
        epoch=5,
        settle=1.0,
        takeover_grace=0.0,
        cold_start_grace=0.0,
        pull_retry=1.0,
    )
    core.change_members({"n1": 1, "n2": 1}, now=0.0, epoch=9000)
    core.on_message("n2", Handoff([], [], last=True), now=0.0)  # n2 had nothing of it
    owned = core.owned_semaphores()
    assert owned
    peer = core.new_peer(60.0, random.Random(2))  # homed here: a node makes its own peers
    assert core.acquire(peer, owned[0], 1, now=0.0) is True
    assert core.fencing_token(peer, owned[0]) >= 9000 << 22


def test_a_request_of_a_held_count_under_a_new_ticket_keeps_the_lock_with_a_new_token():
    """Seed 38: the release of a lock was lost with its owner; the peer's next lock was given
    the old lock's token, below one given since. (A first fix made such a request a new lock,
    behind the waiters; with long holds, seed 2 then showed the other case: the home died
    after the grant, its successor's replica had the lock pending, and the client held it.)"""
    leases = SemaphoreLeases({"A": SemaphoreConfig(1)}, epoch=1)
    assert leases.request(7, "A", 1, now=0.0, ticket=11) is True
    first = leases.token(7, "A")
    assert leases.request(8, "A", 1, now=0.0, ticket=21) is False  # waits behind peer 7
    assert leases.request(7, "A", 1, now=1.0, ticket=12) is True  # still held...
    renamed = leases.token(7, "A")
    assert renamed > first  # ...with a new token
    leases.release(7, "A", ticket=11)  # a release quoting the old name does nothing
    assert leases.token(7, "A") == renamed
    leases.release(7, "A", ticket=12)
    granted = leases.token(8, "A")
    assert granted > renamed  # the waiter, in its turn
    # A retry under the same ticket is the same lock, with the same token.
    assert leases.request(8, "A", 1, now=2.0, ticket=21) is True
    assert leases.token(8, "A") == granted


def test_a_lock_known_from_a_replica_keeps_its_token_only_under_its_own_ticket():
    """A successor knows a lock from a replica, with its ticket. Asked for under that ticket it
    is the same lock; under another, it may be one whose release was lost, and the token the
    home is told must be new."""
    leases = SemaphoreLeases({"A": SemaphoreConfig(1)}, epoch=1)
    leases.request(7, "A", 1, now=0.0, ticket=11)
    replica = leases.snapshot()
    successor = SemaphoreLeases({"A": SemaphoreConfig(1)}, epoch=2)
    successor.merge(replica, now=1.0, epoch=2, names=["A"])
    old = successor.token(7, "A")
    assert successor.request(7, "A", 1, now=1.0, ticket=11) is True
    assert successor.token(7, "A") == old
    assert successor.request(7, "A", 1, now=1.0, ticket=12) is True
    assert successor.token(7, "A") > old


def test_an_owner_takes_no_lock_request_from_a_node_that_is_no_member():
    """Seed 32 (later): a node cut off, once healed, sent what it had asked for as the peer's
    home before it stepped down; under its stale ticket the owner dropped the lock the home
    holds now, and B went to 5 holders of 3."""
    net = ShardNetwork(CONFIG, NODES)
    owner = net.owner("B")
    home_id = next(n for n in NODES if n != owner.node_id)
    stranger = next(n for n in NODES if n not in (owner.node_id, home_id))
    peer = net.new_peer(home_id)
    assert net.acquire(peer, "B", 2) is True
    net.partition([stranger], [owner.node_id, home_id])
    assert net.owner("B") is owner  # the stranger owned neither the semaphore nor the peer
    owner.on_message(stranger, LockRequest(peer, "B", 1, ticket=99), net.now)
    refusals = [m for dest, _, m in owner.outbox() if dest == stranger]
    assert refusals == [LockRefused(peer, "B", 99)]
    assert net.acquired("B") == 2
    assert net.home(peer).locks_of(peer) == ["B"]


def test_a_fresh_acquire_drops_what_the_cluster_still_counts_for_the_peer():
    """Seed 19: a takeover from a replica that had not heard of a release left the lock held
    (a ghost); the client, which knew its peer held nothing, was answered `acquired` at once with
    the ghost's old token."""
    core = SemaphoreCore(CONFIG, epoch=1)
    rng = random.Random(3)
    ghost = core.new_peer(60.0, rng)
    other = core.new_peer(60.0, rng)
    assert core.acquire(ghost, "A", 1, now=0.0) is True
    old = core.fencing_token(ghost, "A")
    assert core.acquire(other, "A", 1, now=0.0) is False  # waits behind the ghost lock
    # Without `fresh` the same count is idempotent (Throttle's rule): the old token again.
    assert apply(core, Acquire(ghost, "A", 1), 0.0, rng) is True
    assert core.fencing_token(ghost, "A") == old
    # With it, the ghost is released first: the waiter is granted, the peer queues behind it.
    assert apply(core, Acquire(ghost, "A", 1, fresh=True), 0.0, rng) is False
    waiter = core.fencing_token(other, "A")
    assert waiter > old
    core.release_lock(other, "A")
    assert core.fencing_token(ghost, "A") > waiter


def test_a_restore_under_another_ticket_gets_a_new_token():
    """Seed 117: a lock whose release was lost came back from a replica, and its home, which
    had loaded it from a replica too, restored it and was told the lock's old token; the
    client's next ask of the same count was answered with it."""
    leases = SemaphoreLeases({"A": SemaphoreConfig(1)}, epoch=1)
    leases.request(7, "A", 1, now=0.0, ticket=11)
    old = leases.token(7, "A")
    leases.restore(7, "A", 1, ticket=11)  # a retry: the same lock
    assert leases.token(7, "A") == old
    leases.restore(7, "A", 1, ticket=12)  # the home names it anew: maybe a lock long released
    assert leases.token(7, "A") > old
