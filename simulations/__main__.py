"""python -m simulations run --seeds 500 --jobs 2    many seeds, a progress line, a summary
python -m simulations run --seed 7 --trace         one seed again, with its history
python -m simulations run --seeds-from simulations/regressions.txt
                                                   the seeds a file lists (one per line)
python -m simulations run --seed 7 --trace --logs  ... with the nodes' logs and the messages
                                                   each node received on its links
python -m simulations run --seeds 200 --with skew,freeze --availability
                                                   the extra fault kinds too, and how long
                                                   semaphores went unserved after each fault
python -m simulations run --seeds 40 --nodes 5 --with overlap
                                                   faults in overlapping bursts on a minority
python -m simulations deep                         3,000 seeds of three nodes and 1,000 of
                                                   five from a random first seed (printed)
python -m simulations replay                       every seed simulations/regressions*.txt
                                                   names, each as its file says it ran
python -m simulations chaos --duration 120         real node processes behind HAProxy, real
                                                   client processes, kill -9, SIGSTOP/SIGCONT
python -m simulations cost --nodes 3,5,7           what one lock cycle costs the cluster:
                                                   messages, frames, bytes, writes, delays

A seed replays the same in any process, whatever its PYTHONHASHSEED: nothing in a run depends
on hash order (tests/simulations/test_sweeps.py replays seeds under other hash seeds than the
sweep's).
"""

from __future__ import annotations

import argparse
import math
import random
import shutil
import signal
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from simulations.chaos import ChaosRun  # noqa: E402
from simulations.cost import print_costs  # noqa: E402
from simulations.faults import EXTRA_FAULTS  # noqa: E402
from simulations.planted import PLANTED  # noqa: E402
from simulations.run import (  # noqa: E402
    NODES,
    Outcome,
    log_nodes,
    quiet_node_logs,
    read_seeds,
    regressions,
    run_options,
    run_seed,
)


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m simulations", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="simulated runs of a whole cluster, one per seed")
    run.add_argument("--seeds", type=int, default=100, help="how many seeds, from --first")
    run.add_argument("--first", type=int, default=0)
    run.add_argument("--seed", type=int, help="this seed only")
    run.add_argument("--seeds-from", type=Path, help="the seeds a file lists, one per line")
    run.add_argument("--jobs", type=int, default=1, help="processes running seeds at once")
    run.add_argument(
        "--nodes", type=int, default=NODES, choices=(3, 5), help="nodes in the cluster (3 or 5)"
    )
    run.add_argument("--trace", action="store_true", help="print the history of each run")
    run.add_argument("--hashes", action="store_true", help="print each seed's trace hash")
    run.add_argument("--until-caught", action="store_true", help="stop at the first violation")
    run.add_argument(
        "--logs",
        action="store_true",
        help="with --trace: the nodes' logs and link messages, in the trace (one process)",
    )
    run.add_argument(
        "--plant", choices=sorted(PLANTED), help="run with this bug planted (checkers' teeth)"
    )
    _add_sweep_options(run)
    deep = commands.add_parser(
        "deep",
        help="a long sweep: 3,000 seeds of three nodes, 1,000 of five, from a random first seed",
        description=(
            "Sweep --three seeds with three nodes and --five with five, from --first (without "
            "it, a random first seed, printed before anything runs so that the sweep can be "
            "run again), with the availability probe and every fault kind, the extra ones "
            "(skew, freeze, overlap) included. Prints each sweep's progress line and summary, "
            "and how to replay every seed that failed; exit status 1 if any did."
        ),
    )
    deep.add_argument("--three", type=int, default=3000, help="seeds with three nodes")
    deep.add_argument("--five", type=int, default=1000, help="seeds with five nodes")
    deep.add_argument("--first", type=int, help="the first seed (default: random, printed)")
    deep.add_argument("--jobs", type=int, default=2, help="processes running seeds at once")
    deep.add_argument(
        "--no-availability",
        dest="availability",
        action="store_false",
        help="without the availability probe (a quarter faster; other histories)",
    )
    _add_sweep_options(deep, availability=False, extra=tuple(EXTRA_FAULTS))
    replay = commands.add_parser(
        "replay",
        help="every seed that failed once (simulations/regressions*.txt), as it ran",
        description=(
            "Run every seed simulations/regressions*.txt names, with the nodes, fault kinds "
            "and probe its file gives; a sweep's progress line and summary per group, and how "
            "to replay each seed that failed; exit status 1 if any did. `make deep` runs it "
            "first."
        ),
    )
    replay.add_argument("--jobs", type=int, default=2, help="processes running seeds at once")
    chaos = commands.add_parser(
        "chaos",
        help="real processes: 3 nodes behind HAProxy, client processes, kills and pauses",
        description=(
            "Three node processes behind HAProxy on loopback, client processes locking and "
            "checking rate limits through it, and one fault at a time: SIGKILL and restart, "
            "SIGSTOP and SIGCONT (shorter and longer than a peer's expiry). Then the "
            "simulation's checkers judge what the clients saw. Real processes cannot replay a "
            "run exactly: the seed picks the faults and the clients' choices, not the timing. "
            "Exit status 0 only without violations."
        ),
    )
    chaos.add_argument("--duration", type=float, default=120.0, help="real seconds of workload")
    chaos.add_argument(
        "--seed", type=int, help="seeds the faults and the workload (default: random)"
    )
    chaos.add_argument(
        "--keep-logs", action="store_true", help="keep the logs and history even without violations"
    )
    cost = commands.add_parser(
        "cost",
        help="messages, frames, bytes, quorum writes and delays of one lock cycle",
        description=(
            "One client acquires and releases a mutex, one cycle after the other, at its "
            "owner and at another member, with the nodes at their [cluster] defaults: what "
            "a cycle costs the cluster, counted (simulations/cost.py)."
        ),
    )
    cost.add_argument(
        "--nodes", type=_sizes, default=[3, 5, 7], help="cluster sizes, comma-separated"
    )
    args = parser.parse_args()
    if args.command == "cost":
        quiet_node_logs()
        print_costs(args.nodes)
        return 0
    if args.command == "chaos":
        return run_chaos_command(args.duration, args.seed, args.keep_logs)
    quiet_node_logs()
    if args.command == "deep":
        return run_deep(args.first, args.three, args.five, args.jobs, args.extra, args.availability)
    if args.command == "replay":
        return run_replay(args.jobs)
    if args.logs:
        if args.jobs > 1:
            parser.error("--logs runs in this process only: --jobs 1")
        log_nodes()
    if args.plant:
        if args.jobs > 1:
            parser.error("--plant runs in this process only: --jobs 1")
        PLANTED[args.plant]()

    if args.seed is not None:
        seeds: Sequence[int] = [args.seed]
    elif args.seeds_from is not None:
        seeds = read_seeds(args.seeds_from)
    else:
        seeds = range(args.first, args.first + args.seeds)
    failures = sweep(
        seeds,
        args.jobs,
        args.nodes,
        extra=args.extra,
        availability=args.availability,
        trace=args.trace,
        hashes=args.hashes,
        until_caught=args.until_caught,
        plant=args.plant,
    )
    return 1 if failures else 0


def _add_sweep_options(
    parser: argparse.ArgumentParser, availability: bool = True, extra: tuple[str, ...] = ()
) -> None:
    parser.add_argument(
        "--with",
        dest="extra",
        type=_extra_kinds,
        default=extra,
        metavar="KINDS",
        help=f"fault kinds to add to the seeds' choice, comma-separated: {', '.join(EXTRA_FAULTS)}"
        " (each seed enables each with probability 1/2; default: "
        + (", ".join(extra) if extra else "none")
        + "; --with '' for none)",
    )
    if availability:
        parser.add_argument(
            "--availability",
            action="store_true",
            help="probe the nodes every 0.1 s and report, by fault kind, how long some "
            "semaphore went unserved (the probe's traffic gives each seed another history)",
        )


def _extra_kinds(text: str) -> tuple[str, ...]:
    kinds = tuple(kind.strip() for kind in text.split(",") if kind.strip())
    unknown = [kind for kind in kinds if kind not in EXTRA_FAULTS]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown kind {', '.join(unknown)} (choose from {', '.join(EXTRA_FAULTS)})"
        )
    return kinds


def _sizes(text: str) -> list[int]:
    sizes = [int(part) for part in text.split(",")]
    if any(size < 2 for size in sizes):
        raise argparse.ArgumentTypeError("a cluster has at least 2 nodes")
    return sizes


def replay_command(seed: int, nodes: int, extra: Sequence[str], availability: bool) -> str:
    """The command that runs `seed` again as a sweep with these options ran it."""
    options = " ".join(["", *run_options(nodes, tuple(extra), availability)]).rstrip()
    return f"python -m simulations run --seed {seed}{options} --trace"


def sweep(
    seeds: Sequence[int],
    jobs: int,
    nodes: int,
    *,
    extra: tuple[str, ...] = (),
    availability: bool = False,
    trace: bool = False,
    hashes: bool = False,
    until_caught: bool = False,
    plant: str | None = None,
) -> list[int]:
    """Run `seeds`, with a progress line, then print the summary; the seeds that failed."""
    outcomes: list[Outcome] = []
    faults: Counter = Counter()
    figures: Counter = Counter()
    checkers: Counter = Counter()
    # Fault kind -> (seconds some semaphore went unserved, seconds until all were served again
    # for good) of each fault, with the availability probe.
    unserved: dict[str, list[tuple[float, float]]] = {}
    started = time.monotonic()
    for number, outcome in enumerate(_run_all(seeds, jobs, nodes, extra, availability), 1):
        outcomes.append(outcome)
        faults.update(outcome.faults)
        figures.update(outcome.figures)
        checkers.update(v.split("]", 1)[0].lstrip("[") for v in outcome.violations)
        for kind, missed, back in outcome.availability:
            unserved.setdefault(kind, []).append((missed, back))
        if trace:
            print("\n".join(outcome.trace))
        if outcome.violations and len(seeds) > 1:
            # At once, on a line of its own: a long sweep's failures are worth a look early.
            print(f"\r  seed {outcome.seed} failed: {outcome.violations[0]}", file=sys.stderr)
        failed = sum(1 for o in outcomes if o.violations)
        print(
            f"\r  {number}/{len(seeds)} seeds, {failed} failed, {time.monotonic() - started:.0f} s",
            end="",
            file=sys.stderr,
            flush=True,
        )
        if until_caught and outcome.violations:
            break
    print(file=sys.stderr)
    elapsed = time.monotonic() - started
    outcomes.sort(key=lambda o: o.seed)
    if hashes:
        for outcome in outcomes:
            print(f"seed {outcome.seed} hash {outcome.trace_hash}")
    failures = [o for o in outcomes if o.violations]
    print(f"runs        {len(outcomes)} ({len(outcomes) / elapsed * 60:.0f} per minute)")
    if plant:
        print(f"planted     {plant}")
    print(f"operations  {sum(o.operations for o in outcomes)}")
    print(
        "faults      "
        + (", ".join(f"{kind} {count}" for kind, count in sorted(faults.items())) or "none")
    )
    print("figures     " + ", ".join(f"{name} {count}" for name, count in sorted(figures.items())))
    print(f"violations  {sum(len(o.violations) for o in failures)} in {len(failures)} runs")
    if checkers:
        tally = ", ".join(f"{name} {count}" for name, count in sorted(checkers.items()))
        print(f"by checker  {tally}")
    if availability:
        print_availability(unserved)
    for outcome in failures:
        print(f"\nseed {outcome.seed} (trace {outcome.trace_hash}):")
        for violation in outcome.violations[:5]:
            print(f"  {violation}")
        print(f"  replay: {replay_command(outcome.seed, nodes, extra, availability)}")
    if len(outcomes) == 1:
        print(f"trace hash  {outcomes[0].trace_hash}")
    return [outcome.seed for outcome in failures]


def print_availability(unserved: dict[str, list[tuple[float, float]]]) -> None:
    """Percentiles, by fault kind, of how long some semaphore went unserved after each fault
    began (summed over the fault's time), and of how long until all were served for good."""
    print(
        "unavailable seconds after each fault began, some semaphore unserved (summed) | "
        "until all served again for good"
    )
    columns = "".join(f"{name:>7}" for name in ("p50", "p90", "p99", "max"))
    print(f"  {'kind':<11} {'faults':>6} {columns} |{columns}")
    for kind, figures in sorted(unserved.items()):
        missed = sorted(figure[0] for figure in figures)
        back = sorted(figure[1] for figure in figures)
        print(f"  {kind:<11} {len(figures):>6} {_percentiles(missed)} |{_percentiles(back)}")


def _percentiles(values: list[float]) -> str:
    """p50, p90, p99 and max of sorted `values` (nearest rank)."""
    picked = [values[max(0, math.ceil(p / 100 * len(values)) - 1)] for p in (50, 90, 99)]
    return "".join(f"{value:7.1f}" for value in [*picked, values[-1]])


def run_replay(jobs: int) -> int:
    """Every seed of simulations/regressions*.txt, group by group (`regressions`)."""
    failed: list[str] = []
    total = 0
    for group in regressions():
        print(f"\n{group.source}: {len(group.seeds)} seeds", flush=True)
        total += len(group.seeds)
        found = sweep(
            group.seeds, jobs, group.nodes, extra=group.extra, availability=group.availability
        )
        failed += [
            replay_command(seed, group.nodes, group.extra, group.availability) for seed in found
        ]
    print(f"\nreplay: {len(failed)} of {total} seeds failed")
    for command in failed:
        print(f"  {command}")
    return 1 if failed else 0


def run_deep(
    first: int | None,
    three: int,
    five: int,
    jobs: int,
    extra: tuple[str, ...],
    availability: bool = True,
) -> int:
    """`three` seeds with three nodes and `five` with five, from `first` (random if None)."""
    if first is None:
        first = random.SystemRandom().randrange(10**7, 10**9)
    options = f" --with {','.join(extra) or repr('')}"
    options += "" if availability else " --no-availability"
    print(
        f"deep: seeds {first} to {first + three - 1} with three nodes, {first} to "
        f"{first + five - 1} with five{options}\n"
        f"      again: python -m simulations deep --first {first} --three {three} "
        f"--five {five}{options}",
        flush=True,
    )
    failed: list[str] = []
    for nodes, count in ((3, three), (5, five)):
        if count <= 0:
            continue
        print(f"\n{nodes} nodes, {count} seeds from {first}", flush=True)
        seeds = range(first, first + count)
        for seed in sweep(seeds, jobs, nodes, extra=extra, availability=availability):
            failed.append(replay_command(seed, nodes, extra, availability))
    print(f"\ndeep: {len(failed)} of {max(three, 0) + max(five, 0)} seeds failed")
    for command in failed:
        print(f"  {command}")
    return 1 if failed else 0


def run_chaos_command(duration: float, seed: int | None, keep_logs: bool) -> int:
    if seed is None:
        seed = random.randrange(2**32)
    print(f"chaos: seed {seed}, {duration:g} s", flush=True)
    run = ChaosRun(duration, seed, progress=_progress_line)
    # SIGTERM ends the run as Ctrl-C does: every process it started is killed on the way out.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        outcome = run.run()
    except KeyboardInterrupt:
        print(f"\ninterrupted; logs in {run.workdir}", file=sys.stderr)
        return 130
    except BaseException:
        print(f"\nlogs        {run.workdir}", file=sys.stderr)
        raise
    print(file=sys.stderr)
    print(f"duration    {outcome.duration:.0f} s")
    rate = outcome.operations / max(outcome.duration, 1.0)
    print(f"operations  {outcome.operations} ({rate:.0f} per second)")
    print(
        "faults      "
        + (", ".join(f"{kind} {count}" for kind, count in sorted(outcome.faults.items())) or "none")
    )
    print(
        "refused     "
        + (", ".join(f"{why} {count}" for why, count in sorted(outcome.refusals.items())) or "none")
    )
    print(
        "figures     "
        + ", ".join(f"{name} {count}" for name, count in sorted(outcome.figures.items()))
    )
    print(f"violations  {len(outcome.violations)}")
    for violation in outcome.violations:
        print(f"  {violation}")
    if outcome.violations or keep_logs:
        print(f"logs        {run.workdir}")
    else:
        shutil.rmtree(run.workdir, ignore_errors=True)
    return 1 if outcome.violations else 0


def _progress_line(line: str) -> None:
    print(f"\r  {line}", end="", file=sys.stderr, flush=True)


def _run_all(
    seeds: Sequence[int], jobs: int, nodes: int, extra: tuple[str, ...], availability: bool
) -> Iterator[Outcome]:
    """Outcomes as runs end: here, or in `jobs` processes (each seed is a process's whole
    trio run, so processes share nothing)."""
    if jobs <= 1:
        yield from (run_seed(seed, nodes, extra, availability) for seed in seeds)
        return
    with ProcessPoolExecutor(
        jobs, mp_context=get_context("spawn"), initializer=quiet_node_logs
    ) as pool:
        runs = [pool.submit(run_seed, seed, nodes, extra, availability) for seed in seeds]
        for done in as_completed(runs):
            yield done.result()


if __name__ == "__main__":
    sys.exit(main())
