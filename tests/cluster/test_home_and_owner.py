"""The two halves a cluster places on different nodes: the peer's home and the semaphore's owner.

`SemaphoreCore` composes them in one process (covered by test_semaphore_core.py); these tests cover
what only happens when messages between them take time: grants arriving late, withdrawn locks,
repeated restores.
"""

from __future__ import annotations

import random

import pytest

from sluicegate.cluster import home as home_module
from sluicegate.cluster import owner as owner_module
from sluicegate.cluster.errors import (
    AlreadyPending,
    StaleOperation,
    UnknownPeer,
    UnknownSemaphore,
)
from sluicegate.cluster.home import QUEUED_RECHECK, TIMER_CHUNK, Home
from sluicegate.cluster.lock_messages import LockAnswer, LockRelease, LockRequest
from sluicegate.cluster.owner import AUDIT_CHUNK, AUDIT_INTERVAL, Owner
from sluicegate.cluster.peers import AskOwner, PeerTable
from sluicegate.cluster.semaphore_leases import (
    LockGranted,
    LockRecord,
    SemaphoreConfig,
    SemaphoreLeases,
    SemaphoreRecord,
    lock_key,
)
from sluicegate.cluster.semaphores import SemaphoreCore
from tests.collector import held

CONFIG = {"A": SemaphoreConfig(2, level=0), "B": SemaphoreConfig(1, level=1)}


@pytest.fixture
def home():
    return PeerTable(CONFIG)


@pytest.fixture
def owner():
    return SemaphoreLeases(CONFIG)


def test_home_asks_the_owner_and_counts_the_peer_pending_meanwhile(home):
    peer = home.new_peer(60, random.Random(1))
    assert home.acquire(peer, "A", 2, now=0) == AskOwner("A", 2, ticket=1)
    assert home.is_acquired(peer) is False
    # Asked again while the owner's answer is in flight: idempotent, still waiting.
    assert home.acquire(peer, "A", 2, now=0) is False
    with pytest.raises(AlreadyPending):
        home.acquire(peer, "B", 1, now=0)
    assert home.granted(peer, "A", 1, token=7) is True
    assert home.is_acquired(peer) is True and home.token(peer, "A") == 7
    assert home.acquire(peer, "A", 2, now=0) is True


def test_each_lock_of_a_peer_gets_the_next_ticket(home):
    peer = home.new_peer(60, random.Random(1))
    assert home.acquire(peer, "B", 1, now=0).ticket == 1
    assert home.release_lock(peer, "B") == 1
    assert home.acquire(peer, "B", 1, now=0).ticket == 2  # the same semaphore again: a new lock
    home.granted(peer, "B", 2, token=3)
    assert home.acquire(peer, "A", 1, now=0).ticket == 3


def test_a_late_grant_for_a_withdrawn_lock_is_refused(home):
    peer = home.new_peer(60, random.Random(1))
    ticket = home.acquire(peer, "A", 1, now=0).ticket
    assert home.release_lock(peer, "A") == ticket  # withdrawn: the owner must hear of it
    assert home.granted(peer, "A", ticket, token=5) is False
    assert home.is_acquired(peer) is True


def test_a_grant_for_a_peer_that_is_gone_is_refused(home):
    peer = home.new_peer(60, random.Random(1))
    ticket = home.acquire(peer, "A", 1, now=0).ticket
    assert home.remove(peer) == [("A", ticket)]
    assert home.granted(peer, "A", ticket, token=5) is False


def test_a_grant_of_another_ticket_is_refused(home):
    peer = home.new_peer(60, random.Random(1))
    ticket = home.acquire(peer, "A", 1, now=0).ticket
    assert home.granted(peer, "A", ticket + 1, token=5) is False
    assert home.granted(peer, "A", ticket - 1, token=5) is False


def test_home_release_reports_what_the_owner_must_hear(home):
    peer = home.new_peer(60, random.Random(1))
    with pytest.raises(UnknownSemaphore):
        home.release_lock(12345, "nope")  # semaphore before peer
    with pytest.raises(UnknownPeer):
        home.release_lock(12345, "A")
    assert home.release_lock(peer, "A") is None


def test_a_client_operation_numbered_below_the_last_applied_is_stale(home):
    peer = home.new_peer(60, random.Random(1))
    home.numbered(peer, 3)
    home.numbered(peer, 3)  # a retry of the same operation
    home.numbered(peer, None)  # unnumbered (HTTP)
    with pytest.raises(StaleOperation):
        home.numbered(peer, 2)
    home.numbered(peer, 4)


def test_expiry_reports_the_locks_each_owner_must_release(home):
    peer = home.new_peer(10, random.Random(1))
    b = home.acquire(peer, "B", 1, now=0).ticket
    home.granted(peer, "B", b, token=1)
    a = home.acquire(peer, "A", 1, now=0).ticket
    assert home.expire(10) == [(peer, [("B", b), ("A", a)])]
    assert home.next_deadline() is None


def test_expiry_spares_a_peer_while_asked_to(home):
    peer = home.new_peer(10, random.Random(1))
    assert home.expire(10, spared=lambda peer_id: peer_id == peer) == []
    assert home.expire(10) == [(peer, [])]


def test_owner_grants_in_arrival_order_across_homes(owner):
    assert owner.request(1, "A", 2, now=0) is True
    assert owner.request(2, "A", 1, now=1) is False
    assert owner.request(3, "A", 1, now=2) is False
    owner.release(1, "A")
    assert owner.events() == [LockGranted(2, "A", 1), LockGranted(3, "A", 1)]
    assert owner.remainder("A") == 0


def test_owner_release_of_an_unknown_lock_changes_nothing(owner):
    owner.request(1, "A", 1, now=0)
    owner.release(99, "A")
    assert owner.remainder("A") == 1
    assert owner.events() == []


def test_owner_ignores_what_quotes_a_ticket_below_the_latest_of_the_peer(owner):
    assert owner.request(1, "A", 1, now=0, ticket=5) is True
    assert owner.request(1, "A", 1, now=0, ticket=4) is None  # stale: ignored
    owner.release(1, "A", ticket=4)  # a stale release does not touch the newer lock
    assert owner.remainder("A") == 1
    assert owner.restore(1, "A", 1, ticket=3) is False
    assert owner.request(1, "A", 1, now=0, ticket=5) is True  # the same lock again
    owner.release(1, "A", ticket=5)
    assert owner.remainder("A") == 2


def test_a_newer_ticket_supersedes_the_peers_lock_and_releases_the_older_one(owner):
    owner.request(1, "A", 2, now=0, ticket=1)
    assert owner.request(2, "A", 1, now=0, ticket=1) is False  # waits behind
    # The home released ticket 1 (the release is on its way) and asks anew: the old lock is
    # dropped first, the waiter granted, and the new lock comes after it.
    assert owner.request(1, "A", 1, now=1, ticket=2) is True
    assert owner.events() == [LockGranted(2, "A", 1)]
    owner.release(1, "A", ticket=1)  # the late release: below the latest, nothing to do
    assert owner.ticket(1, "A") == 2 and owner.remainder("A") == 0
    owner.release(1, "A", ticket=7)  # a release quoting a later ticket drops the older lock
    assert owner.remainder("A") == 1


def test_owner_restore_is_idempotent(owner):
    owner.restore(7, "B", 1)
    owner.restore(7, "B", 1)  # a retried message
    assert owner.remainder("B") == 0
    owner.restore(8, "B", 1)  # beyond max: counted, remainder negative
    assert owner.remainder("B") == -1


def test_owner_release_all_grants_after_dropping_everything(owner):
    owner.request(1, "A", 2, now=0)
    owner.request(1, "B", 1, now=0)
    owner.request(2, "B", 1, now=1)
    owner.request(3, "A", 2, now=2)
    owner.release_all(1, ["A", "B"])
    assert owner.events() == [LockGranted(3, "A", 2), LockGranted(2, "B", 1)]


def test_home_and_owner_with_a_message_in_flight():
    """A release overtakes the grant it triggers: the home refuses it, the owner is told."""
    home, owner = PeerTable(CONFIG), SemaphoreLeases(CONFIG)
    rng = random.Random(3)
    holder, waiter = home.new_peer(60, rng), home.new_peer(60, rng)
    for peer in (holder, waiter):
        ask = home.acquire(peer, "B", 1, now=0)
        if owner.request(peer, ask.semaphore, ask.count, now=0, ticket=ask.ticket):
            assert home.granted(peer, "B", ask.ticket, owner.token(peer, "B"))
    assert home.is_acquired(waiter) is False

    owner.release(holder, "B", ticket=home.release_lock(holder, "B"))
    in_flight = owner.events()
    assert in_flight == [LockGranted(waiter, "B", 1)]
    home.release_lock(waiter, "B")  # the client gave up before the grant arrived
    for grant in in_flight:
        ticket = owner.ticket(grant.peer_id, grant.semaphore)
        token = owner.token(grant.peer_id, grant.semaphore)
        if not home.granted(grant.peer_id, grant.semaphore, ticket, token):
            owner.release(grant.peer_id, grant.semaphore, ticket)
    assert owner.remainder("B") == 1
    assert home.is_acquired(waiter) is True


def test_fencing_tokens_increase_per_semaphore_and_follow_the_holder(owner):
    owner.request(1, "A", 1, now=0)
    owner.request(2, "A", 1, now=0)
    first, second = owner.token(1, "A"), owner.token(2, "A")
    assert first < second
    owner.request(3, "A", 1, now=0)  # waits
    assert owner.token(3, "A") is None
    owner.release(1, "A")
    assert owner.token(1, "A") is None
    assert owner.token(3, "A") > second  # granted from the queue: the next token
    owner.restore(4, "A", 1)
    assert owner.token(4, "A") > owner.token(3, "A")
    # Each semaphore counts on its own.
    owner.request(1, "B", 1, now=0)
    assert owner.token(1, "B") == 0


def test_a_later_life_of_the_owner_continues_above_the_earlier_one():
    earlier = SemaphoreLeases(CONFIG, epoch=1_700_000_000_000)
    for peer in range(1000):
        earlier.request(peer, "A", 1, now=0)
        earlier.release(peer, "A")
    earlier.request(5000, "A", 1, now=0)
    later = SemaphoreLeases(CONFIG, epoch=1_700_000_000_001)
    later.request(1, "A", 1, now=0)
    assert later.token(1, "A") > earlier.token(5000, "A")
    assert later.token(1, "A") < 2**64  # fits Throttle's u64 world


def test_grace_period_accepts_restores_and_grants_nothing_until_it_ends(owner):
    owner.start_grace(until=10)
    assert owner.request(1, "A", 1, now=0) is False  # room enough, but holders may be unknown
    owner.restore(7, "A", 2)  # a holder comes back
    assert owner.remainder("A") == 0
    assert owner.end_grace(9.9) is False
    owner.release(7, "A")  # releases during grace grant nobody either
    assert owner.events() == []
    assert owner.end_grace(10) is True
    assert owner.events() == [LockGranted(1, "A", 1)]
    assert owner.grace_until is None


def test_restores_beyond_max_are_counted_once(owner):
    owner.restore(1, "B", 1)
    assert owner.restores_beyond_max == 0  # exactly max
    owner.restore(2, "B", 1)
    assert owner.restores_beyond_max == 1
    owner.restore(2, "B", 1)  # a retry of the same restore
    assert owner.restores_beyond_max == 1


def test_core_wakes_at_the_end_of_grace():
    core = SemaphoreCore(CONFIG)
    rng = random.Random(5)
    waiter = core.new_peer(100, rng)
    holder = 424242  # a peer the node forgot, coming back
    core.start_grace(until=5)
    assert core.next_deadline() == 5
    assert core.acquire(waiter, "B", 1, now=1) is False
    core.restore(holder, {"B": 1}, expires_at=100)
    core.release_lock(holder, "B")
    assert core.expire(4) == [] and core.events() == []
    core.expire(5)
    assert core.events() == [LockGranted(waiter, "B", 1)]
    assert core.is_acquired(waiter)
    assert core.next_deadline() == 100


def test_a_holder_and_its_waiter_expiring_together_grant_nobody():
    """Regression: the owner used to grant the waiter while releasing the holder, though the
    waiter had expired in the same sweep (found by the replica property test)."""
    core = SemaphoreCore(CONFIG)
    # The holder's id sorts first, so the expiry sweep meets the holder before its waiter.
    holder, waiter = 1, 2
    core.restore(holder, {"B": 1}, expires_at=20)
    core.restore(waiter, {}, expires_at=20)
    assert core.acquire(waiter, "B", 1, now=14) is False
    assert core.expire(20) == [holder, waiter]
    events = core.events()
    assert [type(e).__name__ for e in events] == ["PeerRemoved", "PeerRemoved"]
    assert core.remainder("B") == 1
    assert core.stats(20)[1].pending == 0


def test_a_table_drops_the_peers_of_one_group_without_looking_at_the_others():
    """A home that loses a slot drops its peers alone: going through all of a node's peers
    for each of 256 slots kept a leaving node with 100,000 peers from stopping for seconds."""
    asked: list[int] = []

    def group_of(peer_id: int) -> int:
        asked.append(peer_id)
        return peer_id % 3

    table = PeerTable(CONFIG, group_of=group_of)
    rng = random.Random(2)
    peers = [table.new_peer(60, rng) for _ in range(30)]
    assert table.remove(peers[0]) == []
    group = peers[1] % 3
    asked.clear()
    gone = table.drop([group])
    assert asked == []
    assert set(gone) == {p for p in peers[1:] if p % 3 == group}
    assert all(table.has_peer(p) == (p % 3 != group) for p in peers[1:])
    assert table.drop([group]) == []
    # Every group left: the table starts afresh.
    rest = sorted({p % 3 for p in peers[1:]} - {group})
    assert set(table.drop(rest)) == {p for p in peers[1:] if p % 3 != group}
    assert not any(table.has_peer(p) for p in peers)
    assert table.new_peer(60, rng) and table.drop(range(3))


def test_a_tables_peers_leave_the_garbage_collector_nothing_to_walk():
    """A full collection walks every object the collector tracks: 100,000 peers as objects made
    a node's full collections 30 to 40 ms long. Peers holding locks, waiting, renewed or
    restored leave nothing tracked behind once the collector has looked at them."""
    table = PeerTable(CONFIG, most=10_000, group_of=lambda peer_id: peer_id % 256)
    rng = random.Random(3)
    for n in range(3000):
        peer_id = table.new_peer(60.0 + n, rng, lease=5.0)
        ask = table.acquire(peer_id, "B", 1, 0.0, expires_in=30.0)
        table.numbered(peer_id, n + 1)
        if n % 3:
            assert table.granted(peer_id, "B", ask.ticket, n)
        if n % 3 == 2:
            table.acquire(peer_id, "A", 1, 0.0)
        table.heartbeat(peer_id, 90.0 + n, lease=6.0)
        table.restore(rng.getrandbits(64), {"A": 1}, 60.0, lease=5.0)
    assert len(table) == 6000
    # The table's own containers, and its 256 groups' sets (`held` collects three times: a
    # collection lets a tuple go only once it has let go of the tuples inside it).
    tracked, _ = held(table)
    assert tracked < 300


def test_an_owner_writes_the_locks_that_changed_not_every_waiter():
    """Every record of a write goes to every acceptor: with each lock inside its semaphore's
    record, 5,000 waiting acquires took a node 12 s, each one writing all the waiters before it.
    A write carries the semaphore's own record and the locks that came, went or were granted;
    a new owner puts every lock back in its place from the records."""
    owner = Owner(CONFIG, home_of=lambda peer_id: "home")
    owner.gain(["A"], [], now=0.0, epoch=1, cold=False)
    for peer_id in range(1, 1001):
        owner.receive("home", LockRequest(peer_id, "A", 1, ticket=1), now=0.0)
    kept = {record.key: record for _, records, _ in owner.changed() for record in records}
    owner.receive("home", LockRequest(1001, "A", 1, ticket=1), now=1.0)
    [write] = owner.changed()
    assert write == ("A", [owner.leases.header("A"), owner.leases.lock_record("A", 1001)], [])
    owner.receive("home", LockRelease(1, "A", ticket=1, confirm=False), now=2.0)
    [(_, records, gone)] = owner.changed()
    # Peer 1 let go, and peer 3, the first waiter, was granted in its place (A's max is 2).
    assert [record.key for record in records] == ["s:A", lock_key("A", 3)]
    assert gone == [lock_key("A", 1)]
    for record in [*write[1], *records]:
        kept[record.key] = record
    for key in gone:
        del kept[key]

    successor = SemaphoreLeases(CONFIG)
    successor.load(kept.values(), now=3.0, epoch=2)
    assert successor.holdings("A") == owner.leases.holdings("A")
    for peer_id, _ in owner.leases.holdings("A"):
        assert successor.lock_record("A", peer_id) == owner.leases.lock_record("A", peer_id)


def test_an_owner_takes_on_no_record_of_a_semaphore_it_does_not_define():
    # Written by an owner configured otherwise: the record stays on the acceptors, untouched.
    leases = SemaphoreLeases({"A": SemaphoreConfig(2)})
    records = [
        SemaphoreRecord("X", 7, 1),
        LockRecord("X", 1, 1, 1, 6, False, 0),
        SemaphoreRecord("A", 5, 1),
        LockRecord("A", 2, 1, 1, 4, False, 0),
    ]
    leases.load(records, now=0.0, epoch=0)
    assert leases.remainder("A") == 1


def settled_deadline(home: Home) -> float:
    """`home.next_deadline()` once it has thrown out its stale timers, a chunk a call: until
    then it may say an earlier deadline."""
    while (deadline := home.next_deadline()) != home.next_deadline():
        pass
    return deadline


def test_a_home_asks_again_about_waiting_locks_a_chunk_a_step():
    """1,200 acquires wait in line and come due together: each step asks about `TIMER_CHUNK`
    of them, and the home is due again at once for the rest."""
    home = Home(CONFIG, owner_of=lambda name: "owner")
    rng = random.Random(1)
    peers = [home.new_peer(0.0, 600.0, rng, lambda peer_id: True) for _ in range(1200)]
    for peer_id in peers:
        assert home.acquire(peer_id, "B", 1, 0.0, None, None) is None
    assert len(home.ahead()) == 1200  # new requests, each with its write
    for peer_id in peers:
        home.receive("owner", LockAnswer(peer_id, "B", 1, False, 0), now=0.1)
    due_at = settled_deadline(home)
    assert due_at == pytest.approx(0.1 + QUEUED_RECHECK)
    asked = []
    while home.next_deadline() <= due_at:
        home.tick(due_at)
        asked.append(len(home.outbox()))
    chunks, rest = divmod(1200, TIMER_CHUNK)
    assert asked == [TIMER_CHUNK] * chunks + [rest] * (rest > 0)


def test_an_owner_audits_its_locks_a_chunk_a_step():
    """Every `AUDIT_INTERVAL` an owner asks the homes about the locks it holds for them:
    `AUDIT_CHUNK` a step, due again at once for the rest, each lock once per audit."""
    owner = Owner({"A": SemaphoreConfig(1)}, home_of=lambda peer_id: f"h{peer_id % 3}")
    owner.gain(["A"], [], now=0.0, epoch=1, cold=False)
    locks = AUDIT_CHUNK * 2 + 10
    for peer_id in range(locks):
        owner.receive(f"h{peer_id % 3}", LockRequest(peer_id, "A", 1, ticket=1), now=0.0)
    owner.outbox()
    asked: list[int] = []
    audit_at = 1.0
    owner.tick(audit_at)
    while owner.next_deadline() < audit_at:
        asked.append(sum(len(audit.peer_ids) for _, audit in owner.outbox()))
        owner.tick(audit_at)
    asked.append(sum(len(audit.peer_ids) for _, audit in owner.outbox()))
    assert asked == [AUDIT_CHUNK, AUDIT_CHUNK, 10]
    assert owner.next_deadline() == pytest.approx(audit_at + AUDIT_INTERVAL)


def test_a_home_with_more_waiting_locks_than_its_rate_asks_about_each_less_often(monkeypatch):
    """Asked about every `QUEUED_RECHECK`, 100,000 waiting locks kept a node busy with little
    else: a home asks about at most `RECHECK_RATE` a second, whatever the number waiting."""
    monkeypatch.setattr(home_module, "RECHECK_RATE", 100)
    home = Home(CONFIG, owner_of=lambda name: "owner")
    rng = random.Random(1)
    peers = [home.new_peer(0.0, 600.0, rng, lambda peer_id: True) for _ in range(1200)]
    for peer_id in peers:
        home.acquire(peer_id, "B", 1, 0.0, None, None)
    home.outbox()
    for peer_id in peers:
        home.receive("owner", LockAnswer(peer_id, "B", 1, False, 0), now=0.1)
    assert settled_deadline(home) == pytest.approx(0.1 + 1200 / 100)


def test_an_owner_with_more_locks_than_its_rate_audits_them_less_often(monkeypatch):
    """Audited every `AUDIT_INTERVAL`, 100,000 waiting locks kept a node busy with little else:
    an audit asks about at most `AUDIT_RATE` locks a second."""
    monkeypatch.setattr(owner_module, "AUDIT_RATE", 1000)
    owner = Owner({"A": SemaphoreConfig(1)}, home_of=lambda peer_id: f"h{peer_id % 3}")
    owner.gain(["A"], [], now=0.0, epoch=1, cold=False)
    for peer_id in range(4000):
        owner.receive(f"h{peer_id % 3}", LockRequest(peer_id, "A", 1, ticket=1), now=0.0)
    owner.outbox()
    audit_at = 1.0
    owner.tick(audit_at)
    while owner.next_deadline() < audit_at:
        owner.tick(audit_at)
    assert owner.next_deadline() == pytest.approx(audit_at + 4000 / 1000)
