"""The cost of forwarding: the same HTTP acquire+release cycles sent to the semaphore's owner and
to a node that does not own it, side by side in one run.

    python bench/forwarding.py [--duration 5]

Starts three nodes on free loopback ports (they share the machine's cores with the client), waits
until they agree, finds the owner of the semaphore by the ring, and runs the cycles of
`bench/http_semaphores.py` with 1 and with 32 peers against the owner and against another node.
The peers are created at the node the client talks to, so they are homed there: against the owner
nothing crosses a link; against the other node every acquire and release goes from the peer's home
to the owner and back. Prints both rows and the ratios non-owner / owner.
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

from sluicegate.cluster.ring import Ring, semaphore_key  # noqa: E402
from tests.nodes import NodeProcess, is_ready  # noqa: E402

CONFIG = """
[semaphores]
bench = 64

[cluster]
down_after = "1s"
gossip_interval = "200ms"
"""
ENV = {"SLUICEGATE_CLUSTER_SECRET": "bench-forwarding-secret", "SLUICEGATE_TEST_LOG": "WARN"}


def start_cluster(workdir: Path) -> dict[str, NodeProcess]:
    first = NodeProcess(CONFIG, workdir=workdir / "n1", args=["--node-id", "n1"], env=ENV)
    nodes = {"n1": first.start()}
    for name in ("n2", "n3"):
        join = ["--node-id", name, "--join", f"127.0.0.1:{first.port}"]
        nodes[name] = NodeProcess(CONFIG, workdir=workdir / name, args=join, env=ENV).start()
    deadline = time.monotonic() + 30
    while not all(is_ready(n.url) for n in nodes.values()):
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
        owner = nodes[Ring(nodes).owner(semaphore_key("bench"))]
        other = next(n for n in nodes.values() if n is not owner)
        rows = []
        for peers in (1, 32):
            for label, node in (("owner", owner), ("non-owner", other)):
                row = trio.run(scenario, "127.0.0.1", node.port, peers, args.duration)
                rows.append((label, row))
    finally:
        for node in nodes.values():
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
