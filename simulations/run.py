"""One simulated run from one seed: a cluster of real nodes, clients, faults, and the history.

Everything random comes from `random.Random(seed)`, and trio's scheduler is seeded with it too
(`_ALLOW_DETERMINISTIC_SCHEDULING`, private: trio is pinned in pyproject.toml). The clock is
`trio.testing.MockClock` jumping ahead whenever every task waits. The same seed on the same commit
gives the same history, which `trace_hash` proves.
"""

from __future__ import annotations

import hashlib
import logging
import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import trio
import trio.testing

from sluicegate.client.client import Client
from sluicegate.client.websocket import handshake
from sluicegate.node.config import NodeConfig, parse_config

from .checkers import check_history
from .cluster import SimNode
from .history import History
from .network import SimNetwork

CONFIG = parse_config(
    """
[semaphores]
A = 1
B = 3

[cluster]
down_after = "1s"
gossip_interval = "200ms"
takeover_grace = "2s"
rate_gossip_interval = "50ms"
"""
)
NODES = 3
CLIENTS = 4
CLIENT_IDS = [f"c{number}" for number in range(CLIENTS)]
TASKS_PER_CLIENT = 2
DURATION = 30.0  # virtual seconds of workload
BOOT_TIMEOUT = 30.0
SETTLE = 15.0
# A cluster not whole again this long after a fault healed is a failure of its own.
RECOVERY_LIMIT = 20.0  # virtual seconds after the faults heal, before the last checks
EXPIRES_IN = 5.0


@dataclass
class Outcome:
    seed: int
    trace_hash: str
    operations: int
    faults: Counter = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)
    trace: list[str] = field(default_factory=list)


def read_seeds(path: Path) -> list[int]:
    """The first number of every line that is not blank or a comment."""
    lines = path.read_text().splitlines()
    return [int(line.split()[0]) for line in lines if line.strip() and not line.startswith("#")]


def quiet_node_logs() -> None:
    """The nodes' own log lines (members down, restores) are the faults at work, not news."""
    logging.getLogger("sluicegate").setLevel(logging.CRITICAL)


def run_seed(seed: int) -> Outcome:
    """Run the simulation of `seed` to its end (bounded in virtual time)."""
    trio._core._run._ALLOW_DETERMINISTIC_SCHEDULING = True  # type: ignore[misc]
    trio._core._run._r.seed(seed)
    clock = trio.testing.MockClock(autojump_threshold=0)
    return trio.run(_simulate, seed, clock=clock)


class _Cluster:
    def __init__(self, network: SimNetwork, rng: random.Random, config: NodeConfig) -> None:
        self.network = network
        self.rng = rng
        self.config = config
        self.nodes: dict[str, SimNode] = {}
        self._generations: Counter = Counter()
        self.ids = [f"n{i}" for i in range(1, NODES + 1)]

    async def start(self, nursery: trio.Nursery, node_id: str) -> SimNode:
        self._generations[node_id] += 1
        seeds = tuple(f"{other}:8000" for other in self.ids if other != node_id)
        node = SimNode(
            node_id,
            self.config,
            self.network,
            random.Random(self.rng.getrandbits(64)),
            generation=self._generations[node_id],
            join=seeds,
        )
        self.nodes[node_id] = node
        await nursery.start(node.run)
        return node

    def urls(self) -> list[str]:
        return [f"ws://{node_id}:8000" for node_id in self.ids]

    def all_ready(self) -> bool:
        return all(
            not node.crashed and node.semaphores is not None and node.semaphores.ready
            for node in self.nodes.values()
        )


async def _simulate(seed: int) -> Outcome:
    rng = random.Random(seed)
    history = History()
    network = SimNetwork()
    cluster = _Cluster(network, rng, CONFIG)
    faults: Counter = Counter()
    async with trio.open_nursery() as nursery:
        for node_id in cluster.ids:
            await cluster.start(nursery, node_id)
        with trio.fail_after(BOOT_TIMEOUT):
            while not cluster.all_ready():
                await trio.sleep(0.1)
        history.note("cluster ready")

        kinds = [kind for kind in FAULTS if rng.random() < 0.5]
        history.note("faults enabled: " + (", ".join(kinds) or "none"))
        async with trio.open_nursery() as workload:
            for name in CLIENT_IDS:
                workload.start_soon(_client, name, cluster, history, rng.getrandbits(64))
            if kinds:
                workload.start_soon(_inject_faults, nursery, cluster, history, kinds, faults)
            await trio.sleep(DURATION)
            workload.cancel_scope.cancel()
        nursery.cancel_scope.cancel()
    violations = check_history(history, CONFIG, EXPIRES_IN)
    trace = history.lines()
    return Outcome(
        seed=seed,
        trace_hash=hashlib.sha256("\n".join(trace).encode()).hexdigest()[:16],
        operations=history.operations,
        faults=faults,
        violations=violations,
        trace=trace,
    )


FAULTS = ("crash", "partition", "one_way", "client_cut")
# A lock body lasts up to `SHORT_HOLD` seconds, or, one time in `LONG_HOLD_ONE_IN`, longer than
# a peer's expiry: heartbeats alone keep it.
SHORT_HOLD = 0.5
LONG_HOLD = (EXPIRES_IN * 0.6, EXPIRES_IN * 1.6)
LONG_HOLD_ONE_IN = 10


async def _inject_faults(
    nursery: trio.Nursery, cluster: _Cluster, history: History, kinds: list[str], fired: Counter
) -> None:
    """One fault at a time, until the workload ends: each healed, and the cluster whole again
    (every node serving its share), before the next."""
    rng = random.Random(cluster.rng.getrandbits(64))
    while True:
        await trio.sleep(rng.uniform(1.0, 4.0))
        kind = rng.choice(kinds)
        victim = rng.choice(CLIENT_IDS if kind == "client_cut" else cluster.ids)
        others = [node_id for node_id in cluster.ids if node_id != victim]
        lasting = rng.uniform(0.5, 6.0)
        fired[kind] += 1
        history.fault(kind, victim, lasting)
        if kind == "crash":
            cluster.nodes[victim].crash()
            await trio.sleep(lasting)
            await cluster.start(nursery, victim)
        else:
            for other in others:
                cluster.network.cut(victim, other, both_ways=kind != "one_way")
            await trio.sleep(lasting)
            cluster.network.heal()
        history.healed(kind, victim)
        healed = trio.current_time()
        while not cluster.all_ready():
            if trio.current_time() > healed + RECOVERY_LIMIT:
                history.stuck(f"not every node serves {RECOVERY_LIMIT:g} s after the heal")
                return
            await trio.sleep(0.1)


async def _client(name: str, cluster: _Cluster, history: History, seed: int) -> None:
    rng = random.Random(seed)

    async def open_websocket(url: str):
        address = url.split("//", 1)[1].split("/", 1)[0]
        stream = await cluster.network.connect(name, address)
        return await handshake(stream, address, "/ws")

    urls = cluster.urls()
    rng.shuffle(urls)
    client = Client(
        [url + "/ws" for url in urls],
        expires_in=EXPIRES_IN,
        rng=random.Random(rng.getrandbits(64)),
        open_websocket=open_websocket,
    )
    async with client:
        async with trio.open_nursery() as tasks:
            for number in range(TASKS_PER_CLIENT):
                tasks.start_soon(
                    _locker, f"{name}.{number}", client, history, random.Random(rng.getrandbits(64))
                )


async def _locker(name: str, client: Client, history: History, rng: random.Random) -> None:
    while True:
        semaphore, count = rng.choice([("A", 1), ("B", 1), ("B", 2)])
        try:
            async with client.lock(semaphore, count=count, timeout=10) as lease:
                history.granted(name, semaphore, count, lease.fencing_token, lease.peer_id)
                try:
                    long = rng.randrange(LONG_HOLD_ONE_IN) == 0
                    await trio.sleep(
                        rng.uniform(*LONG_HOLD) if long else rng.uniform(0, SHORT_HOLD)
                    )
                finally:
                    history.released(name, semaphore, count, lease.lost)
        except Exception as error:  # noqa: BLE001 (every refusal is part of the history)
            history.refused(name, semaphore, type(error).__name__)
        await trio.sleep(rng.uniform(0, 0.2))
