"""One node's share (`cluster/shard.py`) in a cluster of three, over the harness of
tests/cluster/shards.py: the home and owner rules on top of slot ownership, without trio or
sockets."""

from __future__ import annotations

import random

import pytest

from sluicegate.cluster.errors import NotServing, NotServingCutOff, StaleOperation, UnknownPeer
from sluicegate.cluster.home import DECISION_TIMEOUT, Granted, Home, Settled
from sluicegate.cluster.lock_messages import LockAnswer, LockRelease, LockRequest, LockRestore
from sluicegate.cluster.parked import STOP_CHUNK
from sluicegate.cluster.peers import EXPIRE_CHUNK, TICKET_GAP, PeerRecord
from sluicegate.cluster.ring import peer_key, semaphore_key
from sluicegate.cluster.semaphore_leases import SemaphoreConfig
from sluicegate.cluster.semaphore_ops import (
    Acquire,
    AcquireOutcome,
    Heartbeat,
    IsAcquired,
    NewPeer,
    ReleaseLock,
    ReleasePeer,
    Remainder,
)
from sluicegate.cluster.slots import STRETCH, slot_of
from tests.cluster.shards import LEASE, Shards

CONFIG = {"A": SemaphoreConfig(1, level=0), "B": SemaphoreConfig(3, level=1)}
NODES = ["n1", "n2", "n3"]


def new_peer(cluster: Shards, home: str | None = None, expires_in: float = 60.0) -> int:
    """A peer homed at `home` (default: any node)."""
    while True:
        node = home or next(iter(cluster.nodes))
        peer_id = cluster.call(NewPeer(expires_in), node).result
        if home is None or cluster.target(Heartbeat(peer_id, 1)) == home:
            return peer_id


def owner(cluster: Shards, name: str) -> str:
    return cluster.target(Remainder(name))


def granted(answer) -> bool:
    return answer is not None and answer.error is None and answer.result.acquired


def test_three_nodes_share_the_slots_and_serve_locks_across_them():
    cluster = Shards(CONFIG, NODES)
    assert all(shard.ownership.serves_share(cluster.now) for shard in cluster.nodes.values())
    holder, waiter = new_peer(cluster), new_peer(cluster)
    first = cluster.call(Acquire(holder, "A", 1))
    assert granted(first) and first.result.fencing_token is not None
    assert cluster.call(Acquire(waiter, "A", 1)).result == AcquireOutcome(False)
    assert cluster.call(Remainder("A")).result == 0
    cluster.call(ReleaseLock(holder, "A"))
    # The release is answered once the owner committed it and the waiter's home has the grant.
    assert cluster.call(IsAcquired(waiter)).result is True
    second = cluster.call(Acquire(waiter, "A", 1))
    assert second.result.fencing_token > first.result.fencing_token


def test_nothing_is_answered_before_the_writes_it_follows_are_committed():
    cluster = Shards(CONFIG, NODES)
    peer = new_peer(cluster)
    home = cluster.target(Heartbeat(peer, 1))
    others = [n for n in NODES if n != home]
    for other in others:
        cluster.hold(home, other)
    request = cluster.submit(home, Acquire(peer, "B", 1))
    cluster.settle()
    assert request not in cluster.answers, "answered before a quorum had the write"
    cluster.release(home, others[0])
    cluster.settle()
    assert request in cluster.answers


def test_a_restore_confirmed_while_another_lock_waits_does_not_answer_that_acquire():
    """A held lock's restore, answered granted, says nothing of the lock the peer waits for."""
    cluster = Shards(CONFIG, NODES)
    other, peer = new_peer(cluster), new_peer(cluster)
    assert granted(cluster.call(Acquire(other, "A", 1)))
    assert granted(cluster.call(Acquire(peer, "B", 1)))
    home = cluster.target(Heartbeat(peer, 1))
    waiting = cluster.submit(home, Acquire(peer, "A", 1, block_for=10.0))
    cluster.settle()
    assert waiting not in cluster.answers
    shard = cluster.nodes[home]
    ticket = shard.home.peers.ticket(peer, "B")
    restore = LockRestore(peer, "B", 1, ticket)
    cluster.nodes[owner(cluster, "B")].receive(home, restore, cluster.now)  # as after a retry
    cluster.nodes[owner(cluster, "B")].flush(cluster.now)
    cluster._collect(owner(cluster, "B"))
    cluster.settle()
    assert waiting not in cluster.answers, "the acquire of A was answered by B's restore"
    cluster.call(ReleaseLock(other, "A"))
    assert granted(cluster.answers.get(waiting))


def test_a_release_that_waited_on_a_clogged_link_cannot_drop_a_newer_lock():
    cluster = Shards(CONFIG, NODES)
    peer, rival = new_peer(cluster), new_peer(cluster)
    home, owner_a = cluster.target(Heartbeat(peer, 1)), owner(cluster, "A")
    if home == owner_a:
        return  # nothing crosses a link; another seed covers it
    assert granted(cluster.call(Acquire(peer, "A", 1)))
    cluster.hold(home, owner_a)
    cluster.submit(home, ReleaseLock(peer, "A"))  # stuck in the clog
    cluster.settle()
    cluster.release(home, owner_a)
    cluster.settle()
    assert granted(cluster.call(Acquire(peer, "A", 1)))  # a newer lock, a newer ticket
    # The old release, sent again by nobody, or late: the owner compares tickets.
    stale = cluster.nodes[home].home.peers.ticket(peer, "A") - 1
    cluster.nodes[owner_a].receive(home, LockRelease(peer, "A", stale, False), cluster.now)
    cluster.nodes[owner_a].flush(cluster.now)
    cluster.settle()
    assert cluster.call(Remainder("A")).result == 0
    assert cluster.call(Acquire(rival, "A", 1)).result == AcquireOutcome(False)


def test_a_client_operation_older_than_one_applied_is_refused_as_stale():
    cluster = Shards(CONFIG, NODES)
    peer = new_peer(cluster)
    assert granted(cluster.call(Acquire(peer, "A", 1, op=1)))
    assert cluster.call(ReleaseLock(peer, "A", op=2)).error is None
    # The acquire again, a copy that waited somewhere: it must not take the lock again.
    assert isinstance(cluster.call(Acquire(peer, "A", 1, op=1)).error, StaleOperation)
    assert cluster.call(Remainder("A")).result == 1
    assert cluster.call(ReleaseLock(peer, "A", op=2)).error is None  # a retry of the last


def test_holders_survive_their_owners_death_with_no_restore_and_tokens_go_on():
    cluster = Shards(CONFIG, NODES)
    peers = [new_peer(cluster) for _ in range(3)]
    tokens = [cluster.call(Acquire(p, "B", 1)).result.fencing_token for p in peers]
    dead = owner(cluster, "B")
    cluster.kill(dead)
    cluster.run(3 * LEASE)
    assert owner(cluster, "B") != dead
    assert cluster.call(Remainder("B")).result == 0  # every holder is still counted
    cluster.call(ReleaseLock(peers[0], "B"))
    newcomer = new_peer(cluster)
    answer = cluster.call(Acquire(newcomer, "B", 1))
    assert granted(answer) and answer.result.fencing_token > max(tokens)


def test_peers_survive_their_homes_death_and_keep_their_leases():
    cluster = Shards(CONFIG, NODES)
    peer = new_peer(cluster, expires_in=5.0)
    assert granted(cluster.call(Acquire(peer, "A", 1)))
    home = cluster.target(Heartbeat(peer, 1))
    cluster.run(2.0)
    assert cluster.call(Heartbeat(peer, 5.0)).error is None  # renewed, nothing written
    cluster.kill(home)
    cluster.run(4.0)  # past the expiry the record alone would have
    assert cluster.call(IsAcquired(peer)).result is True
    assert cluster.call(Remainder("A")).result == 0


def test_a_new_home_asks_with_tickets_above_any_the_homes_before_it_may_have_sent():
    """A home may send a lock request ahead of the write that records its ticket; the next
    home, which may never have seen that write, must not number another request the same: the
    takeover's write raises every peer's next ticket by `TICKET_GAP`."""
    cluster = Shards(CONFIG, NODES)
    peer = new_peer(cluster, expires_in=5.0)
    assert granted(cluster.call(Acquire(peer, "A", 1)))
    home = cluster.target(Heartbeat(peer, 1))
    first = cluster.nodes[home].home.peers.ticket(peer, "A")
    cluster.call(ReleaseLock(peer, "A"))
    cluster.kill(home)
    cluster.run(3 * LEASE)
    assert cluster.target(Heartbeat(peer, 1)) != home
    assert granted(cluster.call(Acquire(peer, "A", 1)))
    again = cluster.nodes[cluster.target(Heartbeat(peer, 1))].home.peers.ticket(peer, "A")
    assert again >= first + TICKET_GAP


def test_a_request_sent_ahead_of_a_write_its_home_lost_is_never_taken_for_a_later_one():
    """A home asks for 1 of B and dies at once: its request reached B's owner, ahead of the
    write of its ticket, which reached no other member. The next home's request for 3 must not
    be taken for it (the owner would count 1 while the peer holds 3: max exceeded)."""
    cluster = Shards(CONFIG, NODES)
    owner_b = owner(cluster, "B")
    home = next(n for n in NODES if n != owner_b)
    peer = new_peer(cluster, home=home, expires_in=60.0)
    cluster.submit(home, Acquire(peer, "B", 1))
    # The write travels ahead of the request on the link, and is dropped here: with five
    # members, the owner's acceptor may hold it and be left out of the next home's quorum.
    queue = cluster.queues[home, owner_b]
    request = next(m for m in queue if isinstance(m, LockRequest))
    queue.clear()
    cluster.nodes[owner_b].receive(home, request, cluster.now)
    cluster.nodes[owner_b].flush(cluster.now)
    cluster.kill(home)
    cluster.run(1.8 * LEASE)  # the takeover; the owner's audit (every 2 s) comes later
    assert cluster.target(Heartbeat(peer, 1)) != home
    assert granted(cluster.call(Acquire(peer, "B", 3)))
    assert cluster.call(Remainder("B")).result == 0


def test_a_request_waits_for_its_write_while_a_release_of_its_peer_is_unconfirmed():
    """Ahead of a release still held behind its write, a request would supersede at the owner
    the lock the next home, which never saw the release, still counts held."""
    home = Home(CONFIG, owner_of=lambda name: "owner")
    peer = home.new_peer(0.0, 60.0, random.Random(1), lambda peer_id: True)
    assert home.acquire(peer, "A", 1, 0.0, None, None) is None
    assert len(home.ahead()) == 1
    ticket = home.peers.ticket(peer, "A")
    home.receive("owner", LockAnswer(peer, "A", ticket, True, 7), 0.1)
    home.release_lock(peer, "A", None, 0.2)
    assert home.unconfirmed(peer)
    assert home.acquire(peer, "B", 1, 0.3, None, None) is None
    assert home.ahead() == [] and any(isinstance(m, LockRequest) for _, m in home.outbox())


def test_a_grant_is_written_by_its_owner_alone_and_a_new_home_asks_for_it_again():
    """The home does not write a grant: its copy says the lock is pending. A home that gains
    the peer then asks the owner before it answers what the peer holds, and the owner cut off,
    what the client reads or asks next waits, not read from the copy (which would say the peer
    holds nothing)."""
    ids = ["n1", "n2", "n3", "n4", "n5"]
    cluster = Shards(CONFIG, ids)
    owner_a = owner(cluster, "A")
    home = next(n for n in ids if n != owner_a)
    peer = new_peer(cluster, home=home, expires_in=60.0)
    assert granted(cluster.call(Acquire(peer, "A", 1)))
    assert cluster.nodes[home].home.peers.is_acquired(peer)
    record = _copy_of_peer(cluster, owner_a, peer)
    assert record.pending_semaphore == "A" and not record.held
    for other in ids:
        if other != owner_a:
            cluster.hold(owner_a, other)
    cluster.kill(home)
    while not (homes := [n for n, s in cluster.nodes.items() if s.serves_peer(peer, cluster.now)]):
        cluster.run(0.05)
    [new_home] = homes
    assert cluster.nodes[new_home].home.settling(peer)
    read = cluster.submit(new_home, IsAcquired(peer))
    again = cluster.submit(new_home, Acquire(peer, "A", 1))
    cluster.settle()
    assert read not in cluster.answers and again not in cluster.answers
    for other in ids:
        cluster.release(owner_a, other)
    cluster.run(2 * LEASE)
    assert cluster.answers.pop(read).result is True
    assert granted(cluster.answers.pop(again))


def test_a_peer_whose_owner_never_answers_is_refused_not_read_from_its_copy():
    home = Home(CONFIG, owner_of=lambda name: "owner")
    record = PeerRecord(7, 60.0, 60.0, {}, "A", 1, {"A": 1}, {}, 2, 0)
    home.gain([record], 0.0)
    assert home.settling(7)
    assert [type(m) for _, m in home.outbox()] == [LockRequest]
    home.tick(DECISION_TIMEOUT)
    assert home.events() == [Settled(7, answered=False)] and not home.settling(7)
    home.gain([record], 10.0)
    home.receive("owner", LockAnswer(7, "A", 1, True, 9), 10.1)
    assert home.events() == [Settled(7, answered=True), Granted(7, "A")]
    assert home.peers.is_acquired(7) and home.changed(10.1) == ([], [])


def _copy_of_peer(cluster: Shards, member: str, peer_id: int):
    slot = slot_of(peer_key(peer_id))
    copy = cluster.nodes[member].ownership.acceptor.slots[slot].copy
    return next(r for r in copy.records(cluster.now) if getattr(r, "peer_id", None) == peer_id)


def test_an_acquire_with_no_lifetime_is_answered_and_its_release_seen_at_once():
    cluster = Shards(CONFIG, NODES)
    peer = new_peer(cluster)
    if cluster.target(Heartbeat(peer, 1)) == owner(cluster, "A"):
        peer = new_peer(cluster, home=next(n for n in NODES if n != owner(cluster, "A")))
    answer = cluster.call(Acquire(peer, "A", 1, expires_in=0.0))
    assert granted(answer)
    assert cluster.call(Remainder("A")).result == 1  # the peer expired, its lock is free
    assert isinstance(cluster.call(IsAcquired(peer)).error, UnknownPeer)


def test_a_node_answers_503_for_a_slot_it_does_not_act_for():
    cluster = Shards(CONFIG, NODES)
    peer = new_peer(cluster)
    home = cluster.target(Heartbeat(peer, 1))
    elsewhere = next(n for n in NODES if n != home)
    answer = cluster.call(IsAcquired(peer), elsewhere)
    assert isinstance(answer.error, NotServing)


def test_a_node_cut_off_from_most_says_so_when_it_refuses():
    """A node that forwarded the request there sends its client on instead of telling it to
    wait for a takeover (docs/cluster.md, "Routing"; five-node seed 188788960)."""
    cluster = Shards(CONFIG, NODES)
    peer = new_peer(cluster)
    home = cluster.target(Heartbeat(peer, 1))
    elsewhere = next(n for n in NODES if n != home)
    assert not isinstance(cluster.call(IsAcquired(peer), elsewhere).error, NotServingCutOff)
    for other in NODES:
        if other != elsewhere:
            cluster.hold(elsewhere, other)
    cluster.run(LEASE)
    answer = cluster.call(IsAcquired(peer), elsewhere)
    assert isinstance(answer.error, NotServingCutOff), answer


def test_a_deleted_peer_releases_every_lock_before_its_answer():
    cluster = Shards(CONFIG, NODES)
    peer = new_peer(cluster)
    assert granted(cluster.call(Acquire(peer, "B", 2)))
    assert granted(cluster.call(Acquire(peer, "A", 1)))
    assert cluster.call(ReleasePeer(peer)).result is True
    assert cluster.call(Remainder("B")).result == 3 and cluster.call(Remainder("A")).result == 1


def test_slots_of_peers_and_semaphores_are_where_the_ring_says():
    cluster = Shards(CONFIG, NODES)
    shard = cluster.nodes["n1"]
    for name in CONFIG:
        assert shard.ownership.owner_of(slot_of(semaphore_key(name))) == owner(cluster, name)
    peer = new_peer(cluster)
    assert shard.ownership.owner_of(slot_of(peer_key(peer))) == cluster.target(Heartbeat(peer, 1))


def test_a_withdrawn_acquire_is_never_answered_and_no_longer_waits():
    cluster = Shards(CONFIG, NODES)
    holder, peer = new_peer(cluster), new_peer(cluster)
    assert granted(cluster.call(Acquire(holder, "A", 1)))
    home = cluster.target(Heartbeat(peer, 1))
    kept = cluster.submit(home, Acquire(peer, "A", 1, block_for=10.0))
    gone = [cluster.submit(home, Acquire(peer, "A", 1, block_for=10.0)) for _ in range(3)]
    cluster.settle()
    shard = cluster.nodes[home]
    for request_id in gone:
        shard.withdraw(request_id)
    assert shard._parked.count_of(peer) == 1
    cluster.call(ReleaseLock(holder, "A"))
    assert granted(cluster.answers.get(kept))
    assert not any(request_id in cluster.answers for request_id in gone)
    cluster.run(11.0)
    assert not any(request_id in cluster.answers for request_id in gone)
    assert shard.next_deadline() < float("inf")  # the ownership's own, not a parked one
    assert len(shard._parked) == 0


def test_a_stop_answers_parked_acquires_a_chunk_at_a_time():
    cluster = Shards(CONFIG, NODES)
    holder = new_peer(cluster, "n1")
    assert granted(cluster.call(Acquire(holder, "A", 1)))
    waiting = []
    while len(waiting) < STOP_CHUNK * 5 // 2:
        peer = cluster.call(NewPeer(600), "n1").result
        if cluster.target(Heartbeat(peer, 1)) == "n1":
            waiting.append(cluster.submit("n1", Acquire(peer, "A", 1, block_for=60.0)))
    cluster.settle()
    shard = cluster.nodes["n1"]
    assert len(shard._parked) == len(waiting)
    answered = []
    for more in (True, True, False):
        assert shard.stop_blocking(cluster.now) is more
        answered.append(len(shard.answers()))
    assert answered == [STOP_CHUNK, STOP_CHUNK, len(waiting) - 2 * STOP_CHUNK]
    # Stopped: an acquire that would wait is answered "not yet" at once.
    late = cluster.submit("n1", Acquire(peer, "A", 1, block_for=60.0))
    cluster.settle()
    assert cluster.answers[late].result == AcquireOutcome(False)


def test_a_heartbeat_that_ends_its_peer_is_answered_once_its_locks_are_back():
    cluster = Shards(CONFIG, NODES)
    home = next(n for n in NODES if n != owner(cluster, "B"))
    peer = new_peer(cluster, home=home)
    assert granted(cluster.call(Acquire(peer, "B", 2)))
    cluster.hold(home, owner(cluster, "B"))
    request_id = cluster.submit(home, Heartbeat(peer, 0.0))
    cluster.settle()
    assert request_id not in cluster.answers  # the owner has not confirmed the release yet
    cluster.release(home, owner(cluster, "B"))
    cluster.settle()
    assert cluster.answers.pop(request_id).error is None
    assert cluster.call(Remainder("B")).result == 3


def test_a_heartbeat_is_not_held_behind_a_release_its_owner_has_not_confirmed():
    cluster = Shards(CONFIG, NODES)
    home = next(n for n in NODES if n != owner(cluster, "B"))
    peer = new_peer(cluster, home=home)
    assert granted(cluster.call(Acquire(peer, "B", 2)))
    cluster.hold(home, owner(cluster, "B"))
    release = cluster.submit(home, ReleaseLock(peer, "B"))
    beat = cluster.submit(home, Heartbeat(peer, 5.0))
    cluster.settle()
    assert cluster.answers.pop(beat).error is None
    assert release not in cluster.answers
    cluster.release(home, owner(cluster, "B"))
    cluster.settle()
    assert cluster.answers.pop(release).error is None


@pytest.mark.parametrize("at_owner", [True, False])
def test_a_peer_spared_for_its_acquire_expires_with_the_answer(at_owner):
    """An acquire renews the peer to expire at once: the lock is granted (the operation
    completes before the expiry it raced), and whatever is read next sees it gone, whether
    the owner's answer came over a link or from this node's own owner."""
    cluster = Shards(CONFIG, NODES)
    the_owner = owner(cluster, "B")
    home = the_owner if at_owner else next(n for n in NODES if n != the_owner)
    third = next(n for n in NODES if n not in (home, the_owner))
    peer = new_peer(cluster, home=home)
    # One acceptance commits each write: the step that commits the grant is the last.
    cluster.hold(the_owner, third)
    assert granted(cluster.call(Acquire(peer, "B", 2, expires_in=0.0), home))
    assert cluster.call(Remainder("B")).result == 3


def test_a_lock_on_a_semaphore_its_owner_does_not_define_waits_and_harms_nothing():
    # Nodes configured otherwise (a rolling change half done): the owner of X's slot lacks X.
    with_x = {**CONFIG, "X": SemaphoreConfig(2)}
    lacking = owner(Shards(with_x, NODES), "X")
    cluster = Shards(with_x, NODES, configs={lacking: CONFIG})
    home = next(n for n in NODES if n != lacking)
    peer = new_peer(cluster, home=home)
    request_id = cluster.submit(home, Acquire(peer, "X", 1))
    cluster.run(DECISION_TIMEOUT + 1.0)
    assert cluster.answers.pop(request_id).result.acquired is False
    other = new_peer(cluster, home=home)
    assert granted(cluster.call(Acquire(other, "A", 1)))  # and the others are served


def test_peers_due_together_expire_a_chunk_a_step_and_one_named_first():
    cluster = Shards(CONFIG, NODES)
    home = NODES[0]
    peers = [cluster.call(NewPeer(0.1), home).result for _ in range(2 * EXPIRE_CHUNK)]
    cluster.now += 0.01
    last = cluster.call(NewPeer(0.1), home).result  # due after all the others
    assert granted(cluster.call(Acquire(last, "B", 1)))
    shard = cluster.nodes[home]
    cluster.now += 0.2  # within the slots' lease: no renewal is due to run first
    shard.tick(cluster.now)
    assert len(shard.home.peers.peer_ids()) == len(peers) + 1 - EXPIRE_CHUNK
    assert shard.next_deadline() <= cluster.now  # the rest are due now
    # A request about a peer the chunks have not reached finds it expired, its lock released.
    assert isinstance(cluster.call(IsAcquired(last), home).error, UnknownPeer)
    assert cluster.call(Remainder("B")).result == 3
    cluster.run(0.2)
    assert shard.home.peers.peer_ids() == []


def test_a_peer_lives_its_expiry_stretched_for_clock_drift_at_its_home():
    """The client counts its lease on its own clock, which may run slower than its home's (by
    up to DRIFT, the home's faster): a home keeps a peer STRETCH times its expires_in."""
    cluster = Shards(CONFIG, NODES)
    peer = new_peer(cluster, expires_in=5.0)
    assert granted(cluster.call(Acquire(peer, "A", 1)))
    cluster.run(5.1)  # past 5 s, within 5 s x STRETCH
    assert cluster.call(IsAcquired(peer)).result is True
    cluster.run(5.0 * STRETCH - 5.1 + 0.05)
    assert isinstance(cluster.call(IsAcquired(peer)).error, UnknownPeer)


def test_a_change_not_written_yet_is_written_before_its_slot_can_be_lost():
    """A release reaches the owner, which grants the next waiter; before that change is written
    (a frame's messages are written together), the owner's lease runs out. The grant must not
    go out with no write behind it: the next owner would grant the lock, and its token, again."""
    cluster = Shards(CONFIG, NODES)
    owner_a = owner(cluster, "A")
    homes = [n for n in NODES if n != owner_a]
    holder, waiter = new_peer(cluster, home=homes[0]), new_peer(cluster, home=homes[1])
    assert granted(cluster.call(Acquire(holder, "A", 1)))
    assert cluster.call(Acquire(waiter, "A", 1)).result == AcquireOutcome(False)
    shard = cluster.nodes[owner_a]
    ticket = cluster.nodes[homes[0]].home.peers.ticket(holder, "A")
    shard.receive(homes[0], LockRelease(holder, "A", ticket, True), cluster.now)
    shard.tick(cluster.now + 2 * LEASE)  # no renewal ran: the lease is over
    sent = [message for _, message in shard.outbox()]
    assert not any(isinstance(m, LockAnswer) and m.peer_id == waiter for m in sent), sent
