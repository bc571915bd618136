"""Our three-node cluster, started as the process tests start one (tests/nodes.py), at the
defaults of `[cluster]`, with our client under trio connected to a member that owns none of
the workloads' locks: every acquire and release crosses a node link to the slot's owner."""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path

import anyio

from sluicegate import client as sg
from sluicegate.cluster.ring import Ring, semaphore_key
from sluicegate.cluster.slots import SLOTS, member_for
from tests.nodes import NodeProcess, gauge, is_ready

from .processes import wait_for
from .workloads import OWN_LOCKS, SEMAPHORE_MAX, Run, Until, Workload, run_async_workers

NODES = ("n1", "n2", "n3")
# The client's node: it owns none of the locks below (the seed; any member would do).
CLIENT_NODE = "n1"
SECRET = {"SLUICEGATE_CLUSTER_SECRET": "bench-cluster-vs-peers"}
READY_WITHIN = 60.0


def names_not_owned_by(node: str, prefix: str, count: int) -> list[str]:
    """The first `count` semaphore names `prefix`0, `prefix`1, ... whose slot another member
    owns once all of NODES are members."""
    ring = Ring(NODES)
    names: list[str] = []
    number = 0
    while len(names) < count:
        name = f"{prefix}{number}"
        if member_for(ring, semaphore_key(name)) != node:
            names.append(name)
        number += 1
    return names


class Sluicegate:
    name = "sluicegate"

    def __init__(self) -> None:
        self.locks = names_not_owned_by(CLIENT_NODE, "lock-", OWN_LOCKS.workers)
        [self.semaphore] = names_not_owned_by(CLIENT_NODE, "semaphore-", 1)
        self.nodes: dict[str, NodeProcess] = {}

    def missing(self) -> str | None:
        return None

    def describe(self) -> str:
        return (
            f"sluicegate {_commit()}, 3 nodes, [cluster] defaults; our client under trio at "
            f"{CLIENT_NODE}, which owns none of the locks"
        )

    def start(self, workdir: Path) -> None:
        config = self._config()
        seed = self._node(config, workdir, NODES[0], [])
        for node_id in NODES[1:]:
            self._node(config, workdir, node_id, ["--join", f"127.0.0.1:{seed.port}"])
        nodes = list(self.nodes.values())
        wait_for(lambda: all(is_ready(node.url) for node in nodes), READY_WITHIN, "all ready")
        wait_for(
            lambda: sum(gauge(node, "sluicegate_slots_acting") or 0 for node in nodes) == SLOTS,
            READY_WITHIN,
            "every slot served",
        )

    def _config(self) -> str:
        lines = ["[semaphores]", *(f'"{name}" = 1' for name in self.locks)]
        lines.append(f'"{self.semaphore}" = {SEMAPHORE_MAX}')
        return "\n".join(lines) + "\n"

    def _node(self, config: str, workdir: Path, node_id: str, join: list[str]) -> NodeProcess:
        args = ["--node-id", node_id, *join]
        node = NodeProcess(config, workdir=workdir / node_id, args=args, env=SECRET)
        self.nodes[node_id] = node  # before it starts: a failed start is still stopped
        return node.start()

    def members(self) -> dict[str, int]:
        return {
            node_id: node.process.pid
            for node_id, node in self.nodes.items()
            if node.process is not None and node.process.poll() is None
        }

    def serving(self) -> str:
        owner = member_for(Ring(NODES), semaphore_key(self.locks[0]))
        assert owner is not None
        return owner

    def serving_role(self) -> str:
        return "the owner of the lock's slot"

    def kill(self, member: str) -> None:
        self.nodes[member].kill()

    def drive(self, workload: Workload, run: Run, until: Until, within: float) -> None:
        anyio.run(self._drive, workload, run, until, within, backend="trio")

    async def _drive(self, workload: Workload, run: Run, until: Until, within: float) -> None:
        if workload.shared_semaphore:
            names = [self.semaphore] * workload.workers
        else:
            names = self.locks[: workload.workers]
        # Connecting is bounded by the client's own patience (30 s).
        async with await sg.connect(f"ws://127.0.0.1:{self.nodes[CLIENT_NODE].port}") as client:
            cycles = [functools.partial(_cycle, client, name) for name in names]
            await run_async_workers(cycles, run, until, within)

    def stop(self) -> None:
        for node in self.nodes.values():
            try:
                node.stop()
            except subprocess.TimeoutExpired:
                pass  # stop() killed it
        self.nodes = {}


async def _cycle(client: sg.Client, name: str) -> None:
    async with client.lock(name):
        pass


@functools.cache
def _commit() -> str:
    try:
        done = subprocess.run(
            ["git", "describe", "--always", "--dirty"],
            capture_output=True,
            text=True,
            timeout=10,
            cwd=Path(__file__).resolve().parent,
        )
    except (OSError, subprocess.TimeoutExpired):
        return "(commit unknown)"
    return done.stdout.strip() or "(commit unknown)"
