"""ZooKeeper (Debian's `zookeeper`, 3.8 on Debian 12): an ensemble of three servers on loopback,
each with its data directory on tmpfs, as our nodes keep no disk state. The client is `kazoo`
(threads), started at a follower, with the leader last in its list of hosts; its `Lock` and
`Semaphore` recipes, as their users take them."""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import logging
import shutil
import socket
from pathlib import Path

from tests.nodes import free_port

from .processes import Server, wait_for
from .workloads import CYCLE_LIMIT, SEMAPHORE_MAX, Run, Until, Workload, run_thread_workers

SERVERS = ("z1", "z2", "z3")
JAR = Path("/usr/share/java/zookeeper.jar")
READY_WITHIN = 60.0
HEAP = "-Xmx512m"
_MAIN = "org.apache.zookeeper.server.quorum.QuorumPeerMain"


class ZooKeeper:
    name = "zookeeper"

    def __init__(self) -> None:
        self.servers: dict[str, Server] = {}
        self.client_ports: dict[str, int] = {}
        self.version = ""
        # The follower the client starts at, chosen once the ensemble has a leader.
        self.client_member = ""

    def missing(self) -> str | None:
        if shutil.which("java") is None or not JAR.exists():
            return f"no `java` or no {JAR} (Debian's zookeeper package; `make bench` installs it)"
        if importlib.util.find_spec("kazoo") is None:
            return "no `kazoo` module (pip install -e '.[bench]')"
        return None

    def describe(self) -> str:
        return (
            f"ZooKeeper {self.version or '3.8'}, 3 servers, data on tmpfs; kazoo "
            f"{importlib.metadata.version('kazoo')} (threads), at a follower "
            f"({self.client_member or 'chosen at start'}), the leader last in its hosts"
        )

    def start(self, workdir: Path) -> None:
        self.client_ports = {name: free_port() for name in SERVERS}
        quorum = [
            f"server.{number}=127.0.0.1:{free_port()}:{free_port()}"
            for number in range(1, len(SERVERS) + 1)
        ]
        for number, name in enumerate(SERVERS, start=1):
            config = self._configure(workdir / name, number, self.client_ports[name], quorum)
            command = ["java", HEAP, "-cp", f"/etc/zookeeper/conf:{JAR}", _MAIN, str(config)]
            log = workdir / f"{name}.log"
            self.servers[name] = Server(name, command, log, cwd=workdir / name).start()
        wait_for(self._formed, READY_WITHIN, "ZooKeeper: a leader and two followers")
        answer = _four_letters(self.client_ports[SERVERS[0]], b"srvr")
        self.version = answer.split("version: ", 1)[1].split("-", 1)[0]  # 3.8.0-${mvngit...}
        leader = self.serving()
        self.client_member = next(name for name in SERVERS if name != leader)

    @staticmethod
    def _configure(directory: Path, number: int, client_port: int, quorum: list[str]) -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "myid").write_text(f"{number}\n")
        settings = [
            "tickTime=2000",
            "initLimit=10",
            "syncLimit=5",
            f"dataDir={directory}",
            f"clientPort={client_port}",
            "clientPortAddress=127.0.0.1",
            "admin.enableServer=false",
            "4lw.commands.whitelist=srvr",
            *quorum,
        ]
        config = directory / "zoo.cfg"
        config.write_text("\n".join(settings) + "\n")
        return config

    def _formed(self) -> bool:
        for server in self.servers.values():
            if not server.running():
                raise RuntimeError(f"ZooKeeper server {server.name} exited:\n{server.output()}")
        modes = sorted(self._modes().values())
        return modes == ["follower", "follower", "leader"]

    def _modes(self) -> dict[str, str]:
        """Each running server's mode (leader, follower), if it answers."""
        modes = {}
        for name in self.members():
            try:
                answer = _four_letters(self.client_ports[name], b"srvr")
            except OSError:
                continue
            for line in answer.splitlines():
                if line.startswith("Mode: "):
                    modes[name] = line.split(": ", 1)[1]
        return modes

    def members(self) -> dict[str, int]:
        return {name: server.pid for name, server in self.servers.items() if server.running()}

    def serving(self) -> str:
        leaders = [name for name, mode in self._modes().items() if mode == "leader"]
        if not leaders:
            raise RuntimeError("no ZooKeeper server says it leads")
        return leaders[0]

    def serving_role(self) -> str:
        return "the leader"

    def kill(self, member: str) -> None:
        self.servers[member].kill()

    def _hosts(self) -> str:
        leader = self.serving()
        order = sorted(SERVERS, key=lambda name: (name == leader, name != self.client_member))
        return ",".join(f"127.0.0.1:{self.client_ports[name]}" for name in order)

    def drive(self, workload: Workload, run: Run, until: Until, within: float) -> None:
        from kazoo.client import KazooClient

        # Its warnings of lost connections would cover the progress line; errors that reach
        # a worker are counted.
        logging.getLogger("kazoo").setLevel(logging.CRITICAL)
        client = KazooClient(hosts=self._hosts(), randomize_hosts=False)
        client.start(timeout=READY_WITHIN)
        try:
            if workload.shared_semaphore:
                recipes = [
                    client.Semaphore("/bench/semaphore", max_leases=SEMAPHORE_MAX)
                    for _ in range(workload.workers)
                ]
            else:
                recipes = [client.Lock(f"/bench/lock-{w}") for w in range(workload.workers)]
            cycles = [functools.partial(_cycle, recipe) for recipe in recipes]
            run_thread_workers(cycles, run, until, within)
        finally:
            client.stop()
            client.close()

    def stop(self) -> None:
        for server in self.servers.values():
            server.stop()
        self.servers = {}


class NotGranted(Exception):
    """An acquire that returned without the lock."""


def _cycle(recipe) -> None:
    if not recipe.acquire(timeout=CYCLE_LIMIT):
        raise NotGranted(recipe.path)
    recipe.release()


def _four_letters(port: int, command: bytes) -> str:
    """A server's answer to a four-letter command (`srvr`)."""
    with socket.create_connection(("127.0.0.1", port), timeout=2) as connection:
        connection.sendall(command)
        chunks = []
        while chunk := connection.recv(4096):
            chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")
