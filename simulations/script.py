"""Fault schedules written by hand, against real simulated nodes (those of simulations/run.py:
the node a process runs, over `SimNetwork`, under trio's `MockClock`).

A script is an async function of a `Stage`. It boots the cluster, finds the roles it needs at
run time (which node acts for a semaphore's slot, which would take it next, which homes a
client's peer), then plays its faults: as a list of timed steps,

    await stage.play([
        (0.0, "cut", o, b),            # both ways
        (0.0, "cut_one_way", o, d),    # o's packets to d are lost, d's to o arrive
        (0.0, "slow", o, c, 0.6),      # each way
        (1.5, "crash", x),
        (1.7, "start", x),
        (4.0, "heal"),
    ])

or step by step with the same verbs, and with hooks on what the nodes say: `on_write` (an
owner sends a write whose records a test picks) and `on_receive` (a node is handed a message
from another), whose actions run at that very moment, before any other task: crash a node
right after its acknowledgement reached the owner, cut a link as a write commits. What the
clients saw and what every life wrote, committed and gained go into a `History`, for the
checkers of simulations/checkers.py.

`run_script(script, seed)` runs one in a trio run of its own, seeded as a simulated run is: the
same script and seed give the same history.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager

import trio
import trio.testing

from sluicegate.client.client import Client
from sluicegate.cluster.replication import Accept
from sluicegate.cluster.ring import Ring, peer_key, semaphore_key
from sluicegate.cluster.slots import member_for, slot_of
from sluicegate.node.config import NodeConfig

from .faults import RECOVERY_LIMIT
from .history import History
from .network import SimNetwork
from .run import CONFIG, _Cluster
from .workload import EXPIRES_IN


class Stage:
    """A running cluster and the verbs of a fault schedule."""

    def __init__(self, cluster: _Cluster, nursery: trio.Nursery, seed: int) -> None:
        self.cluster = cluster
        self.network: SimNetwork = cluster.network
        self.history: History = cluster.history
        self.ids = cluster.ids
        self._nursery = nursery
        self._rng = random.Random(f"stage {seed}")

    # -- roles -----------------------------------------------------------------------------

    def slot(self, semaphore: str) -> int:
        return slot_of(semaphore_key(semaphore))

    def acting_for(self, slot: int) -> str | None:
        """The node that acts for `slot` now, if one does."""
        for node_id, node in self.cluster.nodes.items():
            ownership = self._ownership(node_id)
            if ownership is not None and ownership.acting(slot, node.clock.now()):
                return node_id
        return None

    def home_of(self, peer_id: int) -> str | None:
        return self.acting_for(slot_of(peer_key(peer_id)))

    def next_for(self, slot_key: bytes, without: str) -> str | None:
        """The member the ring names for the slot of `slot_key` once `without` is gone."""
        return member_for(Ring(set(self.ids) - {without}), slot_key)

    # -- faults ------------------------------------------------------------------------------

    def cut(self, a: str, b: str) -> None:
        self._note(f"cut {a}-{b}")
        self.network.cut(a, b)

    def cut_one_way(self, a: str, b: str) -> None:
        self._note(f"cut {a}->{b}")
        self.network.cut(a, b, both_ways=False)

    def uncut(self, a: str, b: str) -> None:
        self._note(f"uncut {a}-{b}")
        self.network.uncut(a, b)

    def slow(self, a: str, b: str, seconds: float) -> None:
        """Bytes between `a` and `b` take `seconds` each way (0: no longer)."""
        self._note(f"slow {a}-{b} {seconds:g}s")
        self.network.delay(a, b, seconds)

    def clog(self, a: str, b: str) -> None:
        self._note(f"clog {a}-{b}")
        self.network.hold(a, b)

    def release(self, a: str, b: str) -> None:
        self._note(f"release {a}-{b}")
        self.network.release(a, b)

    def crash(self, node_id: str) -> None:
        self._note(f"crash {node_id}")
        self.cluster.nodes[node_id].crash()
        self.history.down(node_id)

    async def start(self, node_id: str) -> None:
        """A new life of `node_id` (it crashed)."""
        self._note(f"start {node_id}")
        await self.cluster.start(self._nursery, node_id)

    def start_soon(self, node_id: str) -> None:
        """`start`, from a hook (which may not wait)."""
        self._nursery.start_soon(self.start, node_id)

    def heal(self) -> None:
        """Every cut, delay and clog between nodes ends; crashed nodes stay down."""
        self._note("heal")
        self.network.heal()
        for a in self.ids:
            for b in self.ids:
                if a < b:
                    self.network.delay(a, b, 0)
                    self.network.release(a, b)

    async def sleep(self, seconds: float) -> None:
        await trio.sleep(seconds)

    async def until_whole(self, limit: float = RECOVERY_LIMIT) -> bool:
        """Wait until every node serves and all agree on the members; False after `limit`."""
        with trio.move_on_after(limit):
            while not self.cluster.whole():
                await trio.sleep(0.1)
            self.history.whole()
            return True
        return False

    async def play(self, steps: list[tuple]) -> None:
        """Run `steps`, (at, verb, *arguments), `at` in seconds from now, in order of `at`."""
        began = trio.current_time()
        for at, verb, *arguments in sorted(steps, key=lambda step: step[0]):
            await trio.sleep_until(began + at)
            done = getattr(self, verb)(*arguments)
            if isinstance(done, Awaitable):
                await done

    # -- hooks -------------------------------------------------------------------------------

    def on_write(self, node_id: str, picks: Callable[[Accept], bool], action: Callable) -> None:
        """Call `action(write)` when the current life of `node_id` sends, as an owner, the
        first write that `picks`, before the write leaves."""
        ownership = self._ownership(node_id)
        outbox = ownership.outbox
        fired = []

        def watched():
            messages = outbox()
            for _, message in messages:
                if not fired and isinstance(message, Accept) and picks(message):
                    fired.append(message)
                    action(message)
            return messages

        ownership.outbox = watched

    def on_receive(
        self, node_id: str, picks: Callable[[str, object], bool], action: Callable
    ) -> None:
        """Call `action(sender, message)` once, when the current life of `node_id` is handed
        the first message of its slot ownership that `picks(sender, message)`, right after it
        handled it."""
        ownership = self._ownership(node_id)
        receive = ownership.receive
        fired = []

        def watched(sender, message, now):
            receive(sender, message, now)
            if not fired and picks(sender, message):
                fired.append(message)
                action(sender, message)

        ownership.receive = watched

    # -- clients -----------------------------------------------------------------------------

    @asynccontextmanager
    async def client(self, name: str, nodes: list[str]):
        """A client of the cluster that connects to `nodes` (in that order)."""

        async def open_websocket(url: str):
            address = url.split("//", 1)[1].split("/", 1)[0]
            return await self.network.open_websocket(name, address)

        client = Client(
            [f"ws://{node_id}:8000/ws" for node_id in nodes],
            expires_in=EXPIRES_IN,
            rng=random.Random(self._rng.getrandbits(64)),
            open_websocket=open_websocket,
        )
        async with client:
            yield client

    # -- internals ---------------------------------------------------------------------------

    def _ownership(self, node_id: str):
        node = self.cluster.nodes[node_id]
        return None if node.crashed else node.ownership

    def _note(self, text: str) -> None:
        self.history.note(text)


def run_script(
    script: Callable[[Stage], Awaitable[None]],
    seed: int = 0,
    nodes: int = 5,
    config: NodeConfig = CONFIG,
) -> History:
    """Boot `nodes` nodes, run `script` on them, and return the history."""
    trio._core._run._ALLOW_DETERMINISTIC_SCHEDULING = True  # type: ignore[misc]
    trio._core._run._r.seed(seed)
    return trio.run(
        _staged, script, seed, nodes, config, clock=trio.testing.MockClock(autojump_threshold=0)
    )


async def _staged(script, seed: int, nodes: int, config: NodeConfig) -> History:
    history = History()
    network = SimNetwork()
    cluster = _Cluster(network, random.Random(seed), config, history, nodes)
    async with trio.open_nursery() as nursery:
        await cluster.boot(nursery)
        await script(Stage(cluster, nursery, seed))
        nursery.cancel_scope.cancel()
    return history
