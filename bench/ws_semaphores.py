"""The WebSocket path against the ceiling of its stack, side by side in one run.

    python bench/ws_semaphores.py [--duration 5]

1. Echo: a raw trio-websocket server, in a process of its own as a node is, that decodes and
   re-encodes each msgpack frame, and a client that sends one small request map per frame.
   Sequential round trips give the stack's p50; then 64 frames in flight on one connection give
   its rate.
2. sluicegate, one node process on a free loopback port, our async client:
   * sequential: one task locks and unlocks an uncontended semaphore, one op per round trip
     (acquire, then release); the p50 of one op;
   * 64 tasks on one client, each looping lock/unlock: ops per second (each acquire and each
     release counts one). The client batches what the tasks ask at once into shared frames.

Targets (issue 4): sequential p50 at most 1.3 x the echo's p50; with 64 tasks, more ops per
second than 2 x the echo's rate with 64 frames in flight. Everything shares the machine's cores.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from functools import partial
from pathlib import Path

import msgpack
import trio
from trio_websocket import open_websocket_url

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from sluicegate import client as sg  # noqa: E402
from tests.nodes import NodeProcess  # noqa: E402

CONFIG = "[semaphores]\nbench = 1000\n"
REQUEST = {"id": 1, "op": "acquire", "peer": 12345678901234, "semaphore": "bench", "count": 1}


ECHO_SERVER = """
import sys, msgpack, trio
from trio_websocket import ConnectionClosed, serve_websocket

async def echo(request):
    ws = await request.accept()
    try:
        while True:
            await ws.send_message(msgpack.packb(msgpack.unpackb(await ws.get_message())))
    except ConnectionClosed:
        pass

async def main():
    async with trio.open_nursery() as nursery:
        server = await nursery.start(serve_websocket, echo, "127.0.0.1", 0, None)
        print(server.port, flush=True)
        await trio.sleep_forever()

trio.run(main)
"""


async def echo(duration: float) -> dict:
    """The echo server runs in a process of its own, as a node does."""
    async with trio.open_nursery() as nursery:
        process = await nursery.start(
            partial(
                trio.run_process,
                [sys.executable, "-c", ECHO_SERVER],
                stdout=subprocess.PIPE,
                check=False,
            )
        )
        port = int((await process.stdout.receive_some(64)).split()[0])
        async with open_websocket_url(f"ws://127.0.0.1:{port}/") as ws:
            frame = msgpack.packb([REQUEST])
            latencies = []
            end = trio.current_time() + duration
            while trio.current_time() < end:
                started = trio.current_time()
                await ws.send_message(frame)
                msgpack.unpackb(await ws.get_message())
                latencies.append(trio.current_time() - started)
            in_flight, done = 64, 0
            started = trio.current_time()
            end = started + duration
            for _ in range(in_flight):
                await ws.send_message(frame)
            while trio.current_time() < end:
                msgpack.unpackb(await ws.get_message())
                done += 1
                await ws.send_message(frame)
            rate = done / (trio.current_time() - started)
        process.kill()
    return {"p50_ms": statistics.median(latencies) * 1000, "rate_64": rate}


async def sluicegate_sequential(url: str, duration: float) -> dict:
    latencies = []
    async with await sg.connect(url) as client:
        end = trio.current_time() + duration
        while trio.current_time() < end:
            started = trio.current_time()
            lock = client.lock("bench")
            await lock.__aenter__()
            acquired = trio.current_time()
            await lock.__aexit__(None, None, None)
            released = trio.current_time()
            latencies += [acquired - started, released - acquired]
    return {"p50_ms": statistics.median(latencies) * 1000, "ops": len(latencies)}


async def sluicegate_concurrent(url: str, duration: float, tasks: int) -> dict:
    ops = 0
    async with await sg.connect(url) as client:
        async with client.lock("bench"):  # warm up: peers, connection
            pass
        end = trio.current_time() + duration
        started = trio.current_time()

        async def worker() -> None:
            nonlocal ops
            while trio.current_time() < end:
                async with client.lock("bench"):
                    pass
                ops += 2

        frames, requests = client.connection.frames_sent, client.connection.requests_sent
        async with trio.open_nursery() as nursery:
            for _ in range(tasks):
                nursery.start_soon(worker)
        elapsed = trio.current_time() - started
        frames = client.connection.frames_sent - frames
        requests = client.connection.requests_sent - requests
    return {"rate": ops / elapsed, "per_frame": requests / max(frames, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per measurement")
    args = parser.parse_args()

    baseline = trio.run(echo, args.duration)
    import tempfile

    with NodeProcess(CONFIG, workdir=Path(tempfile.mkdtemp(prefix="sluicegate-bench-"))) as node:
        url = f"ws://127.0.0.1:{node.port}"
        sequential = trio.run(sluicegate_sequential, url, args.duration)
        concurrent = trio.run(sluicegate_concurrent, url, args.duration, 64)

    print(f"WebSocket path, {args.duration:g} s per measurement")
    print(
        f"  echo (trio-websocket + msgpack)  p50 {baseline['p50_ms']:.3f} ms   "
        f"64 in flight: {baseline['rate_64']:.0f} msgs/s"
    )
    print(f"  sluicegate sequential ops        p50 {sequential['p50_ms']:.3f} ms")
    print(
        f"  sluicegate 64 tasks, one client  {concurrent['rate']:.0f} ops/s "
        f"({concurrent['per_frame']:.1f} requests per frame)"
    )
    p50_ratio = sequential["p50_ms"] / baseline["p50_ms"]
    rate_ratio = concurrent["rate"] / baseline["rate_64"]
    print(f"  sequential p50 / echo p50: {p50_ratio:.2f}x (target <= 1.30x)")
    print(f"  64 tasks / echo 64 in flight: {rate_ratio:.2f}x (target > 2.00x)")


if __name__ == "__main__":
    main()
