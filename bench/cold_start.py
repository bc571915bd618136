"""How soon a three-node cluster starting cold serves: from the start of its last node until
every node answers `GET /ready` with 200 (target: 1.5 s).

    python bench/cold_start.py [--runs 5]

Each run starts three nodes on free loopback ports with the default settings (`down_after` 3 s,
gossip every 500 ms), one after another as a StatefulSet does, each listing the other two as
seeds. Beside it, the same cluster with one more seed listed that never answers: a node that has
not heard from every seed waits out `down_after` and the quarantine, as every cold start did
before (docs/cluster.md, "A quick cold start"). Prints the median and slowest of each, measured
from the last node's process start and from the moment it listened.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.haproxy import free_loopback_port  # noqa: E402
from tests.nodes import NodeProcess, is_ready  # noqa: E402

CONFIG = "[semaphores]\nA = 1\n"
ENV = {"SLUICEGATE_CLUSTER_SECRET": "bench-cold-start-secret", "SLUICEGATE_TEST_LOG": "WARNING"}
IDS = ("n1", "n2", "n3")
READY_WITHIN = 30.0


def cold_start(workdir: Path, silent_seed: bool) -> tuple[float, float]:
    """Seconds from the last node's process start, and from its listening, until all are
    ready."""
    ports = {node_id: free_loopback_port() for node_id in IDS}
    silent = [f"127.0.0.1:{free_loopback_port()}"] if silent_seed else []
    nodes: list[NodeProcess] = []
    try:
        for node_id in IDS:
            seeds = [f"127.0.0.1:{port}" for other, port in ports.items() if other != node_id]
            args = ["--node-id", node_id, "--join", ",".join([*seeds, *silent])]
            node = NodeProcess(
                CONFIG, port=ports[node_id], workdir=workdir / node_id, args=args, env=ENV
            )
            started = time.monotonic()
            nodes.append(node.start())
        listened = time.monotonic()
        while not all(is_ready(node.url) for node in nodes):
            if time.monotonic() - started > READY_WITHIN:
                raise RuntimeError(f"not ready within {READY_WITHIN} s:\n{nodes[-1].log()}")
            time.sleep(0.01)
        ready = time.monotonic()
        return ready - started, ready - listened
    finally:
        for node in nodes:
            node.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="cold starts of each kind")
    args = parser.parse_args()
    print(f"three nodes starting cold, {args.runs} runs each (target: ready within 1.5 s)")
    print(f"{'':<28}  {'from the last start':>27}  {'from its listening':>27}")
    print(f"{'':<28}  {'median':>12}  {'slowest':>13}  {'median':>12}  {'slowest':>13}")
    with tempfile.TemporaryDirectory(prefix="sluicegate-cold-") as tmp:
        for title, silent_seed in (
            ("every seed answers", False),
            ("one seed silent (before)", True),
        ):
            rows = []
            for run in range(args.runs):
                rows.append(cold_start(Path(tmp) / f"{silent_seed}-{run}", silent_seed))
                print(f"  {title}: run {run + 1}/{args.runs}", end="\r", file=sys.stderr)
            print(" " * 60, end="\r", file=sys.stderr)
            columns = []
            for index in (0, 1):
                values = [row[index] for row in rows]
                columns.append(f"{statistics.median(values):>10.2f} s  {max(values):>11.2f} s")
            print(f"{title:<28}  {'  '.join(columns)}")


if __name__ == "__main__":
    main()
