"""A single node against the same node run as a cluster of one, side by side in one run.

    python bench/cluster_of_one.py [--duration 4] [--rounds 4]

Two node processes with the same semaphores on free loopback ports: one without a cluster
secret (the single node's semaphore actor, node/semaphore_actor.py) and one with a secret and
nobody to join (links, membership, slot ownership and quorum writes, node/shard_actor.py, with
itself as the only member). For each: the seconds from its start until `/ready` answers 200,
then our client under trio, as bench/ws_semaphores.py measures it: one task's lock/unlock p50,
and the rate of 64 tasks on one client, in interleaved turns.

This is what docs/architecture.md weighs in keeping a single node's runtime beside the cluster's.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.ws_semaphores import (  # noqa: E402
    CONFIG,
    IN_FLIGHT,
    sluicegate_concurrent,
    sluicegate_sequential,
)
from tests.nodes import NodeProcess, is_ready  # noqa: E402

READY_WITHIN = 30.0
RUNTIMES = {
    "single node": {},
    "cluster of one": {"SLUICEGATE_CLUSTER_SECRET": "a-secret-for-one-node"},
}


def ready_after(node: NodeProcess, started: float) -> float:
    """Seconds from `started` until the node answers `/ready` with 200."""
    while not is_ready(node.url):
        if time.monotonic() - started > READY_WITHIN:
            raise RuntimeError(f"not ready within {READY_WITHIN:g} s")
        time.sleep(0.02)
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=4.0, help="seconds per measurement")
    parser.add_argument("--rounds", type=int, default=4, help="turns each measurement is cut in")
    args = parser.parse_args()
    turn = args.duration / args.rounds

    workdir = Path(tempfile.mkdtemp(prefix="sluicegate-bench-"))
    urls, ready = {}, {}
    nodes = []
    try:
        for name, env in RUNTIMES.items():
            started = time.monotonic()
            node = NodeProcess(CONFIG, workdir=workdir / name.replace(" ", "-"), env=env).start()
            nodes.append(node)
            ready[name] = ready_after(node, started)
            urls[name] = f"ws://127.0.0.1:{node.port}"
        latencies: dict[str, list[float]] = {name: [] for name in RUNTIMES}
        ops = dict.fromkeys(RUNTIMES, 0.0)
        seconds = dict.fromkeys(RUNTIMES, 0.0)
        for number in range(args.rounds):
            for name, url in urls.items():
                latencies[name] += anyio.run(sluicegate_sequential, url, turn, backend="trio")
                done, took, _ = anyio.run(
                    sluicegate_concurrent, url, turn, IN_FLIGHT, backend="trio"
                )
                ops[name] += done
                seconds[name] += took
            print(f"  round {number + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    finally:
        for node in nodes:
            node.stop()

    print(f"One node, two runtimes: {args.duration:g} s per measurement in {args.rounds} turns")
    figures = {}
    for name in RUNTIMES:
        p50 = statistics.median(latencies[name]) * 1000
        rate = ops[name] / seconds[name]
        figures[name] = (ready[name], p50, rate)
        print(
            f"  {name:15} ready after {ready[name]:5.2f} s   p50 {p50:.3f} ms   "
            f"{IN_FLIGHT} tasks: {rate:.0f} ops/s"
        )
    single, one = figures["single node"], figures["cluster of one"]
    print(
        f"  cluster of one / single node: ready {one[0] - single[0]:+.2f} s, "
        f"p50 {one[1] / single[1]:.2f}x, {IN_FLIGHT} tasks {one[2] / single[2]:.2f}x the rate"
    )


if __name__ == "__main__":
    main()
