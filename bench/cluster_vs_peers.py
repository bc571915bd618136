"""Our three-node cluster against the consensus systems users already run for locks: etcd and
ZooKeeper, three members each, on loopback, one system at a time (issue 39).

    python bench/cluster_vs_peers.py [--duration 5] [--rounds 3] [--idle 5]
                                     [--systems sluicegate,etcd,zookeeper]

Each round starts each system afresh (etcd's and ZooKeeper's data on tmpfs), warms it up, and
measures, with each system's own Python client in this process (bench/peers/):

* sequential: one worker acquires and releases one mutex in a loop: cycles/s and p50;
* 32 workers, each with a mutex of its own, on one client: cycles/s in all;
* a counting semaphore of 8 shared by 32 workers on one client: cycles/s;
* with each, the servers' CPU seconds per cycle (all three members' user and system time over
  the measurement, /proc/PID/stat) and this process's (the client's);
* idle: each member's CPU, in % of a core, over `--idle` seconds with no client;
* failover: one worker locks in a loop; after a second, the member serving the lock is killed
  with SIGKILL (ours: the owner of the lock's slot, the client talking to another member;
  etcd and ZooKeeper: the leader, the client talking to a follower). The longest time between
  two completed cycles, and the errors that reached the worker, until the worker has cycled
  again and `--duration` seconds have passed since the kill (30 s at most).

Then it prints each system's medians over the rounds, our ratios to each peer beside what
issue 39 aims at, and the load average taken before each system's round (figures from a busy
machine are not comparable). Every process it starts is stopped when it ends, on an error or a
Ctrl-C too. A system whose server or client library is missing is skipped, saying so.
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.peers import System  # noqa: E402
from bench.peers.etcd import Etcd  # noqa: E402
from bench.peers.processes import cpu_seconds, machine_busy_seconds  # noqa: E402
from bench.peers.sluicegate import Sluicegate  # noqa: E402
from bench.peers.workloads import (  # noqa: E402
    CYCLE_LIMIT,
    OWN_LOCKS,
    SEQUENTIAL,
    SHARED_SEMAPHORE,
    WORKLOADS,
    Run,
    Workload,
    for_seconds,
    recovered,
)
from bench.peers.zookeeper import ZooKeeper  # noqa: E402

SYSTEMS: dict[str, Callable[[], System]] = {
    "sluicegate": Sluicegate,
    "etcd": Etcd,
    "zookeeper": ZooKeeper,
}
OURS = "sluicegate"
WARM_UP = 1.0
# Seconds of cycles before a failover's kill.
LEAD = 1.0
# The most a failover waits for a cycle after the kill: past the 60 s lease of an etcd lock, so
# that a lock whose acquire was applied though its answer was lost is seen to come free.
FAILOVER_LIMIT = 90.0
# Between the last client closing and an idle measurement.
SETTLE = 1.0


@dataclass
class Measured:
    """One workload's figures in one round (seconds)."""

    rate: float
    p50: float
    server_cpu: float
    client_cpu: float
    # The cores that the machine's other processes kept busy meanwhile: how busy it was.
    others: float
    errors: Counter[str]


@dataclass
class Failover:
    # The member killed.
    victim: str
    # The longest time without a completed cycle, in seconds.
    gap: float
    # Did a cycle complete after the kill?
    recovered: bool
    errors: Counter[str]


@dataclass
class RoundFigures:
    load: tuple[float, float, float]
    workloads: dict[str, Measured] = field(default_factory=dict)
    # % of a core, by member.
    idle: dict[str, float] = field(default_factory=dict)
    failover: Failover | None = None


def server_cpu(pids: dict[str, int]) -> float:
    """CPU seconds the processes `pids` have used, those gone since counting nothing more."""
    total = 0.0
    for pid in pids.values():
        try:
            total += cpu_seconds(pid)
        except (OSError, IndexError, ValueError):
            pass
    return total


def measure(system: System, workload: Workload, duration: float) -> Measured:
    pids = system.members()
    started, machine = time.monotonic(), machine_busy_seconds()
    servers, client = server_cpu(pids), time.process_time()
    run = Run()
    system.drive(workload, run, for_seconds(duration), duration + CYCLE_LIMIT + 10)
    servers, client = server_cpu(pids) - servers, time.process_time() - client
    others = machine_busy_seconds() - machine - servers - client
    cycles = max(len(run.cycles), 1)
    return Measured(
        rate=run.rate(),
        p50=run.p50() if run.cycles else math.nan,
        server_cpu=servers / cycles,
        client_cpu=client / cycles,
        others=max(others, 0.0) / (time.monotonic() - started),
        errors=run.errors,
    )


def idle_shares(system: System, seconds: float) -> dict[str, float]:
    """Each member's CPU over `seconds` with no client, in % of a core."""
    time.sleep(SETTLE)
    pids = system.members()
    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    started = time.monotonic()
    time.sleep(seconds)
    elapsed = time.monotonic() - started
    return {name: 100 * (cpu_seconds(pid) - before[name]) / elapsed for name, pid in pids.items()}


def failover(system: System, after: float) -> Failover:
    victim = system.serving()
    run = Run()
    killer = threading.Thread(target=_kill_once_going, args=(system, victim, run), daemon=True)
    killer.start()
    try:
        within = LEAD + FAILOVER_LIMIT + CYCLE_LIMIT + 10
        system.drive(SEQUENTIAL, run, recovered(after, FAILOVER_LIMIT), within)
    finally:
        killer.join(LEAD + 15)
    killed_at = run.killed_at if run.killed_at is not None else math.inf
    went_on = any(end > killed_at for _, end in run.cycles)
    return Failover(victim, run.longest_gap(), went_on, run.errors)


def _kill_once_going(system: System, victim: str, run: Run) -> None:
    if run.began.wait(CYCLE_LIMIT + 30):
        time.sleep(LEAD)
        run.killed_at = time.monotonic()
        system.kill(victim)


def one_round(system: System, workdir: Path, args: argparse.Namespace, step) -> RoundFigures:
    figures = RoundFigures(load=os.getloadavg())
    step(f"starting (load average {figures.load[0]:.2f})")
    workdir.mkdir(parents=True)
    try:
        system.start(workdir)
        step("warming up")
        system.drive(OWN_LOCKS, Run(), for_seconds(WARM_UP), WARM_UP + CYCLE_LIMIT + 10)
        for workload in WORKLOADS:
            step(workload.name)
            figures.workloads[workload.name] = measure(system, workload, args.duration)
        step(f"idle for {args.idle:g} s")
        figures.idle = idle_shares(system, args.idle)
        step(f"failover: killing {system.serving_role()}")
        figures.failover = failover(system, args.duration)
    finally:
        system.stop()
    return figures


def median(values: list[float]) -> float:
    present = [value for value in values if not math.isnan(value)]
    return statistics.median(present) if present else math.nan


def workload_medians(rounds: list[RoundFigures], workload: Workload) -> dict[str, float]:
    measured = [r.workloads[workload.name] for r in rounds if workload.name in r.workloads]
    return {
        key: median([getattr(m, key) for m in measured])
        for key in ("rate", "p50", "server_cpu", "client_cpu", "others")
    }


def failover_gap(rounds: list[RoundFigures]) -> float:
    return median([r.failover.gap for r in rounds if r.failover is not None])


def print_system(system: System, rounds: list[RoundFigures]) -> None:
    print(f"\n{system.describe()}")
    if not rounds:
        print("  no round completed")
        return
    print(
        f"  {'medians of ' + str(len(rounds)) + ' round(s)':<28} {'cycles/s':>9} {'p50':>9}"
        f" {'server CPU/cycle':>17} {'client CPU/cycle':>17} {'errors':>7} {'others':>7}"
    )
    for workload in WORKLOADS:
        m = workload_medians(rounds, workload)
        errors = sum(sum(r.workloads[workload.name].errors.values()) for r in rounds)
        print(
            f"  {workload.name:<28} {m['rate']:>9.0f} {m['p50'] * 1000:>6.2f} ms"
            f" {m['server_cpu'] * 1000:>14.2f} ms {m['client_cpu'] * 1000:>14.2f} ms {errors:>7}"
            f" {m['others']:>7.2f}"
        )
    print("  (others: cores that other processes on the machine kept busy meanwhile)")
    members = sorted({name for r in rounds for name in r.idle})
    idle = ", ".join(f"{name} {median([r.idle[name] for r in rounds]):.1f}%" for name in members)
    print(f"  idle, of a core: {idle}")
    print_failover(system, rounds)
    print_errors(rounds)


def print_failover(system: System, rounds: list[RoundFigures]) -> None:
    failovers = [r.failover for r in rounds if r.failover is not None]
    each = ", ".join(f"{f.gap:.2f} s ({f.victim})" for f in failovers)
    print(
        f"  failover, {system.serving_role()} killed: longest gap {failover_gap(rounds):.2f} s;"
        f" each round: {each}"
    )
    stuck = sum(not f.recovered for f in failovers)
    if stuck:
        print(f"    in {stuck} round(s) no cycle completed within {FAILOVER_LIMIT:g} s of the kill")
    with_errors = sum(bool(f.errors) for f in failovers)
    print(f"    an error reached the worker in {with_errors} of {len(failovers)} round(s)")
    for error, count in sum((f.errors for f in failovers), Counter()).most_common(4):
        print(f"      {count} x {error}")


def print_errors(rounds: list[RoundFigures]) -> None:
    errors: Counter[str] = Counter()
    for r in rounds:
        for measured in r.workloads.values():
            errors += measured.errors
    for error, count in errors.most_common(4):
        print(f"    workload error, {count} x {error}")


@dataclass(frozen=True)
class Figure:
    """A figure compared between two systems: what it is, its unit, and issue 39's aim for the
    ratio ours / theirs (empty if it has none)."""

    name: str
    unit: str
    aim: str


def compared(rounds: list[RoundFigures]) -> dict[Figure, float]:
    """The figures ours are set against each peer's, with their medians over `rounds`."""
    medians = {w.name: workload_medians(rounds, w) for w in WORKLOADS}
    return {
        Figure("sequential", "cycles/s", ">= 2x"): medians[SEQUENTIAL.name]["rate"],
        Figure("sequential p50", "ms", "<= 0.5x"): medians[SEQUENTIAL.name]["p50"] * 1000,
        Figure("32 workers", "cycles/s", ">= 3x"): medians[OWN_LOCKS.name]["rate"],
        Figure("semaphore of 8", "cycles/s", ""): medians[SHARED_SEMAPHORE.name]["rate"],
        Figure("server CPU/cycle, sequential", "ms", ""): (
            medians[SEQUENTIAL.name]["server_cpu"] * 1000
        ),
        Figure("server CPU/cycle, 32 workers", "ms", ""): (
            medians[OWN_LOCKS.name]["server_cpu"] * 1000
        ),
        Figure("failover gap", "s", "ours <= 1.5 s"): failover_gap(rounds),
    }


def print_ratios(results: dict[str, list[RoundFigures]]) -> None:
    if not results.get(OURS):
        return
    ours = compared(results[OURS])
    for name, rounds in results.items():
        if name == OURS or not rounds:
            continue
        print(f"\n{OURS} / {name}, medians (issue 39's aim in brackets):")
        for figure, theirs in compared(rounds).items():
            aim = f"  [{figure.aim}]" if figure.aim else ""
            print(
                f"  {figure.name:<30} {ours[figure]:>8.2f} / {theirs:>8.2f} {figure.unit:<8}"
                f" = {ours[figure] / theirs:>5.2f}x{aim}"
            )


def print_loads(results: dict[str, list[RoundFigures]]) -> None:
    print("\nLoad average (1, 5, 15 min) before each system's round:")
    for name, rounds in results.items():
        loads = "; ".join(" ".join(f"{x:.2f}" for x in r.load) for r in rounds)
        print(f"  {name:<11} {loads}")


class Progress:
    """One line on stderr, rewritten in place on a terminal."""

    def __init__(self) -> None:
        self.in_place = sys.stderr.isatty()
        self.started = time.monotonic()

    def __call__(self, text: str) -> None:
        line = f"[{time.monotonic() - self.started:5.0f} s] {text}"
        if self.in_place:
            print(f"\r\033[K{line}", end="", file=sys.stderr, flush=True)
        else:
            print(line, file=sys.stderr, flush=True)

    def done(self) -> None:
        if self.in_place:
            print(file=sys.stderr, flush=True)
            self.in_place = False


def chosen_systems(names: str) -> list[System]:
    systems: list[System] = []
    for name in names.split(","):
        if name not in SYSTEMS:
            raise SystemExit(f"--systems: unknown {name!r}; choose from {', '.join(SYSTEMS)}")
        system = SYSTEMS[name]()
        lacking = system.missing()
        if lacking:
            print(f"Skipping {name}: {lacking}", file=sys.stderr)
        else:
            systems.append(system)
    return systems


def scratch_directory() -> Path:
    """On tmpfs where there is one: etcd's and ZooKeeper's data, and every process's log."""
    shm = Path("/dev/shm")
    where = shm if shm.is_dir() and os.access(shm, os.W_OK) else None
    if where is None:
        print("No writable /dev/shm: etcd's and ZooKeeper's data go to disk", file=sys.stderr)
    return Path(tempfile.mkdtemp(prefix="sluicegate-vs-peers-", dir=where))


def _step(progress: Progress, where: str, text: str) -> None:
    progress(f"{where}: {text}")


def run_all(systems: list[System], args: argparse.Namespace, workdir: Path, progress: Progress):
    results: dict[str, list[RoundFigures]] = {system.name: [] for system in systems}
    failures: list[str] = []
    for number in range(1, args.rounds + 1):
        for system in systems:
            step = functools.partial(_step, progress, f"round {number}/{args.rounds} {system.name}")
            try:
                figures = one_round(system, workdir / f"{system.name}-{number}", args, step)
            except Exception:
                failures.append(f"round {number}, {system.name}:\n{traceback.format_exc()}")
                continue
            results[system.name].append(figures)
    return results, failures


def interrupted(error: BaseException) -> bool:
    """Is `error` a Ctrl-C (or SIGTERM), alone or among a task group's errors?"""
    if isinstance(error, BaseExceptionGroup):
        return error.subgroup(KeyboardInterrupt) is not None
    return isinstance(error, KeyboardInterrupt)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; medians are printed")
    parser.add_argument("--idle", type=float, default=5.0, help="seconds of the idle reading")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated")
    args = parser.parse_args()

    # Ctrl-C and SIGTERM unwind through the `finally`s that stop the servers: a SIGTERM as a
    # SIGINT, which trio and asyncio turn into KeyboardInterrupt at a safe point (and which a
    # shell ignores in what it starts in the background, unless set back here).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: os.kill(os.getpid(), signal.SIGINT))
    systems = chosen_systems(args.systems)
    if not systems:
        raise SystemExit("nothing to run")
    workdir = scratch_directory()
    progress = Progress()
    keep = False
    try:
        results, failures = run_all(systems, args, workdir, progress)
        keep = bool(failures)
    except BaseException as error:
        if not interrupted(error):
            raise
        progress.done()
        raise SystemExit("Interrupted; every process it started is stopped.") from None
    finally:
        progress.done()
        if keep:
            print(f"Logs kept in {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)

    finished = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    print(
        f"Three members each on loopback, one system at a time; {args.rounds} rounds of "
        f"{args.duration:g} s per measurement; {os.cpu_count()} cores; finished {finished}"
    )
    for system in systems:
        print_system(system, results[system.name])
    print_ratios(results)
    print_loads(results)
    for failure in failures:
        print(f"\nFAILED {failure}", file=sys.stderr)
    if failures:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
