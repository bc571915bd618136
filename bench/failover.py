"""The failover gap alone, round after round: `bench/cluster_vs_peers.py`'s failover step (one
worker locks in a loop at a member that owns none of the locks; after a second the member
serving the lock is killed with SIGKILL; the gap is the longest time between two completed
cycles), on a fresh three-node cluster each round. For issue 39's failover work, where the
spread of the gap over many rounds says more than the median of three.

    .venv/bin/python bench/failover.py                # 8 rounds, about 2 minutes
    .venv/bin/python bench/failover.py --rounds 20 --systems sluicegate,zookeeper
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.cluster_vs_peers import OURS, SYSTEMS, WARM_UP, failover  # noqa: E402
from bench.peers.workloads import CYCLE_LIMIT, OWN_LOCKS, Run, for_seconds  # noqa: E402


def rounds_of(name: str, rounds: int, after: float) -> tuple[list[float], Counter[str]]:
    gaps: list[float] = []
    errors: Counter[str] = Counter()
    for number in range(1, rounds + 1):
        system = SYSTEMS[name]()
        workdir = Path(tempfile.mkdtemp(prefix=f"failover-{name}-"))
        try:
            system.start(workdir)
            system.drive(OWN_LOCKS, Run(), for_seconds(WARM_UP), WARM_UP + CYCLE_LIMIT + 10)
            figures = failover(system, after)
        finally:
            system.stop()
        gaps.append(figures.gap)
        errors += figures.errors
        print(f"[{name} {number}/{rounds}] gap {figures.gap:.2f} s", file=sys.stderr, flush=True)
    return gaps, errors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--after", type=float, default=4.0, help="seconds to go on after the kill")
    parser.add_argument("--systems", default=OURS, help="comma-separated")
    args = parser.parse_args()
    for name in args.systems.split(","):
        gaps, errors = rounds_of(name, args.rounds, args.after)
        print(
            f"{name}: failover gap over {args.rounds} rounds: median "
            f"{statistics.median(gaps):.2f} s, min {min(gaps):.2f}, max {max(gaps):.2f}; "
            f"each: {', '.join(f'{gap:.2f}' for gap in gaps)}; errors reaching the worker: "
            f"{sum(errors.values())} ({dict(errors) or 'none'})"
        )


if __name__ == "__main__":
    main()
