"""python -m simulations run --seeds 500          many seeds, a progress line, a summary
python -m simulations run --seed 7 --trace      one seed again, with its history

Runs under PYTHONHASHSEED=0 (it starts itself again with it if need be), so that a seed replays
the same in any process: set iteration order depends on it.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from simulations.run import Outcome, run_seed  # noqa: E402


def main() -> int:
    if os.environ.get("PYTHONHASHSEED") != "0":
        os.environ["PYTHONHASHSEED"] = "0"
        os.execv(sys.executable, [sys.executable, "-m", "simulations", *sys.argv[1:]])
    parser = argparse.ArgumentParser(prog="python -m simulations", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="simulated runs of a whole cluster, one per seed")
    run.add_argument("--seeds", type=int, default=100, help="how many seeds, from --first")
    run.add_argument("--first", type=int, default=0)
    run.add_argument("--seed", type=int, help="this seed only")
    run.add_argument("--trace", action="store_true", help="print the history of each run")
    args = parser.parse_args()
    # The nodes' own log lines (members down, restores) are the faults at work, not news.
    logging.getLogger("sluicegate").setLevel(logging.CRITICAL)

    seeds = [args.seed] if args.seed is not None else range(args.first, args.first + args.seeds)
    outcomes: list[Outcome] = []
    faults: Counter = Counter()
    started = time.monotonic()
    for number, seed in enumerate(seeds, 1):
        outcome = run_seed(seed)
        outcomes.append(outcome)
        faults.update(outcome.faults)
        if args.trace:
            print("\n".join(outcome.trace))
        failed = sum(1 for o in outcomes if o.violations)
        print(
            f"\r  {number}/{len(seeds)} seeds, {failed} failed, {time.monotonic() - started:.0f} s",
            end="",
            file=sys.stderr,
            flush=True,
        )
    print(file=sys.stderr)
    elapsed = time.monotonic() - started
    failures = [o for o in outcomes if o.violations]
    print(f"runs        {len(outcomes)} ({len(outcomes) / elapsed * 60:.0f} per minute)")
    print(f"operations  {sum(o.operations for o in outcomes)}")
    print(
        "faults      "
        + (", ".join(f"{kind} {count}" for kind, count in sorted(faults.items())) or "none")
    )
    print(f"violations  {sum(len(o.violations) for o in failures)} in {len(failures)} runs")
    for outcome in failures:
        print(f"\nseed {outcome.seed} (trace {outcome.trace_hash}):")
        for violation in outcome.violations[:5]:
            print(f"  {violation}")
        print(f"  replay: python -m simulations run --seed {outcome.seed} --trace")
    if len(outcomes) == 1:
        print(f"trace hash  {outcomes[0].trace_hash}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
