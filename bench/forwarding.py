"""The cost of forwarding: the same HTTP acquire+release cycles sent to the node that holds the
semaphores and to one that forwards them, side by side in one run.

    python bench/forwarding.py [--duration 5]

Starts three nodes on free loopback ports (they share the machine's cores with the client), waits
until they agree, finds the node holding the state (the owner), and runs the cycles of
`bench/http_semaphores.py` with 1 and with 32 peers against the owner and against another node.
Prints both rows and the ratios non-owner / owner.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from http_semaphores import scenario  # noqa: E402

from tests.nodes import NodeProcess, gauge, is_ready  # noqa: E402

CONFIG = """
[semaphores]
bench = 64

[cluster]
down_after = "1s"
gossip_interval = "200ms"
"""
ENV = {"SLUICEGATE_CLUSTER_SECRET": "bench", "SLUICEGATE_TEST_LOG": "WARN"}


def start_cluster(workdir: Path) -> list[NodeProcess]:
    nodes = [NodeProcess(CONFIG, workdir=workdir / "n1", args=["--node-id", "n1"], env=ENV)]
    nodes[0].start()
    for name in ("n2", "n3"):
        join = ["--node-id", name, "--join", f"127.0.0.1:{nodes[0].port}"]
        nodes.append(NodeProcess(CONFIG, workdir=workdir / name, args=join, env=ENV).start())
    deadline = time.monotonic() + 30
    while not all(is_ready(n.url) for n in nodes):
        if time.monotonic() > deadline:
            raise RuntimeError("the nodes did not become ready")
        time.sleep(0.1)
    return nodes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per row")
    args = parser.parse_args()

    nodes = start_cluster(Path(tempfile.mkdtemp(prefix="sluicegate-bench-")))
    try:
        owner = next(n for n in nodes if gauge(n, "sluicegate_authority") == 1)
        other = next(n for n in nodes if n is not owner)
        rows = []
        for peers in (1, 32):
            for label, node in (("owner", owner), ("non-owner", other)):
                row = trio.run(scenario, "127.0.0.1", node.port, peers, args.duration)
                rows.append((label, row))
    finally:
        for node in nodes:
            node.stop()

    print(f"HTTP acquire+release, 3-node cluster, {args.duration:g} s per row")
    print(f"{'target':>9}  {'peers':>5}  {'cycles/s':>9}  {'p50 ms':>7}  {'p99 ms':>7}")
    for label, row in rows:
        print(
            f"{label:>9}  {row['peers']:>5}  {row['cycles_per_s']:>9.0f}  "
            f"{row['p50_ms']:>7.3f}  {row['p99_ms']:>7.3f}"
        )
    for i in (0, 2):
        owner_row, other_row = rows[i][1], rows[i + 1][1]
        print(
            f"peers {owner_row['peers']:>2}: non-owner / owner: throughput "
            f"{other_row['cycles_per_s'] / owner_row['cycles_per_s']:.2f}x, p50 latency "
            f"{other_row['p50_ms'] / owner_row['p50_ms']:.2f}x"
        )


if __name__ == "__main__":
    main()
