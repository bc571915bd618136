"""The sharded core: peers at their homes, semaphores at their owners, and the messages between.

`ShardNetwork` joins several cores by FIFO queues under a virtual clock. With every message
delivered at once, a cluster must answer exactly like one `SemaphoreCore` (a property test);
the other tests take messages away, reorder what may be reordered, and kill and add nodes.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluicegate.cluster.errors import NotServing, SemaphoreError, UnknownPeer
from sluicegate.cluster.semaphores import SemaphoreConfig, SemaphoreCore
from sluicegate.cluster.shard import QUEUED_RECHECK, LockQueued, LockRelease, LockRequest

from .shard_network import PULL_RETRY, SETTLE, TAKEOVER_GRACE, ShardNetwork

CONFIG = {
    "A": SemaphoreConfig(3, level=0),
    "B": SemaphoreConfig(1, level=1),
    "C": SemaphoreConfig(2, level=1),
    "D": SemaphoreConfig(5, level=2),
}
NODES = ["n1", "n2", "n3"]


def test_semaphores_and_peers_spread_over_the_nodes():
    net = ShardNetwork(CONFIG, NODES)
    owners = {net.owner(name).node_id for name in CONFIG}
    assert len(owners) >= 2
    for node_id in NODES:
        peer = net.new_peer(node_id)
        assert net.home(peer).node_id == node_id  # a node creates peers homed at itself
        for other in NODES:
            if other != node_id:
                with pytest.raises(NotServing):
                    net.nodes[other].heartbeat(peer, 100)


def test_a_waiter_at_one_home_is_granted_when_a_holder_at_another_releases():
    net = ShardNetwork(CONFIG, NODES)
    owner = net.owner("A").node_id
    homes = [n for n in NODES if n != owner]
    holder, waiter = net.new_peer(homes[0]), net.new_peer(homes[1])
    assert net.acquire(holder, "A", 3) is True
    token = net.token(holder, "A")
    home = net.home(waiter)
    assert home.acquire(waiter, "A", 1, net.now) is None  # the owner is elsewhere
    net.collect(home.node_id)
    net.deliver_all()
    assert LockQueued(waiter, "A") in net.events[home.node_id]
    assert home.is_acquired(waiter) is False
    net.release(holder, "A")
    assert home.is_acquired(waiter) is True
    assert net.token(waiter, "A") > token
    assert net.acquired("A") == 1


def test_a_large_count_is_not_overtaken_across_homes():
    net = ShardNetwork(CONFIG, NODES)
    a, b, c = (net.new_peer(n) for n in NODES)
    assert net.acquire(a, "A", 2) is True
    assert net.acquire(b, "A", 3) is False
    assert net.acquire(c, "A", 1) is False  # it would fit, but b came first
    net.release(a, "A")
    assert net.home(b).is_acquired(b) is True
    assert net.home(c).is_acquired(c) is False


def test_a_release_that_crosses_a_new_request_does_not_drop_it():
    net = ShardNetwork(CONFIG, NODES)
    owner = net.owner("A").node_id
    home_id = next(n for n in NODES if n != owner)
    peer = net.new_peer(home_id)
    home = net.nodes[home_id]
    # Ask, withdraw and ask again before the owner heard anything.
    home.acquire(peer, "A", 1, net.now)
    home.release_lock(peer, "A")
    home.acquire(peer, "A", 1, net.now)
    net.collect(home_id)
    queued = [type(m) for _, m in net.queues[home_id, owner]]
    assert queued == [LockRequest, LockRelease, LockRequest]
    net.deliver_all()
    assert home.is_acquired(peer) is True
    assert net.acquired("A") == 1


def test_a_lost_release_is_undone_by_the_owners_audit():
    net = ShardNetwork(CONFIG, NODES)
    owner = net.owner("B").node_id
    home_id = next(n for n in NODES if n != owner)
    peer, other = net.new_peer(home_id), net.new_peer(home_id)
    assert net.acquire(peer, "B") is True
    net.nodes[home_id].release_peer(peer)
    net.collect(home_id)
    net.queues[home_id, owner].clear()  # the release is lost on the way
    assert net.acquire(other, "B") is False
    net.advance(SETTLE + 3)
    assert net.nodes[home_id].is_acquired(other) is True
    assert net.acquired("B") == 1


def test_a_lost_grant_is_found_by_the_homes_retry():
    net = ShardNetwork(CONFIG, NODES)
    owner = net.owner("B").node_id
    home_id = next(n for n in NODES if n != owner)
    holder, waiter = net.new_peer(owner), net.new_peer(home_id)
    assert net.acquire(holder, "B") is True
    assert net.acquire(waiter, "B") is False
    net.nodes[owner].release_lock(holder, "B")
    net.collect(owner)
    net.queues[owner, home_id].clear()  # the grant is lost on the way
    assert net.nodes[home_id].is_acquired(waiter) is False
    net.advance(QUEUED_RECHECK + 0.5)
    assert net.nodes[home_id].is_acquired(waiter) is True


def test_an_owner_that_dies_is_replaced_from_its_replica_and_no_lease_is_lost():
    net = ShardNetwork(CONFIG, NODES)
    owner = net.owner("A").node_id
    others = [n for n in NODES if n != owner]
    holders = [net.new_peer(others[0]), net.new_peer(others[1])]
    assert net.acquire(holders[0], "A", 2) is True
    assert net.acquire(holders[1], "A", 1) is True
    tokens = [net.token(p, "A") for p in holders]
    waiter = net.new_peer(others[0])
    assert net.acquire(waiter, "A", 1) is False
    net.send_replicas()
    net.deliver_all()
    net.kill(owner)
    net.change_members()
    net.deliver_all()
    successor = net.owner("A")
    assert successor.node_id in others
    assert successor.takeovers == 1
    # Holders keep their leases, re-asserted by their homes; nothing new during the grace.
    assert net.acquired("A") == 3
    assert all(net.home(p).is_acquired(p) for p in holders)
    assert net.home(waiter).is_acquired(waiter) is False
    net.release(holders[1], "A")
    assert net.home(waiter).is_acquired(waiter) is False
    assert "A" in successor.semaphores_in_grace()
    net.advance(TAKEOVER_GRACE + 0.1)
    assert successor.semaphores_in_grace() == []
    assert net.home(waiter).is_acquired(waiter) is True
    assert net.token(waiter, "A") > max(tokens)
    assert net.acquired("A") == 3


def test_without_a_replica_the_homes_rebuild_the_owner():
    net = ShardNetwork(CONFIG, NODES)
    owner = net.owner("D").node_id
    others = [n for n in NODES if n != owner]
    holder = net.new_peer(others[0])
    assert net.acquire(holder, "D", 4) is True
    token = net.token(holder, "D")
    net.kill(owner)  # no replica was ever sent
    net.change_members()
    net.deliver_all()
    assert net.acquired("D") == 4
    assert net.token(holder, "D") > token  # the new owner's token, above the dead one's
    late = net.new_peer(others[1])
    assert net.acquire(late, "D", 2) is False  # grace, and then it does not fit
    net.advance(TAKEOVER_GRACE + 0.1)
    assert net.home(late).is_acquired(late) is False
    assert net.acquired("D") == 4


def test_a_restore_refused_by_an_owner_that_has_not_seen_the_change_yet_is_sent_again():
    net = ShardNetwork(CONFIG, NODES)
    owner = net.owner("D").node_id
    home_id, successor_id = [n for n in NODES if n != owner]
    holder = net.new_peer(home_id)
    assert net.acquire(holder, "D", 4) is True
    net.kill(owner)  # no replica: only the home knows of the holder
    net.change_members(only=[home_id])
    net.deliver_all()  # the re-asserted restore reaches a node that does not own D yet
    net.change_members(only=[successor_id])
    net.queues.pop((successor_id, home_id))  # its call for re-assertions is lost, too
    net.deliver_all()
    successor = net.nodes[successor_id]
    assert successor is net.owner("D")
    assert successor.remainder("D") == 5  # refused once, not counted yet
    net.advance(1.5)
    assert successor.remainder("D") == 1
    net.advance(TAKEOVER_GRACE)
    late = net.new_peer(successor_id)
    assert net.acquire(late, "D", 2) is False


def _holder_whose_home_departs(net: ShardNetwork, left: bool) -> int:
    """A peer holding B whose home (A's owner) dies, or leaves gracefully, after a replica."""
    victim = net.owner("A").node_id
    peer = net.new_peer(victim)
    assert net.acquire(peer, "B") is True
    net.send_replicas()
    net.deliver_all()
    net.kill(victim)
    net.change_members(left=(victim,) if left else ())
    net.deliver_all()
    assert net.home(peer).node_id != victim
    return peer


def test_peers_of_a_dead_home_are_taken_over_from_its_replica():
    net = ShardNetwork(CONFIG, NODES)
    peer = _holder_whose_home_departs(net, left=False)
    home = net.home(peer)
    assert home.has_peer(peer)
    assert net.acquired("B") == 1
    # The replica may be behind: until its client restores it, the peer is unknown to it.
    with pytest.raises(UnknownPeer):
        home.is_acquired(peer)
    home.restore(peer, {"B": 1}, 10)
    net.deliver_all()
    assert home.is_acquired(peer)
    assert net.acquired("B") == 1
    # A peer the replica did not have is unknown: its client restores it.
    with pytest.raises(UnknownPeer):
        home.heartbeat(peer + 1 if home.home_of(peer + 1) == home.node_id else peer ^ 1, 10)


def test_a_node_that_joins_pulls_its_share_before_serving_it():
    net = ShardNetwork(CONFIG, ["n1", "n2"])
    peers = [net.new_peer(n) for n in ("n1", "n2") for _ in range(20)]
    for peer in peers[:3]:
        assert net.acquire(peer, "A") is True
    tokens = {p: net.token(p, "A") for p in peers[:3]}
    net.start("n3")
    net.change_members(only=["n3"])
    joined = net.nodes["n3"]
    net.deliver_all()
    # n1 and n2 do not count n3 as a member yet: they hold its pulls back and keep serving.
    assert joined.waiting_for_handoff() == ["n1", "n2"]
    with pytest.raises(NotServing):
        joined.new_peer(100, random.Random(0))
    net.change_members(only=["n1", "n2"])
    net.deliver_all()
    assert joined.waiting_for_handoff() == []
    moved = [p for p in peers if net.home(p) is joined]
    assert moved, "some peers move to the new node"
    for peer in peers:
        assert net.home(peer).has_peer(peer)
    assert net.acquired("A") == 3
    for peer in peers[:3]:
        assert net.home(peer).is_acquired(peer)
        if peer in moved:
            # Its new home names the lock anew, so the owner gives it a new token (it cannot
            # tell it from a lock whose release was lost); the client keeps the one it has.
            assert net.token(peer, "A") > tokens[peer]
        else:
            assert net.token(peer, "A") == tokens[peer]
    if net.owner("A") is joined:
        fresh = net.new_peer("n3")
        assert net.acquire(fresh, "A") is False or net.token(fresh, "A") > max(tokens.values())


def test_a_lost_pull_is_sent_again():
    net = ShardNetwork(CONFIG, ["n1", "n2"])
    net.start("n3")
    net.change_members()
    net.queues.pop(("n3", "n1"))  # n1 holds nothing of n3's, so only the pull gets an answer
    net.deliver_all()
    assert net.nodes["n3"].waiting_for_handoff() == ["n1"]
    net.advance(PULL_RETRY + 0.1)
    assert net.nodes["n3"].waiting_for_handoff() == []


def test_state_left_behind_for_a_node_that_died_moves_on_to_the_next_owner():
    net = ShardNetwork(CONFIG, ["n1", "n2"])
    peers = [net.new_peer("n1") for _ in range(30)]
    net.start("n3")
    net.change_members(only=["n3"])
    net.deliver_all()  # n1 and n2 hold n3's pulls back: n3 is no member of theirs yet
    net.kill("n3")
    net.change_members()
    net.deliver_all()
    net.start("n4")
    net.change_members()
    net.deliver_all()
    for peer in peers:
        assert net.home(peer).has_peer(peer)
        assert sum(node.has_peer(peer) for node in net.nodes.values()) == 1


def test_a_member_that_dies_before_it_answers_leaves_its_share_to_its_replica():
    net = ShardNetwork(CONFIG, ["n1", "n2"])
    peers = [net.new_peer("n1") for _ in range(30)]
    net.send_replicas()
    net.deliver_all()
    net.start("n3")
    net.change_members(only=["n2", "n3"])  # n1 has not seen n3 yet: it holds the pull back
    net.deliver_all()
    assert net.nodes["n3"].waiting_for_handoff() == ["n1"]
    net.kill("n1")  # n3 has no replica of n1; n2 has, and passes n3's part on
    net.change_members()
    net.deliver_all()
    assert net.nodes["n3"].waiting_for_handoff() == []
    for peer in peers:
        assert net.home(peer).has_peer(peer)
        assert sum(node.has_peer(peer) for node in net.nodes.values()) == 1


def test_a_node_restarted_before_anyone_noticed_is_rebuilt_by_the_homes():
    net = ShardNetwork(CONFIG, NODES)
    owner = net.owner("C").node_id
    home_id = next(n for n in NODES if n != owner)
    holder = net.new_peer(home_id)
    assert net.acquire(holder, "C", 2) is True
    net.start(owner)  # same id, new generation, empty
    net.change_members()
    net.deliver_all()
    assert net.acquired("C") == 2
    assert net.home(holder).is_acquired(holder)


def test_a_node_cut_off_in_a_minority_stops_serving_and_rejoins_by_pulling():
    net = ShardNetwork(CONFIG, NODES)
    owner = net.owner("A").node_id
    rest = [n for n in NODES if n != owner]
    holder, waiter = net.new_peer(rest[0]), net.new_peer(rest[1])
    assert net.acquire(holder, "A", 3) is True
    assert net.acquire(waiter, "A", 1) is False
    token = net.token(holder, "A")
    net.send_replicas()
    net.deliver_all()

    net.partition([owner], rest)
    cut_off = net.nodes[owner]
    assert not cut_off.serving
    with pytest.raises(NotServing):
        cut_off.remainder("A")
    with pytest.raises(NotServing):
        cut_off.new_peer(100, random.Random(0))
    net.deliver_all()
    # The majority took A over from the replica: the holder holds, the waiter waits.
    successor = next(n for n in rest if net.nodes[n].serves_semaphore("A"))
    assert net.nodes[successor].remainder("A") == 0
    net.release(holder, "A")
    net.advance(TAKEOVER_GRACE + 0.1)
    assert net.home(waiter).is_acquired(waiter) is True

    net.heal()
    net.deliver_all()
    assert cut_off.serving and net.owner("A") is cut_off
    assert cut_off.remainder("A") == 2  # pulled back: the waiter's 1 of 3
    assert net.token(waiter, "A") > token


# -- a cluster with instant delivery answers like one node ------------------------------------

OPS = st.lists(
    st.one_of(
        st.tuples(st.just("new_peer"), st.sampled_from(NODES)),
        st.tuples(
            st.just("acquire"),
            st.integers(0, 5),
            st.sampled_from(sorted(CONFIG)),
            st.integers(0, 6),
        ),
        st.tuples(st.just("release"), st.integers(0, 5), st.sampled_from(sorted(CONFIG))),
        st.tuples(st.just("release_peer"), st.integers(0, 5)),
        st.tuples(st.just("is_acquired"), st.integers(0, 5)),
        st.tuples(st.just("remainder"), st.sampled_from(sorted(CONFIG))),
        st.tuples(st.just("heartbeat"), st.integers(0, 5), st.integers(1, 30)),
        st.tuples(st.just("advance"), st.integers(1, 20)),
    ),
    max_size=60,
)


def outcome(call, *args):
    try:
        return ("ok", call(*args))
    except SemaphoreError as error:
        return ("error", type(error).__name__, error.args)


@settings(max_examples=200, deadline=None)
@given(OPS)
def test_a_cluster_with_instant_delivery_answers_like_one_node(ops):
    net = ShardNetwork(CONFIG, NODES)
    single = SemaphoreCore(CONFIG)
    rng = random.Random(0)
    peers: list[tuple[int, int]] = []  # (cluster id, single-node id)

    def peer(index):
        return peers[index % len(peers)] if peers else (1, 1)

    for op in ops:
        kind = op[0]
        if kind == "new_peer":
            peers.append((net.new_peer(op[1], 10), single.new_peer(net.now + 10, rng)))
            continue
        if kind == "advance":
            net.advance(op[1])
            single.expire(net.now)
            continue
        if kind == "remainder":
            owner = net.owner(op[1])
            assert outcome(owner.remainder, op[1]) == outcome(single.remainder, op[1])
            continue
        cluster_id, single_id = peer(op[1])
        home = net.home(cluster_id)
        if kind == "acquire":
            got = outcome(net.acquire, cluster_id, op[2], op[3])
            want = outcome(single.acquire, single_id, op[2], op[3], net.now)
        elif kind == "release":
            got = outcome(net.release, cluster_id, op[2])
            want = outcome(single.release_lock, single_id, op[2])
        elif kind == "release_peer":
            got = outcome(home.release_peer, cluster_id)
            net.collect(home.node_id)
            net.deliver_all()
            want = outcome(single.release_peer, single_id)
        elif kind == "is_acquired":
            got = outcome(home.is_acquired, cluster_id)
            want = outcome(single.is_acquired, single_id)
        else:
            got = outcome(home.heartbeat, cluster_id, net.now + op[2])
            want = outcome(single.heartbeat, single_id, net.now + op[2])
        if got[0] == "error" and got[1] == "UnknownPeer":
            got = ("error", "UnknownPeer")
            want = want[:2]
        assert got == want, op
        for name in CONFIG:
            assert net.acquired(name) == CONFIG[name].max - single.remainder(name)


def test_peers_of_a_home_that_left_gracefully_are_not_provisional():
    """A member that said goodbye replicated everything first: its successor serves its peers
    at once, with no restore (a rolling restart goes unnoticed by clients)."""
    net = ShardNetwork(CONFIG, NODES)
    peer = _holder_whose_home_departs(net, left=True)
    home = net.home(peer)
    assert home.is_acquired(peer)
    assert net.acquired("B") == 1
