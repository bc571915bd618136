"""Membership core: convergence, failure detection, goodbye, restart, partitions (no network)."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from sluicegate.cluster.membership import (
    Forgotten,
    Gossip,
    MemberDown,
    Membership,
    MemberState,
    MemberUp,
)

TICK = 0.5


class SimulatedCluster:
    """Memberships exchanging gossip through a lossy, partitionable network, in virtual time."""

    def __init__(self, count: int, seed: int = 1, down_after: float = 3.0) -> None:
        self.rng = random.Random(seed)
        self.now = 0.0
        self.down_after = down_after
        self.nodes: dict[str, Membership] = {}
        self.running: set[str] = set()
        self.blocked: set[tuple[str, str]] = set()  # (from, to) pairs that cannot talk
        self.drop_rate = 0.0
        self.generations: dict[str, int] = {}
        for i in range(1, count + 1):
            self.start(f"n{i}")

    def start(self, node_id: str) -> Membership:
        self.generations[node_id] = self.generations.get(node_id, 0) + 1
        node = Membership(
            node_id,
            address=node_id,
            generation=self.generations[node_id],
            seeds=["n1"],
            down_after=self.down_after,
        )
        self.nodes[node_id] = node
        self.running.add(node_id)
        return node

    def crash(self, node_id: str) -> None:
        self.running.discard(node_id)

    def partition(self, *groups: set[str]) -> None:
        self.blocked = {
            (a, b) for g1 in groups for g2 in groups if g1 is not g2 for a in g1 for b in g2
        }

    def deliver(self, sender: str, messages: list[tuple[str, Gossip]]) -> None:
        for target, gossip in messages:
            if target not in self.running or (sender, target) in self.blocked:
                continue
            if self.rng.random() < self.drop_rate:
                continue
            self.nodes[target].receive(gossip, self.now)

    def run(self, seconds: float) -> None:
        end = self.now + seconds
        while self.now < end:
            self.now += TICK
            for node_id in sorted(self.running):
                self.deliver(node_id, self.nodes[node_id].tick(self.now, self.rng))

    def views(self) -> dict[str, set[str]]:
        return {n: set(self.nodes[n].live_members()) for n in sorted(self.running)}

    def agreed(self, expected: set[str]) -> bool:
        return all(view == expected for view in self.views().values())


def test_nodes_that_only_know_a_seed_converge():
    cluster = SimulatedCluster(5)
    cluster.run(3)
    assert cluster.agreed({"n1", "n2", "n3", "n4", "n5"})


def test_a_silent_member_is_declared_down_by_everyone():
    cluster = SimulatedCluster(4)
    cluster.run(3)
    for node in cluster.nodes.values():
        node.events()
    cluster.crash("n3")
    cluster.run(2.5)
    assert all("n3" in view for view in cluster.views().values())  # not before the timeout
    cluster.run(2)
    assert cluster.agreed({"n1", "n2", "n4"})
    for node_id in ("n1", "n2", "n4"):
        assert cluster.nodes[node_id].events() == [MemberDown("n3", left=False)]


def test_a_goodbye_removes_the_member_at_once():
    cluster = SimulatedCluster(4)
    cluster.run(3)
    for node in cluster.nodes.values():
        node.events()
    goodbye = cluster.nodes["n2"].leave()
    cluster.crash("n2")
    assert {target for target, _ in goodbye} == {"n1", "n3", "n4"}
    cluster.deliver("n2", goodbye)
    assert cluster.agreed({"n1", "n3", "n4"})
    assert cluster.nodes["n1"].events() == [MemberDown("n2", left=True)]
    # Older gossip still circulating does not bring the departed member back.
    cluster.run(5)
    assert cluster.agreed({"n1", "n3", "n4"})


def test_a_leaving_node_stops_gossiping_and_counts_itself_out():
    node = Membership("a", "a", 1)
    node.leave()
    assert node.live_members() == {}
    assert node.tick(1.0, random.Random(0)) == []


def test_a_restarted_node_is_a_new_generation():
    cluster = SimulatedCluster(3)
    cluster.run(3)
    for node in cluster.nodes.values():
        node.events()
    cluster.crash("n3")
    cluster.start("n3")  # restarted faster than the timeout: nobody saw it down
    cluster.run(2)
    assert cluster.agreed({"n1", "n2", "n3"})
    assert MemberUp("n3", "n3", 2) in cluster.nodes["n1"].events()
    assert cluster.nodes["n1"].state_of("n3").generation == 2


def test_a_member_that_left_can_come_back_with_a_new_generation():
    cluster = SimulatedCluster(3)
    cluster.run(3)
    cluster.deliver("n3", cluster.nodes["n3"].leave())
    cluster.crash("n3")
    assert cluster.agreed({"n1", "n2"})
    cluster.start("n3")
    cluster.run(3)
    assert cluster.agreed({"n1", "n2", "n3"})


def test_a_forgotten_member_stops_counting_everywhere_and_its_life_never_counts_again():
    cluster = SimulatedCluster(4)
    cluster.run(3)
    cluster.crash("n4")
    cluster.run(4)
    assert cluster.nodes["n1"].forget("n4", cluster.now, settle=6.0) is None
    cluster.run(3)
    for node_id in ("n1", "n2", "n3"):
        assert cluster.nodes[node_id].known_members() == {"n1", "n2", "n3"}
        assert cluster.nodes[node_id].forgotten_members() == {"n4"}
    # The same life wakes (it was paused): it is told, and counts itself out; nobody counts it.
    cluster.running.add("n4")
    cluster.run(3)
    assert Forgotten("n4") in cluster.nodes["n4"].events()
    assert "n4" not in cluster.nodes["n4"].live_members()
    assert cluster.nodes["n4"].tick(cluster.now, cluster.rng) == []  # silent from now on
    assert cluster.nodes["n4"].known_members() == {"n1", "n2", "n3"}
    for node_id in ("n1", "n2", "n3"):
        assert cluster.nodes[node_id].known_members() == {"n1", "n2", "n3"}
    # A new life under the id is a member again.
    cluster.crash("n4")
    cluster.start("n4")
    cluster.run(3)
    assert cluster.agreed({"n1", "n2", "n3", "n4"})


def test_only_a_silent_member_is_forgotten_and_one_change_of_the_members_at_a_time():
    cluster = SimulatedCluster(5)
    cluster.run(3)
    n1 = cluster.nodes["n1"]
    assert "cannot forget itself" in n1.forget("n1", cluster.now, settle=6.0).reason
    assert "no member of that id" in n1.forget("n9", cluster.now, settle=6.0).reason
    assert "is alive" in n1.forget("n5", cluster.now, settle=6.0).reason
    cluster.crash("n4")
    cluster.crash("n5")
    cluster.run(4)
    # The members changed (n2..n5 joined) at most 7 s ago: not yet.
    refused = n1.forget("n5", cluster.now, settle=8.0)
    assert "one change at a time" in refused.reason and 0 < refused.retry_after <= 1.5
    assert n1.forget("n5", cluster.now, settle=6.0) is None
    refused = n1.forget("n5", cluster.now, settle=6.0)
    assert "gone already (forgotten)" in refused.reason and refused.retry_after == 0
    assert n1.forget("n4", cluster.now, settle=6.0).retry_after == 6.0
    cluster.run(3)
    # Elsewhere, the forget arrived with the gossip: the members changed there then.
    refused = cluster.nodes["n2"].forget("n4", cluster.now, settle=6.0)
    assert "one change at a time" in refused.reason
    cluster.run(4)
    assert cluster.nodes["n2"].forget("n4", cluster.now, settle=6.0) is None
    cluster.run(3)
    assert cluster.agreed({"n1", "n2", "n3"})
    assert all(cluster.nodes[n].known_members() == {"n1", "n2", "n3"} for n in ("n1", "n2"))


def test_partitions_split_the_views_and_healing_joins_them():
    cluster = SimulatedCluster(5)
    cluster.run(3)
    cluster.partition({"n1", "n2"}, {"n3", "n4", "n5"})
    cluster.run(6)
    views = cluster.views()
    assert views["n1"] == views["n2"] == {"n1", "n2"}
    assert views["n3"] == views["n4"] == views["n5"] == {"n3", "n4", "n5"}
    cluster.partition()
    cluster.run(4)
    assert cluster.agreed({"n1", "n2", "n3", "n4", "n5"})


def test_the_members_known_count_the_silent_ones_but_not_those_that_left():
    cluster = SimulatedCluster(5)
    cluster.run(3)
    cluster.deliver("n5", cluster.nodes["n5"].leave())
    cluster.crash("n5")
    cluster.partition({"n1", "n2"}, {"n3", "n4"})
    cluster.run(6)
    # The majority of the four left: n1 and n2 see two of four, so neither side has it.
    minority, other = cluster.nodes["n1"], cluster.nodes["n3"]
    assert minority.known_members() == other.known_members() == {"n1", "n2", "n3", "n4"}
    assert len(minority.live_members()) * 2 == len(minority.known_members())
    cluster.crash("n4")
    cluster.partition()
    cluster.run(6)
    assert set(cluster.nodes["n1"].live_members()) == {"n1", "n2", "n3"}  # three of four
    assert cluster.nodes["n1"].known_members() == {"n1", "n2", "n3", "n4"}


def test_one_way_partition_heals_through_third_parties():
    cluster = SimulatedCluster(3)
    cluster.run(3)
    # n1 cannot reach n3, but n2 relays n3's heartbeats: everyone keeps seeing everyone.
    cluster.blocked = {("n1", "n3"), ("n3", "n1")}
    cluster.run(10)
    assert cluster.agreed({"n1", "n2", "n3"})


def test_self_is_authoritative():
    node = Membership("a", "a", 5)
    node.receive(Gossip("b", (MemberState("a", "a", 5, 99, left=True),)), now=1.0)
    assert node.live_members() == {"a": "a"}
    assert node.events() == []


def test_stale_entries_are_ignored():
    node = Membership("a", "a", 1)
    node.receive(Gossip("b", (MemberState("b", "b", 1, 5),)), now=1.0)
    assert node.events() == [MemberUp("b", "b", 1)]
    node.receive(Gossip("c", (MemberState("b", "b", 1, 3),)), now=2.0)
    assert node.state_of("b").heartbeat == 5
    assert node.events() == []


def test_seeds_are_gossiped_to_while_alone():
    node = Membership("a", "addr-a", 1, seeds=["addr-a", "s1", "s2"])
    targets = [target for target, _ in node.tick(1.0, random.Random(0))]
    assert targets == ["s1", "s2"]  # never itself


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    count=st.integers(2, 6),
    drop=st.sampled_from([0.0, 0.1, 0.3]),
    crashed=st.integers(0, 2),
)
def test_after_faults_heal_every_live_node_agrees(seed, count, drop, crashed):
    cluster = SimulatedCluster(count, seed=seed)
    cluster.drop_rate = drop
    cluster.run(5)
    rng = random.Random(seed)
    victims = rng.sample(sorted(cluster.running - {"n1"}), min(crashed, count - 1))
    for victim in victims:
        cluster.crash(victim)
    cluster.run(5)
    cluster.drop_rate = 0.0
    cluster.run(cluster.down_after + 3)
    assert cluster.agreed(set(cluster.running))


def test_last_advanced_is_when_news_of_a_member_last_arrived():
    node = Membership("a", "a", 1)
    assert node.last_advanced("b") is None
    node.receive(Gossip("b", (MemberState("b", "b", 1, 1),)), now=2.0)
    node.receive(Gossip("c", (MemberState("b", "b", 1, 1),)), now=5.0)  # no news: same entry
    assert node.last_advanced("b") == 2.0
    node.receive(Gossip("b", (MemberState("b", "b", 1, 2),)), now=6.0)
    assert node.last_advanced("b") == 6.0
    assert node.last_advanced("a") is None


def test_news_of_a_member_twice_since_a_time_is_told_by_the_advance_before_the_last():
    """One advance after a link stalled may be a heartbeat the member sent the others just
    before it froze; two show a life that still runs (`Rpc._cut_off`)."""
    node = Membership("a", "a", 1)
    node.receive(Gossip("b", (MemberState("b", "b", 1, 1),)), now=2.0)
    node.receive(Gossip("c", (MemberState("b", "b", 1, 2),)), now=5.0)
    assert node.advanced_twice_at("b") == 2.0  # one advance since 2.5 is not two
    node.receive(Gossip("c", (MemberState("b", "b", 1, 3),)), now=5.5)
    assert node.advanced_twice_at("b") == 5.0
    assert node.advanced_twice_at("a") is None


def gossip_of(sender: str, *others: MemberState, generation: int = 1) -> Gossip:
    return Gossip(sender, (MemberState(sender, sender, generation, 5), *others))


def test_a_node_knows_the_cluster_once_it_heard_each_seed_and_every_member_they_named():
    node = Membership("n1", "n1", 1, seeds=["n2", "n3"])
    assert not node.knows_the_cluster()
    node.receive(gossip_of("n2", MemberState("n4", "n4", 1, 3)), 0.0)
    node.receive(gossip_of("n3"), 0.0)
    assert not node.knows_the_cluster()  # n4 was named, by n2, but not heard from itself
    node.receive(gossip_of("n4"), 0.1)
    assert node.knows_the_cluster()
    # A new life of n3 told of by another: its memory is not the one heard.
    node.receive(gossip_of("n2", MemberState("n3", "n3", 2, 0)), 0.2)
    assert not node.knows_the_cluster()
    node.receive(gossip_of("n3", generation=2), 0.3)
    assert node.knows_the_cluster()


def test_a_node_without_seeds_or_with_one_silent_never_knows_the_cluster():
    alone = Membership("n1", "n1", 1)
    alone.receive(gossip_of("n2"), 0.0)
    assert not alone.knows_the_cluster()  # whoever has it as a seed may not have spoken yet
    waiting = Membership("n1", "n1", 1, seeds=["n2", "n3"])
    waiting.receive(gossip_of("n2", MemberState("n3", "n3", 1, 7)), 0.0)
    assert not waiting.knows_the_cluster()  # n3 heard of, through n2 only


def test_members_that_said_goodbye_need_not_be_heard_from():
    node = Membership("n1", "n1", 1, seeds=["n2"])
    node.receive(gossip_of("n2", MemberState("n3", "n3", 1, 9, left=True)), 0.0)
    assert node.knows_the_cluster()


def test_seeds_of_no_member_known_count_as_voters_not_heard_of():
    node = Membership("n1", "n1", 1, seeds=["n1", "n2", "n3", "n4", "n5"])
    assert node.unknown_seeds() == 4  # its own address is no seed
    # n5, a new life, knows only itself: n2, n3 and n4 may still be voters.
    node.receive(gossip_of("n5"), 0.0)
    assert node.unknown_seeds() == 3
    # Named by another, heard from or not, a member is known; one that left, known as gone.
    node.receive(gossip_of("n2", MemberState("n3", "n3", 1, 4, left=True)), 0.1)
    assert node.unknown_seeds() == 1
