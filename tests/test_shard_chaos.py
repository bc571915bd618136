"""Seeded chaos for the sharded core: random operations while messages are delayed, reordered
between pairs and lost, members' views lag, and nodes die, restart empty, and join.

After every step no semaphore is held beyond its max by what the homes believe, unless an owner
counted a restore beyond max. Once the faults stop and time passes, the cluster settles: every
owner counts exactly what the homes hold, every waiter that fits is granted, and each peer lives
at its ring home only. A failure names its seed; `replay(seed)` runs one.
"""

from __future__ import annotations

import random

import pytest

from sluicegate.cluster.errors import SemaphoreError
from sluicegate.cluster.semaphores import SemaphoreConfig

from .shard_network import PULL_RETRY, SETTLE, TAKEOVER_GRACE, ShardNetwork

CONFIG = {
    "A": SemaphoreConfig(1, level=0),
    "B": SemaphoreConfig(2, level=1),
    "C": SemaphoreConfig(3, level=1),
    "D": SemaphoreConfig(4, level=2),
}
SEEDS = 400
STEPS = 250


def held_by_homes(net: ShardNetwork, confirmed_only: bool = True) -> dict[str, int]:
    """What the homes say their peers hold. A lock re-asserted after a takeover (from a replica
    that may be stale, so perhaps released since) counts once its owner confirmed it; an owner
    that confirms it beyond max counts a restore beyond max."""
    held = dict.fromkeys(CONFIG, 0)
    for node in net.nodes.values():
        for peer_id, name, count, waiting in node._peers.locks():
            unconfirmed = (peer_id, name) in node._due
            if not waiting and node.serves_peer(peer_id) and not (confirmed_only and unconfirmed):
                held[name] += count
    return held


def restores_beyond_max(net: ShardNetwork) -> int:
    return net.dead_restores + sum(n.restores_beyond_max for n in net.nodes.values())


class ChaosNetwork(ShardNetwork):
    dead_restores = 0

    def kill(self, node_id: str) -> None:
        self.dead_restores += self.nodes[node_id].restores_beyond_max
        super().kill(node_id)

    def start(self, node_id: str):
        if node_id in self.nodes:
            self.dead_restores += self.nodes[node_id].restores_beyond_max
        return super().start(node_id)


def step(net: ChaosNetwork, rng: random.Random, peers: list[int], names: list[str]) -> None:
    live = sorted(net.nodes)
    roll = rng.random()
    if roll < 0.12:
        node_id = rng.choice(live)
        try:
            peers.append(net.new_peer(node_id, expires_in=10_000))
        except SemaphoreError:
            pass
    elif roll < 0.40 and peers:
        peer_id = rng.choice(peers)
        node = net.nodes[rng.choice(live)]
        name = rng.choice(sorted(CONFIG))
        try:
            if rng.random() < 0.6:
                node.acquire(peer_id, name, rng.randint(1, 4), net.now)
            else:
                node.release_lock(peer_id, name)
        except SemaphoreError:
            pass  # not its home, a rule, or a node still taking over: all refused cleanly
        net.collect(node.node_id)
    elif roll < 0.43 and peers:
        node = net.nodes[rng.choice(live)]
        try:
            node.release_peer(rng.choice(peers))
        except SemaphoreError:
            pass
        net.collect(node.node_id)
    elif roll < 0.70:
        busy = [pair for pair, queue in net.queues.items() if queue]
        if busy:
            net.deliver_one(*rng.choice(busy))
    elif roll < 0.74:
        busy = [pair for pair, queue in net.queues.items() if queue]
        if busy:
            net.queues[rng.choice(busy)].popleft()  # lost
    elif roll < 0.80:
        net.send_replicas()
    elif roll < 0.86:
        # Links deliver or lose within a clock tick (a link silent for longer is a member
        # declared down): no message outlives a grace period.
        net.deliver_all()
        net.now += rng.choice([0.1, 0.5, 1.0, 2.5])
        for node_id, node in net.nodes.items():
            node.expire(net.now)
            net.collect(node_id)
    elif roll < 0.89 and len(live) > 1:
        net.kill(rng.choice(live))
        net.change_members(only=rng.sample(sorted(net.nodes), rng.randint(1, len(net.nodes))))
    elif roll < 0.91:
        node_id = rng.choice(names)
        net.start(node_id)  # restarts empty, or joins for the first time
        net.change_members(only=rng.sample(sorted(net.nodes), rng.randint(1, len(net.nodes))))
    elif roll < 0.95:
        net.change_members(only=[rng.choice(live)])  # one node catches up on the members


def replay(seed: int) -> None:
    rng = random.Random(seed)
    names = ["n1", "n2", "n3", "n4"]
    net = ChaosNetwork(CONFIG, names[:3], seed=seed)
    peers: list[int] = []
    for number in range(STEPS):
        step(net, rng, peers, names)
        if restores_beyond_max(net) == 0:
            held = held_by_homes(net)
            for name, config in CONFIG.items():
                assert held[name] <= config.max, (seed, number, name, held)
        for node in net.nodes.values():
            # The set the owners keep of semaphores in use agrees with the semaphores.
            leases = node._leases
            assert leases.any_in_use() == any(leases.in_use(n) for n in CONFIG), (seed, number)

    # The faults stop: everyone learns the members, and time passes. Clients restore the peers
    # taken over from replicas (they hear of it as an unknown peer), holding what their homes
    # say (no client here knows better).
    net.change_members()
    net.deliver_all()
    for node in net.nodes.values():
        for peer_id in node.peer_ids():
            if node._peers.is_provisional(peer_id):
                held = {
                    name: count
                    for _, name, count, waiting in node._peers.locks(iter([peer_id]))
                    if not waiting
                }
                node.restore(peer_id, held, net.now + 10_000)
    net.deliver_all()
    for _ in range(6):
        net.send_replicas()
        net.advance(max(PULL_RETRY, TAKEOVER_GRACE, SETTLE) + 3)
    held = held_by_homes(net, confirmed_only=False)
    for name, config in CONFIG.items():
        owner = net.owner(name)
        assert config.max - owner.remainder(name) == held[name], (seed, name)
        waiting = [
            count
            for node in net.nodes.values()
            for peer_id, lock, count, pending in node._peers.locks()
            if pending and lock == name
        ]
        if waiting:
            assert max(waiting) > owner.remainder(name), (seed, name, waiting)
    for node in net.nodes.values():
        for peer_id in node._peers.peer_ids():
            assert node.home_of(peer_id) == node.node_id, (seed, peer_id)


@pytest.mark.parametrize("first", range(0, SEEDS, 50))
def test_the_sharded_core_keeps_its_promises_under_seeded_chaos(first):
    for seed in range(first, first + 50):
        replay(seed)
