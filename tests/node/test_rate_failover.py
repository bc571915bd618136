"""An exact-mode key whose owner fails, on three assembled nodes (`node/assembly.py`) over the
simulated network, under trio's virtual clock: the node that takes the key's slot decides the
key only from the state it adopted with the slot, whenever a check comes
(docs/cluster.md, "Rate limits in exact mode")."""

from __future__ import annotations

import random

import trio

from simulations.cluster import SimNode
from simulations.network import SimNetwork
from sluicegate.cluster.rate_limits import RateCheck
from sluicegate.cluster.ring import rate_key
from sluicegate.cluster.slots import slot_of
from sluicegate.node.config import parse_config
from sluicegate.node.rpc import Unavailable
from sluicegate.node.shard_actor import ShardActor

# A bucket that does not refill during the test: what goes is what it held.
CONFIG = parse_config(
    """
[rate_limits]
exact = { algorithm = "token_bucket", capacity = 5, rate = 0.0001 }

[cluster]
down_after = "1s"
gossip_interval = "200ms"
lease = "2s"
"""
)
IDS = ["n1", "n2", "n3"]
CHECK = RateCheck("exact", "k", 1)
SLOT = slot_of(rate_key("exact", "k"))


async def test_a_check_between_a_slots_takeover_and_its_adoption_is_not_decided(
    autojump_clock, monkeypatch
):
    """The successor acts for the slot once a quorum accepted its write, and adopts the slot's
    keys (spent: nothing was handed over) when the shard's changes are flushed, a moment later.
    A check that comes in that moment, as a client's task or a forwarded call may, is asked to
    come again, not decided from a state the slot never had."""
    network = SimNetwork()
    failures: list[str] = []
    nodes: dict[str, SimNode] = {}
    # What a check asked right after each message a node's shard applies would get.
    went, not_adopted_yet = [], []

    def probed(actor: ShardActor, sender: str, message: object) -> None:
        deliver(actor, sender, message)
        node = nodes.get(actor.node_id)
        if node is None or node.crashed or node.rate_limits is None:
            return
        service = node.rate_limits
        try:
            decided_here = service.serves_here(CHECK)
        except Unavailable:
            if actor.shard.ownership.acting(SLOT, node.clock.now()):
                not_adopted_yet.append(actor.node_id)
            return
        if decided_here and service.check_here(CHECK).go:
            went.append(actor.node_id)

    deliver = ShardActor.deliver
    async with trio.open_nursery() as nursery:
        nursery.start_soon(network.run)
        for number, node_id in enumerate(IDS):
            seeds = tuple(f"{other}:8000" for other in IDS if other != node_id)
            node = SimNode(
                node_id,
                CONFIG,
                network,
                random.Random(number),
                generation=1,
                join=seeds,
                on_failure=lambda node_id, text: failures.append(f"{node_id}: {text}"),
            )
            nodes[node_id] = node
            await nursery.start(node.run)
        with trio.fail_after(30):
            while not all(n.semaphores is not None and n.semaphores.ready for n in nodes.values()):
                await trio.sleep(0.1)
            asker = nodes["n1"]
            for _ in range(5):
                assert (await asker.rate_limits.call(CHECK)).go
            owner = next(n for n in nodes.values() if n.rate_limits.serves_here(CHECK))
            monkeypatch.setattr(ShardActor, "deliver", probed)
            owner.crash()
            survivors = [n for n in nodes.values() if n is not owner]
            successor = None
            while successor is None:
                await trio.sleep(0.05)
                for node in survivors:
                    try:
                        if node.rate_limits.serves_here(CHECK):
                            successor = node
                    except Unavailable:
                        pass
        decision = successor.rate_limits.check_here(CHECK)
        assert not decision.go and decision.retry_after > 1000  # spent: a token in 10,000 s
        nursery.cancel_scope.cancel()
    assert not failures
    assert went == []
    # The moment was there: the successor acted for the slot before it had adopted it.
    assert not_adopted_yet, "no check came between the takeover and the adoption"
