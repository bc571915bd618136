"""Start real node processes for tests and benchmarks: loopback only, every wait bounded."""

from __future__ import annotations

import os
import re
import resource
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import msgpack

STARTUP_TIMEOUT = 20.0
_LISTENING = re.compile(r"Listening on (https?://[^\s]+)")
_STALLS = re.compile(r"loop stalled (\d+) times for over \d+ ms, the longest (\d+) ms")


class NodeProcess:
    """One `python -m sluicegate.node` process on 127.0.0.1 unless another address is given,
    started with `--port 0` unless a port is given."""

    def __init__(
        self,
        config_text: str,
        port: int = 0,
        workdir: Path | None = None,
        args: list[str] | None = None,
        env: dict[str, str] | None = None,
        files: int | None = None,
        address: str = "127.0.0.1",
    ) -> None:
        """`files`: the most files the process may open (its soft and hard limit); `address`:
        a loopback address to bind (all of 127.0.0.0/8 is loopback on Linux)."""
        self.address = address
        self.args = list(args or [])
        self.files = files
        self.env = dict(env or {})
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="sluicegate-node-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.config_path = self.workdir / "node.toml"
        self.config_path.write_text(config_text, encoding="utf-8")
        self.port = port
        self.url: str | None = None
        self.process: subprocess.Popen | None = None
        self._log_path = self.workdir / "node.log"
        self._log_offset = 0

    def start(self) -> NodeProcess:
        self._log_offset = self._log_path.stat().st_size if self._log_path.exists() else 0
        log = open(self._log_path, "ab")
        env = dict(os.environ, SLUICEGATE_LOG=os.environ.get("SLUICEGATE_TEST_LOG", "INFO"))
        env.update(self.env)
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sluicegate.node",
                "-c",
                str(self.config_path),
                "--address",
                self.address,
                "--port",
                str(self.port),
                *self.args,
            ],
            stdout=log,
            stderr=log,
            cwd=self.workdir,
            env=env,
            preexec_fn=None if self.files is None else self._limit_files,
        )
        log.close()
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while time.monotonic() < deadline:
            match = _LISTENING.search(self.new_log())
            if match:
                self.url = match.group(1)
                self.port = int(self.url.rsplit(":", 1)[1])
                return self
            if self.process.poll() is not None:
                raise RuntimeError(f"node exited with {self.process.returncode}:\n{self.log()}")
            time.sleep(0.02)
        self.kill()
        raise RuntimeError(f"node did not listen within {STARTUP_TIMEOUT}s:\n{self.log()}")

    def _limit_files(self) -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (self.files, self.files))

    def open_files(self) -> int:
        assert self.process is not None
        return len(os.listdir(f"/proc/{self.process.pid}/fd"))

    def cpu_seconds(self) -> float:
        """User and system CPU time the process has used."""
        assert self.process is not None
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def rss_mb(self) -> float:
        assert self.process is not None
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise AssertionError("no VmRSS")

    def log(self) -> str:
        return self._log_path.read_text(encoding="utf-8", errors="replace")

    def new_log(self) -> str:
        """What this run of the process logged (a restart appends to the same file)."""
        return self.log()[self._log_offset :]

    def signal(self, signum: int) -> None:
        assert self.process is not None
        self.process.send_signal(signum)

    def wait(self, timeout: float = 10.0) -> int:
        assert self.process is not None
        return self.process.wait(timeout)

    def kill(self) -> None:
        """SIGKILL: the node loses all its memory at once."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def stop(self) -> int:
        """SIGTERM and wait; returns the exit code."""
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process else 0
        self.signal(signal.SIGTERM)
        try:
            return self.wait(10)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def restart(self) -> NodeProcess:
        """Start again on the same port (after kill or stop)."""
        return self.start()

    def __enter__(self) -> NodeProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.kill()


# Certificates made at test time (trustme), for nodes with TLS (tests/process/test_tls.py, bench/).


def node_files(ca, directory: Path, name: str = "node") -> dict[str, Path]:
    """A certificate for 127.0.0.1 that the `trustme.CA` `ca` signed, and its key, written to
    `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    issued = ca.issue_cert("127.0.0.1", "localhost")
    files = {"certificate": directory / f"{name}.pem", "key": directory / f"{name}-key.pem"}
    issued.cert_chain_pems[0].write_to_path(files["certificate"])
    for pem in issued.cert_chain_pems[1:]:
        pem.write_to_path(files["certificate"], append=True)
    issued.private_key_pem.write_to_path(files["key"])
    return files


def ca_file(ca, path: Path) -> Path:
    ca.cert_pem.write_to_path(path)
    return path


def tls_section(**paths: Path | str) -> str:
    return "[tls]\n" + "".join(f'{key} = "{value}"\n' for key, value in paths.items())


def refusal_to_start(config_text: str, workdir: Path, env: Mapping[str, str] | None = None) -> str:
    """What a node started with `config_text` says as it exits with 2 (a configuration it
    refuses); fails if it exits otherwise."""
    path = workdir / "node.toml"
    path.write_text(config_text, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "sluicegate.node", "-c", path, "--port", "0"],
        capture_output=True,
        text=True,
        timeout=STARTUP_TIMEOUT,
        env={"PATH": "", **(env or {})},
    )
    assert done.returncode == 2, done.stderr
    return done.stderr


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_healthy(url: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=1) as response:
                if response.status == 200:
                    return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def gauge(node: NodeProcess, name: str, **labels: str) -> float | None:
    """The value of a metric on a node's /metrics (with exactly these labels, if any, given in
    the order the exposition writes them: by name); None if absent or unreachable."""
    try:
        with urllib.request.urlopen(f"{node.url}/metrics", timeout=2) as response:
            text = response.read().decode()
    except OSError:
        return None
    if labels:
        name += "{" + ",".join(f'{key}="{value}"' for key, value in labels.items()) + "}"
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else None


def stalls_of(node: NodeProcess) -> tuple[int, float]:
    """The node's loop stalls over 50 ms, as it logged them (node/stall_watch.py): how many,
    and the longest in ms. After `node.stop()`, which logs the last of them."""
    count, longest = 0, 0.0
    for times, ms in _STALLS.findall(node.log()):
        count, longest = count + int(times), max(longest, float(ms))
    return count, longest


async def hello_and_peers(ws, count: int, expires_in: float = 600.0) -> list[int]:
    """On a fresh `/ws` connection (trio-websocket's): say hello, and make `count` peers in
    one frame; their ids."""
    await ws.send_message(msgpack.packb({"hello": 1}))
    await ws.get_message()
    frame = [{"id": i, "op": "new_peer", "expires_in": expires_in} for i in range(count)]
    await ws.send_message(msgpack.packb(frame))
    peers: list[int] = []
    while len(peers) < count:
        peers += [answer["ok"] for answer in msgpack.unpackb(await ws.get_message())]
    return peers


def is_ready(url: str, context: ssl.SSLContext | None = None) -> bool:
    """Does the node at `url` serve requests yet (`GET /ready` answers 200)? `context`: for a
    node with TLS, one that trusts its certificate (and shows a client's, if it asks)."""
    try:
        with urllib.request.urlopen(f"{url}/ready", timeout=2, context=context) as response:
            return response.status == 200
    except (urllib.error.HTTPError, OSError):
        return False


def wait_until(predicate, timeout: float, what: str) -> float:
    """Poll `predicate` until true; returns the seconds it took, fails after `timeout`."""
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"not within {timeout}s: {what}")
        time.sleep(0.05)
    return time.monotonic() - started


def not_ready(nodes: list[NodeProcess], context: ssl.SSLContext | None = None) -> str:
    """What the nodes that do not serve yet logged last, for a failure's report."""
    return "\n".join(
        f"{node.workdir.name} not ready; its log ends:\n"
        + "\n".join(node.new_log().splitlines()[-25:])
        for node in nodes
        if not is_ready(node.url, context)
    )


@contextmanager
def cluster_of(
    workdir: Path,
    config: str,
    env: Mapping[str, str],
    ids: tuple[str, ...] = ("n1", "n2", "n3"),
    configs: Mapping[str, str] | None = None,
    ready_within: float = 20.0,
    context: ssl.SSLContext | None = None,
) -> Iterator[list[NodeProcess]]:
    """Nodes `ids`, the first the seed of the others, each with `config` (or its own of
    `configs`), all ready (`context`: as for `is_ready`); killed when the block ends."""
    nodes: list[NodeProcess] = []
    try:
        for node_id in ids:
            join = ["--join", f"127.0.0.1:{nodes[0].port}"] if nodes else []
            text = (configs or {}).get(node_id, config)
            args = ["--node-id", node_id, *join]
            nodes.append(NodeProcess(text, workdir=workdir / node_id, args=args, env=dict(env)))
            nodes[-1].start()
        try:
            wait_until(
                lambda: all(is_ready(node.url, context) for node in nodes),
                ready_within,
                "all ready",
            )
        except AssertionError as timed_out:
            raise AssertionError(f"{timed_out}\n{not_ready(nodes, context)}") from None
        yield nodes
    finally:
        for node in nodes:
            node.kill()
