"""Replica streams: deltas in order, parts under the frame limit, and a new stream after a gap."""

from __future__ import annotations

from sluicegate.cluster.peers import PeerRecord
from sluicegate.cluster.replica_stream import (
    PART_RECORDS,
    ReplicaDelta,
    ReplicaFeed,
    ReplicaResync,
    ReplicaStore,
)
from sluicegate.cluster.semaphore_leases import SemaphoreRecord
from sluicegate.cluster.semaphores import SemaphoreConfig

from .shard_network import ShardNetwork


def peer(peer_id: int, expires_in: float = 10.0, **held: int) -> PeerRecord:
    return PeerRecord(peer_id, expires_in, held, None, 0)


def test_deltas_in_order_build_the_copy_with_lifetimes_rebased():
    store = ReplicaStore()
    record = SemaphoreRecord("A", 7, [1], [1], [6], [], [], [5], [])
    assert store.apply(ReplicaDelta(0, True, [peer(1, A=1), peer(2)], [], [record]), now=100)
    assert store.apply(ReplicaDelta(1, False, [peer(2, 20.0)], [1], []), now=105)
    replica = store.replica(now=110)
    assert replica.peers == [peer(2, 15.0)]
    assert replica.semaphores == [record]


def test_a_gap_asks_once_for_a_new_stream_and_ignores_deltas_until_it_starts():
    store = ReplicaStore()
    store.apply(ReplicaDelta(0, True, [peer(1)], [], []), now=0)
    assert store.apply(ReplicaDelta(2, False, [peer(2)], [], []), now=0) is False  # 1 was lost
    assert store.apply(ReplicaDelta(3, False, [peer(3)], [], []), now=0) is True  # asked already
    assert [r.peer_id for r in store.replica(0).peers] == [1]
    store.apply(ReplicaDelta(0, True, [peer(4)], [], []), now=0)
    assert [r.peer_id for r in store.replica(0).peers] == [4]


def test_a_whole_copy_goes_in_parts_and_deltas_follow_it():
    feed = ReplicaFeed()
    peers = [peer(i) for i in range(2 * PART_RECORDS + 1)]
    parts = feed.deltas("n2", peers, [], [])
    assert [(d.seq, d.reset, len(d.peers)) for d in parts] == [
        (0, True, PART_RECORDS),
        (1, False, PART_RECORDS),
        (2, False, 1),
    ]
    assert feed.deltas("n2", [], [], []) == []  # nothing changed, nothing sent
    assert [d.seq for d in feed.deltas("n2", [peer(1)], [], [])] == [3]
    feed.restart("n2")
    assert feed.deltas("n2", [], [], [])[0].reset


def test_a_lost_delta_is_repaired_by_a_new_stream_before_the_takeover_needs_it():
    net = ShardNetwork({"A": SemaphoreConfig(2)}, ["n1", "n2", "n3"])
    victim = net.owner("A").node_id
    survivors = [n for n in net.nodes if n != victim]
    net.send_replicas()
    net.deliver_all()
    holder = net.new_peer(victim)
    assert net.acquire(holder, "A") is True
    net.send_replicas()
    for survivor in survivors:
        net.queues[victim, survivor].clear()  # the delta with the holder is lost
    late = net.new_peer(victim)
    net.send_replicas()  # the next delta shows the gap: the survivors ask for a new stream
    for survivor in survivors:
        net.deliver_one(victim, survivor)
        assert isinstance(net.queues[survivor, victim][-1][1], ReplicaResync)
    net.deliver_all()
    net.send_replicas()  # the new stream
    net.deliver_all()
    net.kill(victim)
    net.change_members()
    net.deliver_all()
    assert net.home(holder).has_peer(holder) and net.home(late).has_peer(late)
    assert net.home(holder).locks_of(holder) == ["A"]
