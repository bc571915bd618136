"""What a lock costs the cluster, counted in the simulator: one client acquires and releases one
mutex, one cycle after the other, connected to the member that owns the mutex's slot or to
another member, with the nodes at their `[cluster]` defaults. Per cycle: the messages nodes send
each other, by kind; the link frames that carry them and their bytes; the quorum writes; the
one-way network delays on the cycle's path (every byte takes `HOP` between any two places, so
a cycle's virtual time over `HOP` counts them); and the trio task steps of the nodes and the
client (each a trip through the scheduler, the part of a node's CPU that grows with the frames
and not with the rules). What the members do anyway in as much time (gossip, lease rounds) is
measured with no client and taken off.

    python -m simulations cost --nodes 3,5,7

docs/benchmarks.md gives the figures and what they mean for speed.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

import trio
import trio.testing

from sluicegate.client.client import Client
from sluicegate.cluster.ring import Ring, semaphore_key
from sluicegate.cluster.slots import member_for
from sluicegate.node.config import parse_config
from sluicegate.node.link_codec import LINK_CODEC
from sluicegate.node.links import Sequenced

from .cluster import count_link_frames
from .history import History
from .network import SimNetwork
from .run import _Cluster

HOP = 0.001
CYCLES = 200
WARM_UP = 20
IDLE = 10.0
CLIENT = "c0"
MUTEXES = [f"m{number}" for number in range(64)]
CONFIG = parse_config("[semaphores]\n" + "".join(f"{name} = 1\n" for name in MUTEXES))


@dataclass
class LinkCount:
    """What nodes sent on their links: frames, their bytes, and messages by kind."""

    frames: int = 0
    bytes: int = 0
    messages: Counter[str] = field(default_factory=Counter)

    def add(self, frame: bytes) -> None:
        self.frames += 1
        self.bytes += len(frame)
        self.messages.update(
            type(item).__name__ for item in LINK_CODEC.decode(frame) if type(item) is not Sequenced
        )


class TaskSteps(trio.abc.Instrument):
    """Counts the steps of every task in the run while `counting`."""

    def __init__(self) -> None:
        self.counting = False
        self.steps = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if self.counting:
            self.steps += 1


@dataclass(frozen=True)
class Cost:
    """A cycle's cost, per cycle, with the members' own traffic taken off."""

    nodes: int
    at_owner: bool
    messages: dict[str, float]
    frames: float
    bytes: float
    delays: float
    steps: float

    @property
    def writes(self) -> float:
        """Quorum writes: each goes to every other voter (all the members, here)."""
        return self.messages.get("Accept", 0.0) / (self.nodes - 1)


def measure(nodes: int, at_owner: bool) -> Cost:
    """The cost of a cycle with `nodes` members, the client at the mutex's owner or not."""
    trio._core._run._ALLOW_DETERMINISTIC_SCHEDULING = True  # type: ignore[misc]
    trio._core._run._r.seed(0)
    clock = trio.testing.MockClock(autojump_threshold=0)
    steps = TaskSteps()
    return trio.run(_measure, nodes, at_owner, steps, clock=clock, instruments=[steps])


async def _measure(nodes: int, at_owner: bool, steps: TaskSteps) -> Cost:
    network = SimNetwork()
    cluster = _Cluster(network, random.Random(0), CONFIG, History(), nodes)
    async with trio.open_nursery() as nursery:
        await cluster.boot(nursery)
        places = [*cluster.ids, CLIENT]
        for index, place in enumerate(places):
            for other in places[index + 1 :]:
                network.delay(place, other, HOP)
        mutex, node = _placed(cluster.ids, at_owner)
        idle = LinkCount()
        with count_link_frames(idle.add):
            steps.counting, steps.steps = True, 0
            await trio.sleep(IDLE)
            steps.counting, idle_steps = False, steps.steps

        async def open_websocket(url: str):
            return await network.open_websocket(CLIENT, url.split("//", 1)[1].split("/", 1)[0])

        client = Client(
            [f"ws://{node}:8000/ws"],
            expires_in=30,
            rng=random.Random(1),
            open_websocket=open_websocket,
        )
        async with client:
            for _ in range(WARM_UP):
                async with client.lock(mutex):
                    pass
            busy = LinkCount()
            started = trio.current_time()
            with count_link_frames(busy.add):
                steps.counting, steps.steps = True, 0
                for _ in range(CYCLES):
                    async with client.lock(mutex):
                        pass
                steps.counting = False
            took = trio.current_time() - started
        nursery.cancel_scope.cancel()
    background = took / IDLE
    kinds = set(busy.messages) | set(idle.messages)
    return Cost(
        nodes=nodes,
        at_owner=at_owner,
        messages={
            kind: (busy.messages[kind] - background * idle.messages[kind]) / CYCLES
            for kind in sorted(kinds)
        },
        frames=(busy.frames - background * idle.frames) / CYCLES,
        bytes=(busy.bytes - background * idle.bytes) / CYCLES,
        delays=took / CYCLES / HOP,
        steps=(steps.steps - background * idle_steps) / CYCLES,
    )


def _placed(members: list[str], at_owner: bool) -> tuple[str, str]:
    """A mutex, and the member the client talks to: its owner, or another member."""
    ring = Ring(members)
    mutex = MUTEXES[0]
    owner = member_for(ring, semaphore_key(mutex))
    assert owner is not None
    return mutex, owner if at_owner else next(m for m in members if m != owner)


def print_costs(sizes: list[int]) -> None:
    costs = [measure(nodes, at_owner) for nodes in sizes for at_owner in (True, False)]
    print(
        f"A lock cycle (acquire and release of a mutex, one client, {CYCLES} cycles one after "
        f"the other), per cycle; the members' own traffic over as long taken off"
    )
    print(
        f"  {'nodes':>5}  {'client at':<15} {'messages':>8} {'frames':>7} {'bytes':>7} "
        f"{'writes':>6} {'one-way delays':>14} {'task steps':>10}"
    )
    for cost in costs:
        where = "the owner" if cost.at_owner else "another member"
        print(
            f"  {cost.nodes:>5}  {where:<15} {sum(cost.messages.values()):>8.1f} "
            f"{cost.frames:>7.1f} {cost.bytes:>7.0f} {cost.writes:>6.1f} {cost.delays:>14.1f} "
            f"{cost.steps:>10.1f}"
        )
    print("messages by kind, per cycle")
    kinds = sorted({kind for cost in costs for kind in cost.messages})
    for cost in costs:
        where = "owner" if cost.at_owner else "other"
        shown = ", ".join(
            f"{kind} {cost.messages[kind]:.1f}"
            for kind in kinds
            if abs(cost.messages.get(kind, 0.0)) >= 0.05
        )
        print(f"  {cost.nodes} nodes, client at the {where}: {shown}")
