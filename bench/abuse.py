"""A node under attack, side by side with the same node left alone (the targets):

* acquire+release cycles over HTTP (8 peers) with no attack, and while 300 sockets hold a
  half-sent request line (`GET /`) open: target at least 0.8x;
* the node's RSS while a /ws client sends waits and never reads its answers for 15 s, against
  its RSS at rest: target at most +100 MB;
* while a client makes 100,000 peers in frames of 5,000 and they expire together, and while
  four clients keep asking `GET /peers/` of them, on a single node and on a cluster node: the
  slowest `GET /health`, the stalls of the node's own loop over 50 ms as it logs them
  (node/stall_watch.py; target: none), and its full garbage collections
  (`sluicegate_gc_pause_seconds`);
* while 20,000 acquires of 20 connections wait on one semaphore for 12 s, on a single node and
  on a cluster node: the slowest `GET /health` and the full garbage collections while they
  wait, the stalls from their arrival on, and how long SIGTERM then takes to stop the node.

    python bench/abuse.py [--duration 5] [--never-read 15] [--peers 100000] [--waits 20000]

Starts its own node processes on free loopback ports; every attack stops by itself.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import socket
import sys
import time
import urllib.request
from pathlib import Path

import msgpack
import trio
from trio_websocket import ConnectionClosed, open_websocket_url

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.http_semaphores import scenario  # noqa: E402
from tests.nodes import (  # noqa: E402
    NodeProcess,
    hello_and_peers,
    is_ready,
    stalls_of,
    wait_until,
)

CONFIG = (
    "[semaphores]\nbench = 64\n"
    '[rate_limits]\napi = { algorithm = "gcra", burst = 1000000000, rate = 1e9 }\n'
)
IDLE_SOCKETS = 300
PEERS = 8


def cycles(node: NodeProcess, duration: float) -> dict:
    return trio.run(scenario, "127.0.0.1", node.port, PEERS, duration)


def with_idle_half_requests(node: NodeProcess, duration: float) -> tuple[dict, float]:
    """The cycles while `IDLE_SOCKETS` half-requests are open; and the node's CPU seconds per
    second meanwhile."""
    idle = []
    try:
        for _ in range(IDLE_SOCKETS):
            sock = socket.create_connection(("127.0.0.1", node.port), timeout=5)
            sock.sendall(b"GET /")
            idle.append(sock)
        cpu, started = node.cpu_seconds(), time.monotonic()
        row = cycles(node, duration)
        return row, (node.cpu_seconds() - cpu) / (time.monotonic() - started)
    finally:
        for sock in idle:
            sock.close()


async def never_read(url: str, seconds: float) -> int:
    """Send frames of 1,000 waits (answered at once, by tasks) for `seconds` without reading
    an answer; the frames sent."""
    frame = msgpack.packb(
        [{"id": i, "op": "wait", "limiter": "api", "timeout": 1} for i in range(1000)]
    )
    sent = 0
    async with open_websocket_url(url, message_queue_size=1) as ws:
        await ws.send_message(msgpack.packb({"hello": 1}))
        with trio.move_on_after(seconds):
            while True:
                await ws.send_message(frame)
                sent += 1
        with trio.move_on_after(1):
            await ws.aclose()
    return sent


async def make_peers(url: str, peers: int, expires_in: float) -> None:
    """`peers` new peers over one /ws connection, 5,000 to a frame."""
    async with open_websocket_url(url, max_message_size=2**21) as ws:
        await ws.send_message(msgpack.packb({"hello": 1}))
        await ws.get_message()
        for start in range(0, peers, 5000):
            count = min(5000, peers - start)
            frame = [{"id": i, "op": "new_peer", "expires_in": expires_in} for i in range(count)]
            await ws.send_message(msgpack.packb(frame))
            answered = 0
            while answered < count:
                answered += len(msgpack.unpackb(await ws.get_message(), strict_map_key=False))


def _gc_reading(node: NodeProcess) -> tuple[float, float, list[tuple[float, float]]]:
    """`sluicegate_gc_pause_seconds` of full collections on the node's /metrics: the count, the
    sum, and the buckets (upper bound, collections at or below it)."""
    with urllib.request.urlopen(f"{node.url}/metrics", timeout=30) as response:
        text = response.read().decode()
    family = "sluicegate_gc_pause_seconds"
    count = float(re.search(rf'^{family}_count{{generation="2"}} (\S+)$', text, re.M).group(1))
    total = float(re.search(rf'^{family}_sum{{generation="2"}} (\S+)$', text, re.M).group(1))
    buckets = re.findall(rf'^{family}_bucket{{generation="2",le="([^"]+)"}} (\S+)$', text, re.M)
    return count, total, [(float(bound), float(below)) for bound, below in buckets]


def full_collections(node: NodeProcess, since=None) -> tuple[int, float, str]:
    """The node's full garbage collections so far (or since an earlier `_gc_reading`): how
    many, their mean in ms, and the bucket that holds the longest ("<= 10 ms")."""
    count, total, buckets = _gc_reading(node)
    if since is not None:
        count, total = count - since[0], total - since[1]
        buckets = [(b, n - n0) for (b, n), (_, n0) in zip(buckets, since[2], strict=True)]
    longest = "none"
    for bound, below in buckets:
        if count and below == count:
            longest = f"<= {bound * 1000:g} ms"
            break
    return int(count), total / count * 1000 if count else 0.0, longest


GC_HEADER = f"{'full GCs':>8}  {'mean':>8}  {'longest':>12}"


def gc_columns(collections: tuple[int, float, str]) -> str:
    count, mean, longest = collections
    return f"{count:>8}  {mean:>5.1f} ms  {longest:>12}"


def during_expiry(
    peers: int, cluster: bool
) -> tuple[float, int, float, tuple[int, float, str], float]:
    """Make `peers` peers in frames of 5,000, and let them expire together, on a single node or
    on a cluster node (a cluster of one: the same shard, home and writes as in three): the
    slowest `GET /health` while they expire (s), the node's stalls meanwhile and while they
    were made (`stalls_of`), its full collections, and its stop (`stop_time`)."""
    config = CONFIG + f"[limits]\npeers = {peers}\npeers_per_connection = {peers}\n"
    args, env = node_kind(cluster)
    if cluster:
        config += '[cluster]\ndown_after = "1s"\n'
    with NodeProcess(config, args=args, env=env) as node:
        wait_until(lambda: is_ready(node.url), 15, "the node serves")
        expires_in = 3.0 + peers / 20_000  # long enough to make them all first
        trio.run(make_peers, f"ws://127.0.0.1:{node.port}/ws", peers, expires_in)
        longest, end = 0.0, time.monotonic() + expires_in + 3
        while time.monotonic() < end:
            started = time.monotonic()
            urllib.request.urlopen(f"{node.url}/health", timeout=30).read()
            longest = max(longest, time.monotonic() - started)
            time.sleep(0.005)
        collections = full_collections(node)
        stop = stop_time(node)
    return (longest, *stalls_of(node), collections, stop)


def stop_time(node: NodeProcess) -> float:
    """Seconds from SIGTERM to the node's exit."""
    started = time.monotonic()
    node.stop()
    return time.monotonic() - started


def while_listing(
    peers: int, cluster: bool, listers: int = 4
) -> tuple[float, float, int, float, tuple[int, float, str]]:
    """Seconds of the slowest `GET /health` while `listers` clients keep asking `GET /peers/`
    of `peers` peers, for 5 s; of the slowest `GET /peers/`; and the node's stalls while the
    peers were made and listed (`stalls_of`)."""
    config = CONFIG + f"[limits]\npeers = {peers}\npeers_per_connection = {peers}\n"
    args, env = node_kind(cluster)
    with NodeProcess(
        config + ('[cluster]\ndown_after = "1s"\n' if cluster else ""), args=args, env=env
    ) as node:
        wait_until(lambda: is_ready(node.url), 15, "the node serves")
        trio.run(make_peers, f"ws://127.0.0.1:{node.port}/ws", peers, 600.0)
        slowest = {"health": 0.0, "list": 0.0}

        def timed(path: str, what: str) -> None:
            started = time.monotonic()
            urllib.request.urlopen(f"{node.url}{path}", timeout=60).read()
            slowest[what] = max(slowest[what], time.monotonic() - started)

        async def keep_listing(until: float) -> None:
            while time.monotonic() < until:
                await trio.to_thread.run_sync(timed, "/peers/", "list")

        async def run() -> None:
            until = time.monotonic() + 5
            async with trio.open_nursery() as nursery:
                for _ in range(listers):
                    nursery.start_soon(keep_listing, until)
                while time.monotonic() < until:
                    await trio.to_thread.run_sync(timed, "/health", "health")
                    await trio.sleep(0.005)

        trio.run(run)
        collections = full_collections(node)
        node.stop()
    return (slowest["health"], slowest["list"], *stalls_of(node), collections)


async def hold_waits(node: NodeProcess, waits: int, hold: float, connections: int = 20):
    """`connections` connections each make `waits / connections` peers and park an acquire of
    the semaphore `one` for each; all wait `hold` seconds, then the node is stopped. The slowest
    `GET /health` while they waited, the node's full garbage collections meanwhile, and the
    seconds from SIGTERM to its exit."""
    url = f"ws://127.0.0.1:{node.port}/ws"

    async def waiter(count: int, parked: trio.Semaphore) -> None:
        async with open_websocket_url(url, max_message_size=2**22) as ws:
            peers = await hello_and_peers(ws, count)
            frame = [
                {"id": i, "op": "acquire", "peer": peer, "semaphore": "one", "wait": 600}
                for i, peer in enumerate(peers)
            ]
            # Answered once every acquire before it in the frame was applied.
            frame.append({"id": -1, "op": "heartbeat", "peer": peers[0], "expires_in": 600})
            await ws.send_message(msgpack.packb(frame))
            while not any(a["id"] == -1 for a in msgpack.unpackb(await ws.get_message())):
                pass
            parked.release()
            with contextlib.suppress(ConnectionClosed):  # by the node's stop
                while True:
                    await ws.get_message()

    def health() -> float:
        started = time.monotonic()
        urllib.request.urlopen(f"{node.url}/health", timeout=30).read()
        return time.monotonic() - started

    parked = trio.Semaphore(0)
    async with trio.open_nursery() as nursery:
        for _ in range(connections):
            nursery.start_soon(waiter, waits // connections, parked)
        with trio.fail_after(120):
            for _ in range(connections):
                await parked.acquire()
        before = await trio.to_thread.run_sync(_gc_reading, node)
        slowest, end = 0.0, time.monotonic() + hold
        while time.monotonic() < end:
            slowest = max(slowest, await trio.to_thread.run_sync(health))
            await trio.sleep(0.005)
        collections = await trio.to_thread.run_sync(full_collections, node, before)
        stop = await trio.to_thread.run_sync(stop_time, node)
        nursery.cancel_scope.cancel()
    return slowest, collections, stop


def while_waiting(
    waits: int, cluster: bool, hold: float = 12.0
) -> tuple[float, int, float, tuple[int, float, str], float]:
    """`waits` acquires of 20 connections waiting on one semaphore for `hold` seconds (a cluster
    node asks about them again every 5 s and audits them every 2 s, or less often past 10,000 a
    second): the slowest `GET /health` and the full garbage collections while they waited, the
    node's stalls from the first request to the stop (`stalls_of`), and the stop, while they
    still wait (`stop_time`)."""
    config = CONFIG.replace("bench = 64\n", "bench = 64\none = 1\n")
    config += f"[limits]\npeers = {waits}\npeers_per_connection = {waits}\nwaits = {waits}\n"
    args, env = node_kind(cluster)
    if cluster:
        config += '[cluster]\ndown_after = "1s"\n'
    with NodeProcess(config, args=args, env=env) as node:
        wait_until(lambda: is_ready(node.url), 15, "the node serves")
        slowest, collections, stop = trio.run(hold_waits, node, waits, hold)
    return (slowest, *stalls_of(node), collections, stop)


def node_kind(cluster: bool) -> tuple[list[str], dict[str, str]]:
    """The arguments and environment of a single node, or of a cluster node."""
    if not cluster:
        return [], {}
    return ["--node-id", "n1"], {"SLUICEGATE_CLUSTER_SECRET": "bench-secret-of-16+bytes"}


def stall_table(title: str, scenario) -> None:
    """A row per kind of node of what `scenario(cluster)` measured: the slowest `GET /health`,
    the stalls, the full garbage collections, and the time SIGTERM took to stop the node."""
    print(f"\n{title} (target: no stall over 50 ms)")
    print(
        f"{'':<14}  {'slowest /health':>15}  {'stalls > 50 ms':>14}  {'longest stall':>13}  "
        f"{GC_HEADER}  {'SIGTERM to exit':>15}"
    )
    for name, cluster in (("single node", False), ("cluster node", True)):
        health, stalls, longest, collections, stop = scenario(cluster)
        print(
            f"{name:<14}  {health * 1000:>12.0f} ms  {stalls:>14}  {longest:>10.0f} ms  "
            f"{gc_columns(collections)}  {stop:>13.2f} s"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per cycle run")
    parser.add_argument("--never-read", type=float, default=15.0, help="seconds of not reading")
    parser.add_argument("--peers", type=int, default=100_000, help="peers expiring together")
    parser.add_argument("--waits", type=int, default=20_000, help="acquires waiting together")
    args = parser.parse_args()

    with NodeProcess(CONFIG) as node:
        alone = cycles(node, args.duration)
        attacked, cpu = with_idle_half_requests(node, args.duration)
    print(f"HTTP acquire+release, {PEERS} peers, {args.duration:g} s per row")
    print(f"{'':<32}  {'cycles/s':>9}  {'p50 ms':>7}  {'p99 ms':>7}")
    for name, row in (("no attack", alone), (f"{IDLE_SOCKETS} idle half-requests", attacked)):
        print(
            f"{name:<32}  {row['cycles_per_s']:>9.0f}  {row['p50_ms']:>7.3f}  {row['p99_ms']:>7.3f}"
        )
    ratio = attacked["cycles_per_s"] / alone["cycles_per_s"]
    print(f"ratio {ratio:.2f} (target >= 0.8); node CPU under the attack {cpu:.2f} s/s")

    with NodeProcess(CONFIG) as node:
        time.sleep(0.5)
        at_rest = node.rss_mb()
        sent = trio.run(never_read, f"ws://127.0.0.1:{node.port}/ws", args.never_read)
        peak = node.rss_mb()
    print(
        f"\n/ws client that never reads, {args.never_read:g} s: RSS {at_rest:.0f} MB at rest, "
        f"{peak:.0f} MB after ({peak - at_rest:+.0f} MB, target <= +100 MB); "
        f"{sent} frames of 1,000 waits sent before the node stopped reading"
    )

    stall_table(
        f"{args.peers} peers made in frames of 5,000, then expiring together",
        lambda cluster: during_expiry(args.peers, cluster),
    )

    print(f"\n{args.peers} peers made, then four clients asking GET /peers/ for 5 s")
    print(
        f"{'':<14}  {'slowest /health':>15}  {'slowest /peers/':>15}  {'stalls > 50 ms':>14}  "
        f"{'longest stall':>13}  {GC_HEADER}"
    )
    for name, cluster in (("single node", False), ("cluster node", True)):
        health, listing, stalls, longest, collections = while_listing(args.peers, cluster)
        print(
            f"{name:<14}  {health * 1000:>12.0f} ms  {listing * 1000:>12.0f} ms  {stalls:>14}  "
            f"{longest:>10.0f} ms  {gc_columns(collections)}"
        )

    stall_table(
        f"{args.waits} acquires of 20 connections waiting on one semaphore for 12 s",
        lambda cluster: while_waiting(args.waits, cluster),
    )


if __name__ == "__main__":
    main()
