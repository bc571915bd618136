"""Three sluicegate nodes and HAProxy on loopback, to try the cluster (`make cluster`).

    python deploy/local_cluster.py [--nodes 3] [-c deploy/example.toml]

Prints the load balancer's URL and each node's, then runs until Ctrl-C, and stops everything.
The nodes share a throwaway secret; logs go to a temporary folder, printed at start.
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.haproxy import HaproxyProcess  # noqa: E402
from tests.nodes import NodeProcess, is_ready  # noqa: E402

CLUSTER_SECTION = '\n[cluster]\ndown_after = "2s"\ngossip_interval = "250ms"\n'


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("-c", "--configuration", type=Path, default=ROOT / "deploy/example.toml")
    args = parser.parse_args()

    config = args.configuration.read_text(encoding="utf-8")
    if "[cluster]" not in config:
        config += CLUSTER_SECTION
    workdir = Path(tempfile.mkdtemp(prefix="sluicegate-cluster-"))
    env = {"SLUICEGATE_CLUSTER_SECRET": secrets.token_hex(16), "SLUICEGATE_TEST_LOG": "INFO"}
    os.environ.update(env)
    nodes: list[NodeProcess] = []
    balancer = None
    try:
        for i in range(1, args.nodes + 1):
            join = ["--join", f"127.0.0.1:{nodes[0].port}"] if nodes else []
            node = NodeProcess(
                config, workdir=workdir / f"n{i}", args=["--node-id", f"n{i}", *join], env=env
            )
            nodes.append(node.start())
        balancer = HaproxyProcess([n.url for n in nodes], workdir=workdir / "haproxy").start()
        deadline = time.monotonic() + 30
        print("Waiting for the nodes to agree on their members ...", flush=True)
        while not all(is_ready(n.url) for n in nodes):
            if time.monotonic() > deadline:
                print("The nodes did not become ready; see the logs.", file=sys.stderr)
                return 1
            time.sleep(0.2)
        print(f"\nsluicegate cluster of {len(nodes)} nodes behind HAProxy:")
        print(f"  load balancer  {balancer.url}   <- point clients here")
        for i, node in enumerate(nodes, 1):
            print(f"  node n{i}        {node.url}")
        print(f"  logs           {workdir}")
        print(f'\nTry: with throttle_client.lock("{balancer.url}", "A"): ...')
        print("Ctrl-C stops everything.", flush=True)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        if balancer is not None:
            balancer.kill()
        for node in nodes:
            node.stop()
        print("Stopped.")
    return 0


def interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, interrupt)
    sys.exit(main())
