"""One simulated run from one seed: a cluster of real nodes, clients, faults, and the history.

Everything random comes from `random.Random(seed)`, and trio's scheduler is seeded with it too
(`_ALLOW_DETERMINISTIC_SCHEDULING`, private: trio is pinned in pyproject.toml). The clock is
`trio.testing.MockClock` jumping ahead whenever every task waits. The same seed on the same commit
gives the same history, whatever PYTHONHASHSEED is, which `trace_hash` proves, as long as no other
thread of the process runs trio meanwhile: trio's scheduler draws from one random source per
process (the CLI runs nothing else).

A run: three nodes (or five) boot; four clients work (simulations/workload.py) for `DURATION`
virtual seconds while faults of the kinds the seed enabled come one at a time
(simulations/faults.py); then the fault in progress heals, the cluster must be whole again, the
clients leave, and the cluster must settle: every semaphore's whole count free again and granted
to a newcomer. The checkers (simulations/checkers.py) then judge the history.
"""

from __future__ import annotations

import hashlib
import logging
import random
import signal
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import trio
import trio.testing

from sluicegate.client.client import Client
from sluicegate.node.config import NodeConfig, parse_config

from . import workload
from .availability import Probe
from .checkers import check_history
from .clocks import SimClock
from .cluster import NODE, SimNode, describe, link_messages
from .faults import (
    DRIFTS,
    FAULTS,
    RECOVERY_LIMIT,
    Injector,
    extra_faults,
    step_times_of_day,
    times_of_day,
)
from .history import History
from .network import SimNetwork
from .workload import EXPIRES_IN, FencedResource

CONFIG = parse_config(
    """
[semaphores]
A = { max = 1, level = 0 }
B = { max = 3, level = 1 }

[rate_limits]
exact = { algorithm = "fixed_window", limit = 3, window = "1s" }
gossip = { algorithm = "fixed_window", limit = 5, window = "1s", mode = "gossip" }
leased = { algorithm = "token_bucket", capacity = 4, rate = 2, mode = "lease", term = "1s" }

[cluster]
down_after = "1s"
gossip_interval = "200ms"
lease = "2s"
rate_gossip_interval = "50ms"
"""
)
NODES = 3  # or 5 (`run --nodes 5`): minority and majority splits
CLIENTS = 4
CLIENT_IDS = [f"c{number}" for number in range(CLIENTS)]
DURATION = 30.0  # virtual seconds of workload
BOOT_TIMEOUT = 30.0
# Once the clients have left, every semaphore must be wholly free again within this long: a peer
# whose release was lost expires, owners' audits drop locks no home wants, grace periods end.
SETTLE_LIMIT = EXPIRES_IN + 10.0
PROBE_TIMEOUT = 5.0
# A run takes a few seconds of CPU; one that used this many is stuck without virtual time
# passing (the process's CPU time: a starved run is only slow).
LIVELOCK_AFTER = 120.0


@dataclass
class Outcome:
    seed: int
    trace_hash: str
    operations: int
    faults: Counter = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)
    trace: list[str] = field(default_factory=list)
    # Counts worth a look over many runs (stale writes rejected, messages repeated, ...).
    figures: Counter = field(default_factory=Counter)
    # With `availability`: (fault kind, seconds some semaphore was unserved, seconds until all
    # were served again for good) of every fault (simulations/availability.py).
    availability: list[tuple[str, float, float]] = field(default_factory=list)


def read_seeds(path: Path) -> list[int]:
    """The first number of every line that is not blank or a comment."""
    lines = path.read_text().splitlines()
    return [int(line.split()[0]) for line in lines if line.strip() and not line.startswith("#")]


def run_options(nodes: int, extra: tuple[str, ...], availability: bool) -> list[str]:
    """The options of `python -m simulations run` that run a seed with these settings."""
    options = ["--nodes", str(nodes)] if nodes != NODES else []
    options += ["--with", ",".join(extra)] if extra else []
    return options + (["--availability"] if availability else [])


REGRESSIONS = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Regressions:
    """Seeds of one regressions file that replay alike: how many nodes, which extra fault
    kinds, whether with the availability probe (it changes the history)."""

    source: str
    seeds: tuple[int, ...]
    nodes: int = NODES
    extra: tuple[str, ...] = ()
    availability: bool = False


def regressions() -> list[Regressions]:
    """Every seed that failed once, grouped as its file says it ran: regressions.txt (three
    nodes), -skew.txt (with skew and freezes), -five.txt (five nodes), and -deep.txt, whose
    rows give nodes and kinds each (`make deep` ran them with the availability probe)."""
    groups = [
        Regressions("regressions.txt", tuple(read_seeds(REGRESSIONS / "regressions.txt"))),
        Regressions(
            "regressions-skew.txt",
            tuple(read_seeds(REGRESSIONS / "regressions-skew.txt")),
            extra=("skew", "freeze"),
        ),
        Regressions(
            "regressions-five.txt", tuple(read_seeds(REGRESSIONS / "regressions-five.txt")), 5
        ),
    ]
    rows: dict[tuple[int, str], list[int]] = {}
    for line in (REGRESSIONS / "regressions-deep.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            seed, nodes, kinds = line.split()[:3]
            rows.setdefault((int(nodes), kinds), []).append(int(seed))
    for (nodes, kinds), seeds in sorted(rows.items()):
        source = f"regressions-deep.txt, {nodes} nodes with {kinds}"
        groups.append(Regressions(source, tuple(seeds), nodes, tuple(kinds.split(",")), True))
    return groups


def quiet_node_logs() -> None:
    """The nodes' own log lines (members down, restores) are the faults at work, not news."""
    logging.getLogger("sluicegate").setLevel(logging.CRITICAL)


def log_nodes() -> None:
    """Put the nodes' log lines, and every message a node receives on its links (but gossip of
    members and replication), in the history as notes: `run --trace --logs`. For one process."""

    class ToHistory(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            name = record.name.rsplit(".", 1)[-1]
            _running[0].note(f"{NODE.get()} {name}: {record.getMessage()}")

    logger = logging.getLogger("sluicegate")
    logger.setLevel(logging.DEBUG)
    logger.addHandler(ToHistory())
    logger.propagate = False
    link_messages(True)
    workload.Tap.logging = True


class Livelock(BaseException):
    """The run used `LIVELOCK_AFTER` seconds of CPU, where a seed takes a few: tasks keep
    running without virtual time passing (it passes only when every task waits). Counted in
    the process's CPU time, not the wall clock's, so that a run starved of the CPU by a busy
    machine is not taken for one. Not an `Exception`: the handlers that record a node's or a
    client's failed task and go on must not swallow it."""


def run_seed(
    seed: int, nodes: int = NODES, extra: tuple[str, ...] = (), availability: bool = False
) -> Outcome:
    """Run the simulation of `seed` on a cluster of `nodes` to its end (bounded in virtual
    time; and in real time, for a livelock would never end: then the outcome says so).
    `extra`: fault kinds of `EXTRA_FAULTS` the seed may enable too (simulations/faults.py);
    `availability`: measure it with a probe client (simulations/availability.py)."""
    trio._core._run._ALLOW_DETERMINISTIC_SCHEDULING = True  # type: ignore[misc]
    trio._core._run._r.seed(seed)
    clock = trio.testing.MockClock(autojump_threshold=0)

    def interrupt(signum, frame) -> None:
        raise Livelock(f"{LIVELOCK_AFTER:g} s of CPU used, and the run is not over")

    previous = signal.signal(signal.SIGPROF, interrupt)
    # Again every few seconds after the first, in case something swallowed it anyway.
    signal.setitimer(signal.ITIMER_PROF, LIVELOCK_AFTER, 5.0)
    try:
        return trio.run(_simulate, seed, nodes, tuple(extra), availability, clock=clock)
    except BaseException as error:
        if not _livelocked(error):
            raise
        trace = [*_running[0].lines(), f"{clock.current_time():10.4f} livelock"]
        return Outcome(
            seed=seed,
            trace_hash=hashlib.sha256("\n".join(trace).encode()).hexdigest()[:16],
            operations=_running[0].operations,
            violations=[f"[liveness] {clock.current_time():.4f}: livelock: {error}"],
            trace=trace,
        )
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, previous)


def _livelocked(error: BaseException | None) -> bool:
    """Did `Livelock` end the run? (Raised wherever the run was, maybe in trio's own code,
    which then raises `TrioInternalError` from it.)"""
    if error is None:
        return False
    if isinstance(error, Livelock):
        return True
    if isinstance(error, BaseExceptionGroup) and any(
        _livelocked(leaf) for leaf in error.exceptions
    ):
        return True
    # Both chains: trio raises its internal error from whatever it was handling, and the
    # alarm may have come while that was being handled (its context, not its cause).
    return any(_livelocked(linked) for linked in (error.__cause__, error.__context__))


# The history of the run in progress (for the report of a livelock, which ends it early).
_running: list[History] = [History()]


class _Cluster:
    def __init__(
        self,
        network: SimNetwork,
        rng: random.Random,
        config: NodeConfig,
        history: History,
        nodes: int,
        rates: dict[str, float] | None = None,
    ) -> None:
        """`rates`: the clock rate of each node whose clock is skewed (in all its lives)."""
        self.network = network
        self.rates = rates or {}
        self.rng = rng
        self.config = config
        self.history = history
        self.nodes: dict[str, SimNode] = {}
        self._generations: Counter = Counter()
        self._state_root: tempfile.TemporaryDirectory | None = None
        self.ids = [f"n{i}" for i in range(1, nodes + 1)]

    async def boot(self, nursery: trio.Nursery) -> None:
        """Run the network and start every node; return once the cluster is whole."""
        nursery.start_soon(self.network.run)
        for node_id in self.ids:
            await self.start(nursery, node_id)
        with trio.fail_after(BOOT_TIMEOUT):
            while not self.whole():
                await trio.sleep(0.1)
        self.history.note("cluster ready")
        self.history.whole()

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
            on_failure=self._failed,
            clock=SimClock(rate=self.rates.get(node_id, 1.0)),
            servers=self.history.servers,
            deciders=self.history.deciders,
            time_of_day=self.history.times_of_day.get(node_id),
            state_dir=self._state_dir(node_id),
        )
        self.nodes[node_id] = node
        await nursery.start(node.run)
        self.history.up(node_id)
        return node

    def _state_dir(self, node_id: str) -> Path | None:
        """Where `node_id` keeps its era and generation across lives, when its time of day is
        its own: without one, a node whose clock is behind would start lower eras and
        generations, as docs/cluster.md says (a limit of nodes without `state_dir`, not a
        fault for the checkers to find)."""
        if not self.history.times_of_day:
            return None
        if self._state_root is None:
            self._state_root = tempfile.TemporaryDirectory(prefix="sluicegate-sim-")
        directory = Path(self._state_root.name) / node_id
        directory.mkdir(exist_ok=True)
        return directory

    def close(self) -> None:
        if self._state_root is not None:
            self._state_root.cleanup()

    def fresh_id(self) -> str:
        """An id no life of this run has had: a new member's."""
        return f"n{len(self._generations) + 1}"

    def retire(self, node_id: str) -> None:
        """`node_id` left for good (a member that joined for a while): `whole` no longer
        waits for it."""
        del self.nodes[node_id]

    def _failed(self, node_id: str, text: str) -> None:
        self.history.failure(node_id, text)
        self.history.down(node_id)

    def urls(self) -> list[str]:
        return [f"ws://{node_id}:8000" for node_id in self.ids]

    def all_ready(self) -> bool:
        return all(
            not node.crashed and node.semaphores is not None and node.semaphores.ready
            for node in self.nodes.values()
        )

    def whole(self) -> bool:
        """Every node serves, and each sees every node's current life as a member."""
        if not self.all_ready():
            return False
        lives = {node_id: node.generation for node_id, node in self.nodes.items()}
        return all(node.membership.generations() == lives for node in self.nodes.values())

    def views(self) -> str:
        """Each node's state, for a report: crashed, or serving or not, and its members."""
        views = []
        for node_id, node in sorted(self.nodes.items()):
            if node.crashed:
                views.append(f"{node_id} down")
            else:
                ready = node.semaphores is not None and node.semaphores.ready
                members = ",".join(sorted(node.membership.generations()))
                views.append(f"{node_id} {'serves' if ready else 'serves not'}, sees {members}")
        return "; ".join(views)


async def _simulate(seed: int, nodes: int, extra: tuple[str, ...], availability: bool) -> Outcome:
    rng = random.Random(seed)
    history = _running[0] = History()
    network = SimNetwork(seed)
    ids = [f"n{i}" for i in range(1, nodes + 1)]
    extra_kinds, rates = extra_faults(seed, extra, ids)
    history.times_of_day, steps = times_of_day(seed, extra, ids, DURATION)
    if history.times_of_day:
        extra_kinds.append("wall")
    cluster = _Cluster(network, rng, CONFIG, history, nodes, rates)
    for node_id, rate in rates.items():
        history.note(
            f"clock of {node_id} runs at {rate:g} ({'drift' if rate in DRIFTS else 'skew'})"
        )
    for node_id, time_of_day in history.times_of_day.items():
        history.note(f"time of day of {node_id} is {time_of_day.offset:+.3f} s off")
    resource = FencedResource(history)
    async with trio.open_nursery() as nursery:
        await cluster.boot(nursery)
        nursery.start_soon(step_times_of_day, steps, cluster, history)

        kinds = [kind for kind in FAULTS if rng.random() < 0.5]
        if nodes > 3 and rng.random() < 0.5:
            kinds.append("split")  # with three nodes, a partition of one node is the split
        history.note("faults enabled: " + (", ".join(kinds + extra_kinds) or "none"))
        # Skew and the times of day are there all along.
        kinds += [kind for kind in extra_kinds if kind not in ("skew", "wall")]
        injector = Injector(
            cluster,
            CLIENT_IDS,
            history,
            kinds,
            random.Random(rng.getrandbits(64)),
            EXPIRES_IN,
            restart=lambda node_id: cluster.start(nursery, node_id),
        )
        faults_over = trio.Event()

        async def inject() -> None:
            try:
                if kinds:
                    await injector.run()
            finally:
                faults_over.set()

        async with trio.open_nursery() as clients:
            for name in CLIENT_IDS:
                clients.start_soon(
                    _client, name, network, cluster, history, resource, rng.getrandbits(64)
                )
            probe = Probe(network, cluster.ids, list(CONFIG.semaphores)) if availability else None
            if probe is not None:
                nursery.start_soon(probe.run)
            nursery.start_soon(inject)
            await trio.sleep(DURATION)
            injector.stop()
            with trio.move_on_after(RECOVERY_LIMIT + DURATION):
                await faults_over.wait()
            clients.cancel_scope.cancel()
        history.note("clients gone")
        if probe is not None:
            await probe.stop()
        # Whole at the last heal, it may not be now: a cut shorter than `down_after` counts a
        # member down just after the heal, from the silence it left. It must be whole again
        # within the same limit.
        with trio.move_on_after(RECOVERY_LIMIT):
            while not cluster.whole():
                await trio.sleep(0.1)
        if cluster.whole():
            await _settles(cluster, network, history, rng.getrandbits(64))
        elif not any(event.kind == "stuck" for event in history.events):
            history.stuck(
                f"the cluster is not whole {RECOVERY_LIMIT:g} s after the clients left: "
                f"{cluster.views()}"
            )
        nursery.cancel_scope.cancel()
    cluster.close()
    violations = check_history(history, CONFIG, EXPIRES_IN)
    trace = history.lines()
    unanswered = sum(1 for send in history.rate if send.answered is None)
    figures = Counter(
        {
            "rate requests sent": len(history.rate),
            "rate requests unanswered": unanswered,
            "writes applied": sum(1 for e in history.events if e.kind == "applied"),
            "stale writes rejected": sum(1 for e in history.events if e.kind == "rejected"),
            "messages repeated": network.duplicated,
            "messages repeated late": network.repeated_late,
        }
    )
    return Outcome(
        seed=seed,
        trace_hash=hashlib.sha256("\n".join(trace).encode()).hexdigest()[:16],
        operations=history.operations,
        faults=injector.fired
        + Counter({"skew": int("skew" in extra_kinds), "wall": int(bool(history.times_of_day))})
        + Counter({"wall:step": len(steps)}),
        violations=violations,
        trace=trace,
        figures=figures,
        availability=probe.by_fault(history.events) if probe is not None else [],
    )


async def _client(
    name: str,
    network: SimNetwork,
    cluster: _Cluster,
    history: History,
    resource: FencedResource,
    seed: int,
) -> None:
    try:
        await workload.client(name, network, cluster.urls(), history, resource, seed)
    except Exception as error:  # noqa: BLE001 (a client task that raised is a violation)
        history.failure(name, describe(error))


async def _settles(cluster: _Cluster, network: SimNetwork, history: History, seed: int) -> None:
    """Retries took effect once, and nothing leaked: with every client gone, each semaphore's
    whole count is free again within `SETTLE_LIMIT`, and a newcomer is granted all of it."""

    async def open_websocket(url: str):
        address = url.split("//", 1)[1].split("/", 1)[0]
        return await network.open_websocket("probe", address)

    probe = Client(
        [url + "/ws" for url in cluster.urls()],
        expires_in=EXPIRES_IN,
        rng=random.Random(seed),
        open_websocket=open_websocket,
    )
    deadline = trio.current_time() + SETTLE_LIMIT
    async with probe:
        for name, semaphore in CONFIG.semaphores.items():
            while True:  # asked at least once, also when another semaphore took all the time
                try:
                    left = await probe.remainder(name)
                except Exception as error:  # noqa: BLE001 (said in the report if it lasts)
                    left = type(error).__name__
                if left == semaphore.max or trio.current_time() >= deadline:
                    break
                await trio.sleep(0.25)
            if left != semaphore.max:
                history.stuck(
                    f"{name}: remainder {left} of {semaphore.max}, {SETTLE_LIMIT:g} s after the "
                    "clients left"
                )
                continue
            try:
                async with probe.lock(name, count=semaphore.max, timeout=PROBE_TIMEOUT):
                    history.note(f"probe granted all of {name}")
            except Exception as error:  # noqa: BLE001 (the report says what)
                history.stuck(
                    f"{name}: all {semaphore.max} of it free, yet not granted to a newcomer "
                    f"within {PROBE_TIMEOUT:g} s ({type(error).__name__})"
                )
