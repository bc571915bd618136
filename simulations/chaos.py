"""Chaos with real processes: three node processes behind a real HAProxy, client processes
locking and checking rate limits through it, and faults from the outside, one at a time:

* `kill`: SIGKILL a node, and start it again a moment later with the same id and port (so
  HAProxy's server line stays valid); it rejoins the others empty and pulls its share;
* `pause`: SIGSTOP a node, and SIGCONT it after less than a peer's expiry;
* `long_pause`: the same, for longer than a peer's expiry.

After each fault the cluster must be whole again within `RECOVERY_LIMIT` (every node serves,
`GET /ready`, and counts every node a member), or the run records "stuck" and injects no more.
At the end the clients stop, their journals (`simulations/chaos_client.py`) merge with the
faults and the node lives (`up` when a node process starts, `down` once it is killed) into one
history, and the simulation's own checkers judge it (`simulations/checkers.py`), rate limits
included. Every process stamps the history with the wall clock (`chaos_client.CLOCK`), the
clock the nodes decide their rate limits' windows on. The history has no `whole` events, so it
has no quiet times: the checks that need the order of events at a node to be certain (`fifo`,
and what a gossip node must have heard of) judge only simulations, whose messages take no time.
The run's directory keeps the node logs, the journals and the merged history (`history.txt`,
with wall-clock times to match the logs).

Everything runs on loopback, on free ports; every wait is bounded; every process started here
is killed in a `finally`. Real processes do not replay: a seed picks the faults, their victims
and lengths, and the clients' choices, not the timing.
"""

from __future__ import annotations

import os
import random
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from sluicegate.node.config import parse_config

from .chaos_client import CLOCK, CONNECTED, Journal, read_journal
from .checkers import check_history
from .history import Event, History
from .workload import RateSend

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.haproxy import HaproxyProcess  # noqa: E402
from tests.nodes import NodeProcess, gauge, is_ready  # noqa: E402

CONFIG_TEXT = """
[semaphores]
A = 1
B = 3

# As in simulations/run.py: the rate task of simulations/workload.py uses all three.
[rate_limits]
exact = { algorithm = "fixed_window", limit = 3, window = "1s" }
gossip = { algorithm = "fixed_window", limit = 5, window = "1s", mode = "gossip" }
leased = { algorithm = "token_bucket", capacity = 4, rate = 2, mode = "lease", term = "1s" }

[cluster]
down_after = "2s"
gossip_interval = "250ms"

"""
CONFIG = parse_config(CONFIG_TEXT)
NODE_IDS = ("n1", "n2", "n3")
CLIENTS = 3
TASKS_PER_CLIENT = 2
# A peer's expiry. Long enough that a heartbeat which meets a paused node still gets through
# elsewhere in time: HAProxy drops the paused node within about 2 s, the others take over its
# share after `down_after`, and a heartbeat may have been due just as the pause began.
EXPIRES_IN = 8.0
FAULT_KINDS = ("kill", "pause", "long_pause")
# How long each kind of fault lasts: down before the restart, or paused.
LASTING: dict[str, tuple[float, float]] = {
    "kill": (0.5, 3.0),
    "pause": (0.3, EXPIRES_IN * 0.6),
    "long_pause": (EXPIRES_IN * 1.1, EXPIRES_IN * 1.4),
}
GAP = (1.0, 3.0)  # seconds of calm between one fault's recovery and the next fault
BOOT_TIMEOUT = 60.0
CLIENT_START_TIMEOUT = 30.0
RECOVERY_LIMIT = 30.0  # real seconds after a heal until every node serves again, or "stuck"
CLIENT_STOP_TIMEOUT = 15.0
PROGRESS_EVERY = 1.0


@dataclass
class ChaosOutcome:
    seed: int
    duration: float = 0.0
    operations: int = 0
    faults: Counter = field(default_factory=Counter)
    # Locks refused, by error: timeouts are the workload's; others are answers to look at (a
    # node that woke from a long pause answers from its old state for a moment).
    refusals: Counter = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)
    # Counts that show what was judged: rate-limit requests sent, and those never answered.
    figures: Counter = field(default_factory=Counter)


class ChaosCluster:
    """The node processes and HAProxy of one run, their logs under `workdir`."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.env = {
            "SLUICEGATE_CLUSTER_SECRET": secrets.token_hex(16),
            "SLUICEGATE_TEST_LOG": os.environ.get("SLUICEGATE_TEST_LOG", "INFO"),
        }
        self.nodes: dict[str, NodeProcess] = {}
        self.balancer: HaproxyProcess | None = None

    def start(self) -> None:
        for node_id in NODE_IDS:
            join = ["--join", f"127.0.0.1:{self.nodes['n1'].port}"] if self.nodes else []
            node = NodeProcess(
                CONFIG_TEXT,
                workdir=self.workdir / node_id,
                args=["--node-id", node_id, *join],
                env=self.env,
            )
            self.nodes[node_id] = node
            node.start()
        # A restarted node (its port is fixed now) finds whichever others are up.
        for node_id, node in self.nodes.items():
            others = [f"127.0.0.1:{n.port}" for i, n in self.nodes.items() if i != node_id]
            node.args = ["--node-id", node_id, "--join", ",".join(others)]
        self.balancer = HaproxyProcess(
            [node.url for node in self.nodes.values()], workdir=self.workdir / "haproxy"
        ).start()

    @property
    def client_url(self) -> str:
        assert self.balancer is not None and self.balancer.url is not None
        return self.balancer.url.replace("http://", "ws://") + "/ws"

    def not_whole(self) -> list[str]:
        """Why the cluster is not whole yet: nodes that do not serve, or do not count every
        node a member (a node that just woke from a pause may still serve from its old view,
        but the others do not count it yet)."""
        reasons = []
        for node_id, node in self.nodes.items():
            if not is_ready(node.url):
                reasons.append(f"{node_id} not ready")
                continue
            members = gauge(node, "sluicegate_members_up")
            if members != len(self.nodes):
                reasons.append(f"{node_id} counts {members} members up")
        return reasons

    def died(self) -> list[str]:
        """Nodes whose process ended without being killed here (their log says why)."""
        return [
            f"{node_id} exited with {node.process.returncode}"
            for node_id, node in self.nodes.items()
            if node.process is not None and node.process.poll() is not None
        ]

    def kill_all(self) -> None:
        if self.balancer is not None:
            self.balancer.kill()
        for node in self.nodes.values():
            node.kill()  # SIGKILL ends a stopped process too


class ClientProcesses:
    """The client processes, and the events and rate-limit requests their journals hold so
    far."""

    def __init__(self, workdir: Path, url: str, rng: random.Random) -> None:
        self.workdir = workdir
        self.url = url
        self.seeds = {f"c{number}": rng.getrandbits(32) for number in range(CLIENTS)}
        self.processes: dict[str, subprocess.Popen] = {}
        self.events: dict[str, list[Event]] = {name: [] for name in self.seeds}
        # By client, each request by its number in the journal, in its last state.
        self.rate_sends: dict[str, dict[int, RateSend]] = {name: {} for name in self.seeds}
        self._read_up_to = dict.fromkeys(self.seeds, 0)

    def start(self) -> None:
        env = dict(
            os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
        )
        for name, seed in self.seeds.items():
            with open(self.workdir / f"{name}.log", "ab") as log:
                self.processes[name] = subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "simulations.chaos_client",
                        self.url,
                        f"--name={name}",
                        f"--seed={seed}",
                        f"--tasks={TASKS_PER_CLIENT}",
                        f"--expires-in={EXPIRES_IN}",
                        f"--journal={self._journal(name)}",
                    ],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    cwd=ROOT,
                    env=env,
                )

    def read(self) -> None:
        """Catch up with the journals: the whole lines written since the last time."""
        for name in self.seeds:
            path = self._journal(name)
            if not path.exists():
                continue
            with open(path, "rb") as journal:
                journal.seek(self._read_up_to[name])
                new = journal.read()
            whole = new[: new.rfind(b"\n") + 1]
            self._read_up_to[name] += len(whole)
            events, sends = read_journal(whole.decode("utf-8"))
            self.events[name].extend(events)
            self.rate_sends[name].update(sends)

    def connected(self) -> bool:
        return all(
            any(e.kind == "note" and e.detail.endswith(CONNECTED) for e in events)
            for events in self.events.values()
        )

    def operations(self) -> int:
        kinds = ("granted", "released", "refused")
        return sum(1 for events in self.events.values() for e in events if e.kind in kinds)

    def rate(self) -> list[RateSend]:
        """Every rate-limit request of every client, in the order sent."""
        sends = [send for sends in self.rate_sends.values() for send in sends.values()]
        return sorted(sends, key=lambda send: send.sent)

    def stop(self) -> list[str]:
        """SIGTERM each, and wait (bounded); what went wrong with any of them."""
        problems = []
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + CLIENT_STOP_TIMEOUT
        for name, process in self.processes.items():
            try:
                code = process.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)
                problems.append(f"client {name} did not stop within {CLIENT_STOP_TIMEOUT:g} s")
                continue
            if code != 0:
                problems.append(f"client {name} exited with {code} (see {name}.log)")
        self.read()
        return problems

    def kill_all(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.kill()
                process.wait(5)

    def _journal(self, name: str) -> Path:
        return self.workdir / f"{name}.jsonl"


def fault_plan(rng: random.Random) -> Iterator[tuple[str, str, float]]:
    """(kind, victim, seconds) for ever: the kinds in a fresh shuffled order every round, so
    every kind comes within the first three faults."""
    while True:
        kinds = list(FAULT_KINDS)
        rng.shuffle(kinds)
        for kind in kinds:
            yield kind, rng.choice(NODE_IDS), rng.uniform(*LASTING[kind])


class ChaosRun:
    """One run: set up, workload and faults for `duration` seconds, stop, check."""

    def __init__(
        self, duration: float, seed: int, progress: Callable[[str], None] = lambda line: None
    ) -> None:
        self.duration = duration
        self.rng = random.Random(seed)
        self.outcome = ChaosOutcome(seed)
        self.progress = progress
        self.workdir = Path(tempfile.mkdtemp(prefix="sluicegate-chaos-"))
        # The faults, in the same form as the clients' journals.
        self._faults_file = open(self.workdir / "faults.jsonl", "a", encoding="utf-8")
        self.history = Journal(self._faults_file)
        self.cluster = ChaosCluster(self.workdir)
        self.clients: ClientProcesses | None = None
        self._started = 0.0  # time.monotonic(), for the run's own timing
        self._started_at = 0.0  # the same moment on the history's clock
        self._last_progress = 0.0

    def run(self) -> ChaosOutcome:
        try:
            self._set_up()
            self._started, self._started_at = time.monotonic(), CLOCK()
            self._inject_faults()
            self.outcome.duration = time.monotonic() - self._started
            self._finish()
        finally:
            if self.clients is not None:
                self.clients.kill_all()
            self.cluster.kill_all()
            self._faults_file.close()
        return self.outcome

    def _set_up(self) -> None:
        self.cluster.start()
        for node_id in NODE_IDS:
            self.history.up(node_id)
        self._wait_for(lambda: not self.cluster.not_whole(), BOOT_TIMEOUT, "the cluster to boot")
        self.clients = ClientProcesses(self.workdir, self.cluster.client_url, self.rng)
        self.clients.start()
        self._wait_for(self.clients.connected, CLIENT_START_TIMEOUT, "the clients to connect")
        self.history.note("cluster ready, clients connected")

    def _inject_faults(self) -> None:
        plan = fault_plan(random.Random(self.rng.getrandbits(64)))
        while self._elapsed() < self.duration:
            self._pause_for(self.rng.uniform(*GAP))
            kind, victim, lasting = next(plan)
            # Only a fault that ends (its recovery aside) within the run.
            if self._elapsed() + lasting > self.duration:
                break
            self.outcome.faults[kind] += 1
            try:
                self._fault(kind, victim, lasting)
            except RuntimeError as error:  # a node that does not start again (its log says why)
                why = str(error).splitlines()[0]
                self.history.stuck(f"{victim} did not come back from {kind}: {why} (see its log)")
                break
            healed = time.monotonic()
            if not self._wait_until(lambda: not self.cluster.not_whole(), RECOVERY_LIMIT):
                why = ", ".join(self.cluster.not_whole())
                self.history.stuck(f"not whole {RECOVERY_LIMIT:g} s after {kind} healed: {why}")
                break
            self.history.note(f"whole again {time.monotonic() - healed:.1f} s after the heal")
        self._pause_for(max(self.duration - self._elapsed(), 0.0))

    def _fault(self, kind: str, victim: str, lasting: float) -> None:
        node = self.cluster.nodes[victim]
        self.history.fault(kind, victim, lasting)
        if kind == "kill":
            node.kill()
            self.history.down(victim)
            self._pause_for(lasting)
            self.history.up(victim)
            node.restart()  # same id, same port; bounded (tests/nodes.py STARTUP_TIMEOUT)
        else:
            node.signal(signal.SIGSTOP)
            try:
                self._pause_for(lasting)
            finally:
                node.signal(signal.SIGCONT)
        self.history.healed(kind, victim)

    def _finish(self) -> None:
        assert self.clients is not None
        problems = self.clients.stop()
        events = sorted(
            [*self.history.events, *(e for events in self.clients.events.values() for e in events)],
            key=lambda event: event.at,
        )
        merged = History(clock=CLOCK)
        merged.events = events
        merged.rate = self.clients.rate()
        self._write_trace(events)
        self.outcome.operations = self.clients.operations()
        self.outcome.figures = Counter(
            {
                "rate requests sent": len(merged.rate),
                "rate requests unanswered": sum(1 for s in merged.rate if s.answered is None),
            }
        )
        self.outcome.refusals = Counter(
            e.detail.split(":")[0] for e in events if e.kind == "refused"
        )
        self.outcome.violations = check_history(merged, CONFIG, EXPIRES_IN)
        self.outcome.violations += problems + self.cluster.died()
        # Times relative to the start of the workload read better than the wall clock's.
        self.outcome.violations = [_relative(v, self._started_at) for v in self.outcome.violations]

    def _write_trace(self, events: list[Event]) -> None:
        """The merged history, in `history.txt` beside the logs: seconds from the workload's
        start, and the time of day, as the node logs are stamped."""
        lines = []
        for e in events:
            wall = time.strftime("%H:%M:%S", time.localtime(e.at))
            fraction = f"{e.at % 1:.3f}"[1:]
            lines.append(
                f"{e.at - self._started_at:9.3f} {wall}{fraction} {e.kind:<8} {e.who:<6} "
                f"{e.semaphore} {e.count or ''}{'' if e.token is None else f' token={e.token}'}"
                f"{f' peer={e.peer_id}' if e.peer_id else ''} {e.detail}".rstrip()
            )
        (self.workdir / "history.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")

    # -- waiting, always bounded, with a progress line ---------------------------------------

    def _elapsed(self) -> float:
        return time.monotonic() - self._started

    def _pause_for(self, seconds: float) -> None:
        self._wait_until(lambda: False, seconds)

    def _wait_for(self, predicate: Callable[[], bool], timeout: float, what: str) -> None:
        if not self._wait_until(predicate, timeout):
            raise RuntimeError(f"timed out after {timeout:g} s waiting for {what}")

    def _wait_until(self, predicate: Callable[[], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            self._report()
            if predicate():
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(min(0.2, max(deadline - time.monotonic(), 0.0)))

    def _report(self) -> None:
        now = time.monotonic()
        if self.clients is None or now - self._last_progress < PROGRESS_EVERY:
            return
        self._last_progress = now
        self.clients.read()
        faults = sum(self.outcome.faults.values())
        elapsed = self._elapsed() if self._started else 0.0
        self.progress(
            f"{elapsed:4.0f}/{self.duration:g} s, {self.clients.operations()} operations, "
            f"{len(self.clients.rate())} rate requests, {faults} faults"
        )


def _relative(violation: str, started: float) -> str:
    """'[checker] 1234.5678: text' -> '[checker] 12.34 s: text', timed from the workload's
    start (a violation that does not start so is left as it is)."""
    head, sep, text = violation.partition(": ")
    checker, _, at = head.rpartition(" ")
    try:
        return f"{checker} {float(at) - started:.2f} s: {text}".lstrip() if sep else violation
    except ValueError:
        return violation
