"""How far gossip mode goes beyond its limit under steady load, against its documented bound.

    python bench/gossip_overshoot.py [--nodes 3] [--duration 5] [--intervals 10ms,50ms,200ms]

For each gossip interval g: N node processes on free loopback ports, a token bucket in gossip
mode (capacity C, refill rate ρ), and one client per node with 8 tasks checking one key as fast
as they can for `duration` seconds (t). A single exact limiter would admit C + ρ × t; the
figure is how many more went, and what fraction of docs/rate_limits.md's bound on that,
(N − 1) × (C + ρ × (g + d)), it used, d taken as 0. The first check of each client is sent
before the clock starts, so what goes is steady load, not a burst at a cold start.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from sluicegate import client as sg  # noqa: E402
from sluicegate.cluster.durations import parse_duration  # noqa: E402
from tests.nodes import NodeProcess, gauge, wait_until  # noqa: E402

CAPACITY = 50
RATE = 200.0
TASKS = 8
SECRET = {"SLUICEGATE_CLUSTER_SECRET": "bench-gossip-secret"}


def config(interval: str) -> str:
    return f"""
[rate_limits]
steady = {{ algorithm = "token_bucket", capacity = {CAPACITY}, rate = {RATE}, mode = "gossip" }}

[cluster]
down_after = "1s"
gossip_interval = "200ms"
rate_gossip_interval = "{interval}"
"""


async def drive(urls: list[str], duration: float) -> tuple[int, float]:
    went = 0
    started = 0.0

    async def client_run(url: str, ready: trio.Event, start: trio.Event) -> None:
        nonlocal went
        async with await sg.connect(url) as client:
            await client.check("steady", key="warm-up")
            ready.set()
            await start.wait()
            end = trio.current_time() + duration

            async def task() -> None:
                nonlocal went
                while trio.current_time() < end:
                    if (await client.check("steady", key="k")).go:
                        went += 1

            async with trio.open_nursery() as nursery:
                for _ in range(TASKS):
                    nursery.start_soon(task)

    start = trio.Event()
    async with trio.open_nursery() as nursery:
        readies = []
        for url in urls:
            ready = trio.Event()
            readies.append(ready)
            nursery.start_soon(client_run, url, ready, start)
        for ready in readies:
            await ready.wait()
        started = trio.current_time()
        start.set()
    return went, trio.current_time() - started


def run(nodes_count: int, duration: float, interval: str) -> dict:
    workdir = Path(tempfile.mkdtemp(prefix="sluicegate-bench-gossip-"))
    nodes: list[NodeProcess] = []
    try:
        for number in range(1, nodes_count + 1):
            args = ["--node-id", f"n{number}"]
            if nodes:
                args += ["--join", f"127.0.0.1:{nodes[0].port}"]
            nodes.append(
                NodeProcess(
                    config(interval), workdir=workdir / f"n{number}", args=args, env=SECRET
                ).start()
            )
        wait_until(
            lambda: all(gauge(n, "sluicegate_members_up") == nodes_count for n in nodes),
            20,
            "all members up",
        )
        urls = [f"ws://127.0.0.1:{n.port}" for n in nodes]
        went, seconds = trio.run(drive, urls, duration)
        time.sleep(0.5)  # the last gossip goes round
        overshoot_seen = [
            gauge(n, "sluicegate_rate_limit_overshoot_total", limiter="steady") or 0.0
            for n in nodes
        ]
    finally:
        for node in nodes:
            node.kill()
    g = parse_duration(interval)
    allowed = CAPACITY + RATE * seconds
    bound = (nodes_count - 1) * (CAPACITY + RATE * g)
    return {
        "interval": interval,
        "went": went,
        "allowed": allowed,
        "over": went - allowed,
        "bound": bound,
        "seen": max(overshoot_seen),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--duration", type=float, default=5.0, help="seconds of load per run")
    parser.add_argument("--intervals", default="10ms,50ms,200ms", help="rate_gossip_interval")
    args = parser.parse_args()
    rows = []
    for interval in args.intervals.split(","):
        rows.append(run(args.nodes, args.duration, interval))
        print(f"  rate_gossip_interval {interval} done", file=sys.stderr, flush=True)
    print(
        f"Gossip mode under steady load: {args.nodes} nodes, token bucket C={CAPACITY} "
        f"rate={RATE:g}/s, {args.nodes} clients x {TASKS} tasks, {args.duration:g} s"
    )
    print("  g        went   C+rate*t   over   bound on over   used   overshoot metric (max)")
    for row in rows:
        print(
            f"  {row['interval']:<7} {row['went']:6d}   {row['allowed']:8.0f}  {row['over']:5.0f}"
            f"   {row['bound']:13.0f}   {row['over'] / row['bound']:4.0%}   {row['seen']:.0f}"
        )


if __name__ == "__main__":
    main()
