"""etcd (Debian's `etcd-server`, 3.4 on Debian 12): three members on loopback, each with its
data directory on tmpfs, as our nodes keep no disk state. The client is `aetcd` under asyncio,
connected to one follower: its lock as its users take it (`client.lock(key, ttl=60)`, a lease
granted per acquire), and for the semaphore, which aetcd lacks, etcd's own recipe for a mutex
(Go's `concurrency.Mutex`) counted up to 8: `EtcdSemaphore` below."""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import json
import shutil
import subprocess
import urllib.request
from pathlib import Path

import anyio

from tests.nodes import free_port

from .processes import Server, wait_for
from .workloads import SEMAPHORE_MAX, Run, Until, Workload, run_async_workers

MEMBERS = ("e1", "e2", "e3")
READY_WITHIN = 30.0
# aetcd's default: a lock's lease outlives any measurement here, so no expiry lands in one.
LOCK_TTL = 60
# The lease of each semaphore worker's keys, granted once per worker (a Go `Session`).
SESSION_TTL = 60


class Etcd:
    name = "etcd"

    def __init__(self) -> None:
        self.servers: dict[str, Server] = {}
        self.client_ports: dict[str, int] = {}
        # The follower the client talks to, chosen once the members agree on a leader.
        self.client_member = ""

    def missing(self) -> str | None:
        if shutil.which("etcd") is None:
            return "no `etcd` command (Debian's etcd-server package; `make bench` installs it)"
        if importlib.util.find_spec("aetcd") is None:
            return "no `aetcd` module (pip install -e '.[bench]')"
        return None

    def describe(self) -> str:
        return (
            f"etcd {_etcd_version()}, 3 members, data on tmpfs; aetcd "
            f"{importlib.metadata.version('aetcd')} under asyncio at a follower "
            f"({self.client_member or 'chosen at start'})"
        )

    def start(self, workdir: Path) -> None:
        peers = {name: free_port() for name in MEMBERS}
        self.client_ports = {name: free_port() for name in MEMBERS}
        cluster = ",".join(f"{name}=http://127.0.0.1:{port}" for name, port in peers.items())
        for name in MEMBERS:
            command = _member_command(
                name, workdir, self.client_ports[name], peers[name], cluster, workdir.name
            )
            self.servers[name] = Server(name, command, workdir / f"{name}.log").start()
        wait_for(self._healthy, READY_WITHIN, "etcd: three healthy members and a leader")
        leader = self.serving()
        self.client_member = next(name for name in MEMBERS if name != leader)

    def _healthy(self) -> bool:
        for server in self.servers.values():
            if not server.running():
                raise RuntimeError(f"etcd member {server.name} exited:\n{server.output()}")
        try:
            return all(_status(port)["leader"] != "0" for port in self.client_ports.values())
        except (OSError, ValueError, KeyError):
            return False

    def members(self) -> dict[str, int]:
        return {name: server.pid for name, server in self.servers.items() if server.running()}

    def serving(self) -> str:
        """The leader, as the members that answer name it."""
        names, leader = {}, None
        for name in self.members():
            try:
                status = _status(self.client_ports[name])
            except (OSError, ValueError):
                continue
            names[status["header"]["member_id"]] = name
            leader = status["leader"]
        if leader not in names:
            raise RuntimeError("no etcd member names a leader that answers")
        return names[leader]

    def serving_role(self) -> str:
        return "the leader"

    def kill(self, member: str) -> None:
        self.servers[member].kill()

    def drive(self, workload: Workload, run: Run, until: Until, within: float) -> None:
        anyio.run(self._drive, workload, run, until, within, backend="asyncio")

    async def _drive(self, workload: Workload, run: Run, until: Until, within: float) -> None:
        import aetcd

        port = self.client_ports[self.client_member]
        async with aetcd.Client(host="127.0.0.1", port=port) as client:
            with anyio.fail_after(READY_WITHIN):
                await client.status()  # connected before the clock starts
            if workload.shared_semaphore:
                semaphores = [
                    EtcdSemaphore(client, b"/bench/semaphore/", SEMAPHORE_MAX, worker)
                    for worker in range(workload.workers)
                ]
                cycles = [semaphore.cycle for semaphore in semaphores]
            else:
                keys = [b"/bench/lock-%d" % worker for worker in range(workload.workers)]
                cycles = [functools.partial(_lock_cycle, client, key) for key in keys]
            await run_async_workers(cycles, run, until, within)

    def stop(self) -> None:
        for server in self.servers.values():
            server.stop()
        self.servers = {}


def _member_command(
    name: str, workdir: Path, client_port: int, peer_port: int, cluster: str, token: str
) -> list[str]:
    client_url, peer_url = f"http://127.0.0.1:{client_port}", f"http://127.0.0.1:{peer_port}"
    return [
        "etcd",
        f"--name={name}",
        f"--data-dir={workdir / name}",
        f"--listen-client-urls={client_url}",
        f"--advertise-client-urls={client_url}",
        f"--listen-peer-urls={peer_url}",
        f"--initial-advertise-peer-urls={peer_url}",
        f"--initial-cluster={cluster}",
        "--initial-cluster-state=new",
        f"--initial-cluster-token={token}",
    ]


def _status(port: int) -> dict:
    """A member's status through its JSON gateway (member ids are decimal strings)."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v3/maintenance/status", data=b"{}", method="POST"
    )
    with urllib.request.urlopen(request, timeout=2) as response:
        return json.loads(response.read())


@functools.cache
def _etcd_version() -> str:
    done = subprocess.run(["etcd", "--version"], capture_output=True, text=True, timeout=10)
    return done.stdout.split("\n", 1)[0].rsplit(" ", 1)[-1]


class LockLost(Exception):
    """A release found the lock's key gone or another's."""


async def _lock_cycle(client, key: bytes) -> None:
    # Not `async with`: its __aenter__ goes on without the lock when `acquire` times out.
    lock = client.lock(key, ttl=LOCK_TTL)
    await lock.acquire(timeout=None)
    if not await lock.release():
        raise LockLost(key.decode())


class EtcdSemaphore:
    """A counting semaphore of `max` on etcd, etcd's mutex recipe counted up: a waiter puts its
    key under `prefix` with its worker's lease, reading the prefix in the same transaction, and
    holds once fewer than `max` keys created before its own remain, watching the prefix's
    deletes until then. First come, first served; a crashed holder's key goes with its lease."""

    def __init__(self, client, prefix: bytes, max: int, worker: int) -> None:
        self.client = client
        self.prefix = prefix
        self.max = max
        self.key = prefix + b"%d" % worker
        self.lease = None

    async def cycle(self) -> None:
        await self.acquire()
        await self.client.delete(self.key)

    async def acquire(self) -> None:
        from aetcd.rtypes import EventKind
        from aetcd.utils import prefix_range_end

        if self.lease is None:
            self.lease = await self.client.lease(SESSION_TTL)
        ops = self.client.transactions
        _, (put, keys) = await self.client.transaction(
            compare=[],
            success=[
                ops.put(self.key, b"", lease=self.lease),
                ops.get(self.prefix, prefix_range_end(self.prefix)),
            ],
            failure=[],
        )
        mine = put.response_put.header.revision
        ahead = {kv.key for _, kv in keys if kv.create_revision < mine}
        if len(ahead) < self.max:
            return
        deletes = await self.client.watch_prefix(
            self.prefix, start_revision=mine + 1, kind=EventKind.DELETE
        )
        try:
            async for event in deletes:
                ahead.discard(event.kv.key)
                if len(ahead) < self.max:
                    return
        finally:
            await deletes.cancel()
