"""What each member of a three-node cluster spends, by member: on a sequential lock cycle, or
idle. The cluster of `bench/cluster_vs_peers.py` (the client at n1, the lock's owner another).

    .venv/bin/python bench/cluster_cpu.py                 # 10 s of locking, 3 rounds in turn
    .venv/bin/python bench/cluster_cpu.py --workers 32    # 32 workers, a lock each
    .venv/bin/python bench/cluster_cpu.py --calls         # and the Python calls a cycle
    .venv/bin/python bench/cluster_cpu.py --idle 25       # each member idle, % of a core

Locking, each member's user and system CPU a cycle, the share of a core it kept busy, and its
voluntary context switches (from `/proc/PID/stat` and `/proc/PID/status`), and its trio task
steps and scheduler passes a cycle: the nodes start with a `sitecustomize.py` of this script's
making on their `PYTHONPATH`, which adds a trio instrument on SIGUSR1 and writes its counts on
SIGUSR2, sent around the locking. With `--calls`, the same signals run `cProfile` in each node
too: the function calls a cycle (a count the machine's other work moves far less than times:
only the members' own background work, by the second, counts with it; cProfile slows the nodes,
so the other figures of such a run are not comparable).
Linux only (`/proc`).
"""

from __future__ import annotations

import argparse
import json
import os
import pstats
import signal
import sys
import tempfile
import time
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.cluster_profile import lock_loop  # noqa: E402
from bench.cluster_vs_peers import WARM_UP  # noqa: E402
from bench.peers.sluicegate import CLIENT_NODE, Sluicegate  # noqa: E402
from bench.peers.workloads import (  # noqa: E402
    CYCLE_LIMIT,
    OWN_LOCKS,
    Run,
    Workload,
    for_seconds,
)

COUNTING = """
import collections, json, os, signal

class _Steps:
    def __init__(self):
        self.tasks = collections.Counter()
        self.passes = 0

    def before_task_step(self, task):
        self.tasks[task.name] += 1

    def after_io_wait(self, timeout):
        self.passes += 1

_counting = []
_profiles = []

def _start(*_):
    import trio
    _counting.append(_Steps())
    trio.lowlevel.add_instrument(_counting[-1])
    if os.environ.get("CLUSTER_CPU_CALLS"):
        import cProfile
        _profiles.append(cProfile.Profile())
        _profiles[-1].enable()

def _stop(*_):
    import trio
    steps = _counting.pop()
    trio.lowlevel.remove_instrument(steps)
    out_dir = os.environ["CLUSTER_CPU_OUT"]
    if _profiles:
        profile = _profiles.pop()
        profile.disable()
        profile.dump_stats(os.path.join(out_dir, f"{os.getpid()}.prof"))
    with open(os.path.join(out_dir, f"{os.getpid()}.json"), "w") as out:
        json.dump({"passes": steps.passes, "tasks": steps.tasks}, out)

if os.environ.get("CLUSTER_CPU_OUT"):
    signal.signal(signal.SIGUSR1, _start)
    signal.signal(signal.SIGUSR2, _stop)
"""


def usage(pid: int) -> tuple[float, float, int]:
    """User and system CPU seconds, and voluntary context switches, of process `pid`."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    switches = next(int(line.split()[1]) for line in status if line.startswith("voluntary_ctxt"))
    return int(fields[11]) / tick, int(fields[12]) / tick, switches


def drive_workers(system: Sluicegate, workers: int, seconds: float) -> tuple[int, float]:
    """`workers` workers on one client, each locking a lock of its own, as
    `bench/cluster_vs_peers.py` drives them: the cycles and the seconds they took."""
    workload = Workload(f"{workers} workers, own lock each", workers, shared_semaphore=False)
    run = Run()
    system.drive(workload, run, for_seconds(seconds), seconds + CYCLE_LIMIT + 10)
    for error, count in run.errors.items():
        print(f"  {count} x {error}")
    return len(run.cycles), run.ended - run.started


def locking(system: Sluicegate, out: Path, seconds: float, workers: int) -> None:
    pids = system.members()
    url = f"ws://127.0.0.1:{system.nodes[CLIENT_NODE].port}"
    if workers > 1:  # the workers' peers made, as bench/cluster_vs_peers.py warms up
        drive_workers(system, workers, WARM_UP)
    before = {node: usage(pid) for node, pid in pids.items()}
    for pid in pids.values():
        os.kill(pid, signal.SIGUSR1)
    client_before = os.times()
    if workers == 1:
        cycles, took = anyio.run(lock_loop, url, system.locks[0], seconds, backend="trio")
    else:
        cycles, took = drive_workers(system, workers, seconds)
    client_after = os.times()
    for pid in pids.values():
        os.kill(pid, signal.SIGUSR2)
    after = {node: usage(pid) for node, pid in pids.items()}
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not all(
        (out / f"{pid}.json").exists() for pid in pids.values()
    ):
        time.sleep(0.05)
    owner = system.serving() if workers == 1 else f"a member other than {CLIENT_NODE}"
    print(f"  {cycles / took:.0f} cycles/s with {workers} worker(s), the lock's owner {owner}")
    print(
        f"  the client (this process): user"
        f" {1000 * (client_after.user - client_before.user) / cycles:.2f} ms, system"
        f" {1000 * (client_after.system - client_before.system) / cycles:.2f} ms a cycle"
    )
    for node, pid in pids.items():
        user, system_cpu, switches = (a - b for a, b in zip(after[node], before[node], strict=True))
        counts = json.loads((out / f"{pid}.json").read_text())
        steps = sum(counts["tasks"].values())
        print(
            f"  {node}: user {1000 * user / cycles:.2f} ms, system {1000 * system_cpu / cycles:.2f}"
            f" ms ({100 * (user + system_cpu) / took:.0f} % of a core), {switches / cycles:.1f}"
            f" switches, {steps / cycles:.1f} task steps, {counts['passes'] / cycles:.1f}"
            " scheduler passes a cycle"
        )
        profile = out / f"{pid}.prof"
        if profile.exists():
            calls = sum(row[1] for row in pstats.Stats(str(profile)).stats.values())
            print(f"    {calls / cycles:.0f} Python function calls a cycle")
        busiest = sorted(counts["tasks"].items(), key=lambda item: -item[1])[:3]
        print("    " + ", ".join(f"{n / cycles:.1f} {task}" for task, n in busiest))


def idle(system: Sluicegate, seconds: float) -> None:
    pids = system.members()
    time.sleep(5.0)  # past the start's own traffic
    before = {node: usage(pid) for node, pid in pids.items()}
    started = time.monotonic()
    time.sleep(seconds)
    took = time.monotonic() - started
    for node, pid in pids.items():
        user, system_cpu, _ = (a - b for a, b in zip(usage(pid), before[node], strict=True))
        print(f"  {node}: {100 * (user + system_cpu) / took:.2f} % of a core")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=10.0, help="seconds of locking")
    parser.add_argument("--rounds", type=int, default=3, help="clusters started in turn")
    parser.add_argument("--workers", type=int, default=1, help="workers, each with a lock")
    parser.add_argument("--calls", action="store_true", help="count Python calls (cProfile)")
    parser.add_argument("--idle", type=float, help="measure idle members for this many seconds")
    args = parser.parse_args()
    if not 1 <= args.workers <= OWN_LOCKS.workers:
        parser.error(f"--workers: 1 to {OWN_LOCKS.workers}")
    work = Path(tempfile.mkdtemp(prefix="cluster-cpu-"))
    site, out = work / "site", work / "counts"
    site.mkdir()
    out.mkdir()
    (site / "sitecustomize.py").write_text(COUNTING)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(site), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    os.environ["CLUSTER_CPU_OUT"] = str(out)
    if args.calls:
        os.environ["CLUSTER_CPU_CALLS"] = "1"
    for round_ in range(1, args.rounds + 1):
        print(f"round {round_}/{args.rounds}", flush=True)
        system = Sluicegate()
        try:
            system.start(work / f"nodes-{round_}")
            if args.idle is not None:
                idle(system, args.idle)
            else:
                locking(system, out, args.duration, args.workers)
        finally:
            system.stop()


if __name__ == "__main__":
    main()
