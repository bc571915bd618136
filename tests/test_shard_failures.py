"""Failures the simulations found (`simulations/`), each brought down to the cores it is about,
without a network: the seed that found it is named in each test.
"""

from __future__ import annotations

import random

import pytest

from sluicegate.cluster.errors import UnknownPeer
from sluicegate.cluster.ring import Ring, peer_key
from sluicegate.cluster.semaphore_leases import SemaphoreLeases
from sluicegate.cluster.semaphore_ops import Acquire, apply
from sluicegate.cluster.semaphores import SemaphoreConfig, SemaphoreCore
from sluicegate.cluster.shard import Handoff, LockRefused, LockRequest, Pull, ShardCore

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
    # Then n1 sees it too and takes the peer over; the client restores it there (n1 took it
    # from a replica) and releases the lock.
    net.change_members(only=["n1"])
    net.deliver_all()
    net.home(peer).restore(peer, {"A": 1}, 100)
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


def test_a_request_of_a_held_count_under_a_new_ticket_waits_its_turn():
    """Seed 174 (and an older 38): an owner died, and its successor's replica still had a lock
    the home had released since; the peer's next request of the same count was taken for that
    lock and granted at once, over max."""
    leases = SemaphoreLeases({"A": SemaphoreConfig(1)}, epoch=1)
    assert leases.request(7, "A", 1, now=0.0, ticket=11) is True
    assert leases.request(8, "A", 1, now=0.0, ticket=21) is False  # waits behind peer 7
    assert leases.request(7, "A", 1, now=1.0, ticket=12) is False  # the old lock is gone
    granted = leases.token(8, "A")
    assert granted is not None  # the waiter, in its turn
    leases.release(8, "A", ticket=21)
    assert leases.token(7, "A") > granted
    # A retry under the same ticket is the same lock, with the same token.
    assert leases.request(7, "A", 1, now=2.0, ticket=12) is True
    assert leases.token(7, "A") > granted


def test_a_provisional_home_asking_for_a_held_count_keeps_the_lock_with_a_new_token():
    """Seed 2 (earlier): a home died after its peer's grant, and its successor's replica had the
    lock pending; the client held it. Asked for by a provisional home, the lock stays held,
    with a new token (the client's restore says whether it holds it)."""
    leases = SemaphoreLeases({"A": SemaphoreConfig(1)}, epoch=1)
    assert leases.request(7, "A", 1, now=0.0, ticket=11) is True
    first = leases.token(7, "A")
    assert leases.request(8, "A", 1, now=0.0, ticket=21) is False
    assert leases.request(7, "A", 1, now=1.0, ticket=12, provisional=True) is True
    renamed = leases.token(7, "A")
    assert renamed > first
    leases.release(7, "A", ticket=11)  # a release quoting the old name does nothing
    assert leases.token(7, "A") == renamed
    leases.release(7, "A", ticket=12)
    assert leases.token(8, "A") > renamed


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


def _b_held_and_a_third_node_cut_off():
    """A peer holds 2 of B, and the node that is neither its home nor B's owner is cut off."""
    net = ShardNetwork(CONFIG, NODES)
    owner = net.owner("B")
    home_id = next(n for n in NODES if n != owner.node_id)
    stranger = next(n for n in NODES if n not in (owner.node_id, home_id))
    peer = net.new_peer(home_id)
    assert net.acquire(peer, "B", 2) is True
    net.partition([stranger], [owner.node_id, home_id])
    return net, owner, stranger, peer


def test_an_owner_takes_no_lock_request_from_a_node_that_is_no_member():
    """Seed 32 (later): a node cut off, once healed, sent what it had asked for as the peer's
    home before it stepped down; under its stale ticket the owner dropped the lock the home
    holds now, and B went to 5 holders of 3."""
    net, owner, stranger, peer = _b_held_and_a_third_node_cut_off()
    assert net.owner("B") is owner  # the stranger owned neither the semaphore nor the peer
    owner.on_message(stranger, LockRequest(peer, "B", 1, ticket=99), net.now)
    refusals = [m for dest, _, m in owner.outbox() if dest == stranger]
    assert refusals == [LockRefused(peer, "B", 99)]
    assert net.acquired("B") == 2
    assert net.home(peer).locks_of(peer) == ["B"]


def test_an_owner_takes_no_lock_request_from_a_member_back_before_its_pull():
    """Seed 62: n3, cut off by a clog, stepped down; its request as a peer's home then came
    out of the clog after the owner counted n3 in again (told by n1), and before n3's pull.
    Under its stale ticket the owner dropped the lock the peer's home held now, and granted a
    waiter: B went to 4 holders of 3."""
    net, owner, stranger, peer = _b_held_and_a_third_node_cut_off()
    # The owner hears of the stranger again through others; nothing came from it directly yet.
    net.cut = []
    net.change_members(only=[n for n in NODES if n != stranger])
    owner.on_message(stranger, LockRequest(peer, "B", 2, ticket=99), net.now)
    said = [m for dest, _, m in owner.outbox() if dest == stranger]
    # Refused, and asked to pull from (a node that did not step down would not pull itself).
    assert said == [LockRefused(peer, "B", 99), Pull(owner._generations[owner.node_id])]
    assert net.acquired("B") == 2
    # Once its pull arrived (after all it said before), it speaks for locks again.
    net.change_members(only=[stranger])
    net.deliver_all()
    other = 12345
    owner.on_message(stranger, LockRequest(other, "B", 1, ticket=5), net.now)
    answers = [m for dest, _, m in owner.outbox() if dest == stranger]
    assert not any(isinstance(m, LockRefused) for m in answers)
    assert net.acquired("B") == 3


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


def _replica_taker(net: ShardNetwork) -> tuple[str, str, int]:
    """A node that is not A's owner, and a peer homed there whose home is a third node once it
    is gone: (the node, the third, the peer)."""
    owner = net.owner("A").node_id
    victim = next(n for n in NODES if n != owner)
    third = next(n for n in NODES if n not in (owner, victim))
    return victim, third, _peer_at(net, victim, then_home=third, without=victim)


def test_a_lock_granted_after_the_last_replica_outlives_its_home():
    """Seed 38: a peer's home died just after the owner granted it a lock, before a replica had
    the lock; the new home took the peer from its replica and told the owner, when it audited,
    to release the lock its client still held."""
    net = ShardNetwork(CONFIG, NODES)
    victim, _, peer = _replica_taker(net)
    net.send_replicas()
    net.deliver_all()  # the replicas have the peer, without locks
    assert net.acquire(peer, "A") is True
    net.kill(victim)
    net.change_members()
    net.deliver_all()
    net.advance(10.0)  # grace periods end, owners audit
    other = net.new_peer(net.owner("A").node_id)
    assert net.acquire(other, "A") is False
    # The client hears of the takeover as an unknown peer, and restores what it holds.
    home = net.home(peer)
    with pytest.raises(UnknownPeer):
        home.heartbeat(peer, net.now + 60)
    home.restore(peer, {"A": 1}, net.now + 60)
    net.deliver_all()
    net.advance(10.0)
    assert home.is_acquired(peer) and home.locks_of(peer) == ["A"]
    assert net.acquired("A") == 1
    assert not net.home(other).is_acquired(other)


def test_a_lock_released_after_the_last_replica_is_released_once_its_client_restores():
    """The other way round: the client released the lock after the last replica, and the new
    home re-asserts it from the replica; the client's restore says it holds nothing."""
    net = ShardNetwork(CONFIG, NODES)
    victim, _, peer = _replica_taker(net)
    assert net.acquire(peer, "A") is True
    net.send_replicas()
    net.deliver_all()  # the replicas have the lock
    net.release(peer, "A")
    net.kill(victim)
    net.change_members()
    net.deliver_all()
    net.advance(10.0)
    assert net.acquired("A") == 1  # re-asserted from the replica, and kept while unconfirmed
    home = net.home(peer)
    home.restore(peer, {}, net.now + 60)
    net.deliver_all()
    net.advance(10.0)
    assert home.locks_of(peer) == []
    assert net.acquired("A") == 0


def test_a_peer_renewed_after_the_last_replica_outlives_it_at_its_new_home():
    """Seed 78: a home cut off from the others renewed a peer before it saw it was alone; its
    successor took the peer from the replica, with the expiry the replica had, and expired it
    (and released its lock) while its client still counted on the renewal."""
    net = ShardNetwork(CONFIG, NODES)
    victim, _, peer = _replica_taker(net)
    net.home(peer).heartbeat(peer, net.now + 5.0)
    assert net.acquire(peer, "A") is True
    net.send_replicas()
    net.deliver_all()  # the replicas: 5 s left
    net.advance(1.0)
    net.nodes[victim].heartbeat(peer, net.now + 5.0)  # renewed until 6.0...
    net.partition([victim], [n for n in NODES if n != victim])  # ...unseen by the others
    home = net.home(peer)
    assert home.node_id != victim
    net.advance(4.5)  # past the replica's expiry (5.0), not the client's (6.0)
    assert home.has_peer(peer) and net.acquired("A") == 1
    home.restore(peer, {"A": 1}, net.now + 5.0)
    net.deliver_all()
    assert home.is_acquired(peer) and net.acquired("A") == 1
