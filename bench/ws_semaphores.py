"""The WebSocket path against the ceiling of its stack, side by side in one run.

    python bench/ws_semaphores.py [--duration 5] [--rounds 5]

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
second than 2 x the echo's rate with 64 frames in flight. Everything shares the machine's cores,
and on this VM a round trip's time depends on whether the two processes share a core, which the
kernel decides and changes; so each measurement is cut into turns, the echo's and ours taking
turns, and the figures pool all turns.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from functools import partial
from pathlib import Path

import msgpack
import trio
from trio_websocket import open_websocket_url

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from sluicegate import client as sg  # noqa: E402
from tests.nodes import NodeProcess  # noqa: E402

CONFIG = "[semaphores]\nbench = 1000\n"
IN_FLIGHT = 64
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


async def echo_server(task_status=trio.TASK_STATUS_IGNORED) -> None:
    """The echo server, in a process of its own as a node is; `started` gets its port."""
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
        task_status.started(port)
        try:
            await trio.sleep_forever()
        finally:
            process.kill()


async def echo_sequential(url: str, duration: float) -> list[float]:
    """Round trips of one request frame at a time."""
    latencies = []
    async with open_websocket_url(url) as ws:
        frame = msgpack.packb([REQUEST])
        end = trio.current_time() + duration
        while trio.current_time() < end:
            started = trio.current_time()
            await ws.send_message(frame)
            msgpack.unpackb(await ws.get_message())
            latencies.append(trio.current_time() - started)
    return latencies


async def echo_in_flight(url: str, duration: float, in_flight: int) -> tuple[int, float]:
    """(frames echoed, seconds) with `in_flight` frames always on their way."""
    async with open_websocket_url(url) as ws:
        frame = msgpack.packb([REQUEST])
        done = 0
        started = trio.current_time()
        end = started + duration
        for _ in range(in_flight):
            await ws.send_message(frame)
        while trio.current_time() < end:
            msgpack.unpackb(await ws.get_message())
            done += 1
            await ws.send_message(frame)
        return done, trio.current_time() - started


async def sluicegate_sequential(url: str, duration: float) -> list[float]:
    """Latencies of single ops: one task locks and unlocks (acquire, then release)."""
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
    return latencies


async def sluicegate_concurrent(url: str, duration: float, tasks: int) -> tuple[int, float, float]:
    """(ops, seconds, requests per frame) of `tasks` tasks on one client, each looping
    lock/unlock (an acquire and a release count one op each)."""
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
    return ops, elapsed, requests / max(frames, 1)


async def measure(node_url: str, duration: float, rounds: int) -> dict:
    """Every measurement in `rounds` short turns, interleaved, so that what the machine does
    meanwhile (and where it runs the processes) weighs on the echo and on sluicegate alike."""
    turn = duration / rounds
    echo_latencies, sg_latencies = [], []
    echo_done = echo_time = sg_ops = sg_time = 0.0
    per_frame = []
    async with trio.open_nursery() as nursery:
        port = await nursery.start(echo_server)
        echo_url = f"ws://127.0.0.1:{port}/"
        for number in range(rounds):
            echo_latencies += await echo_sequential(echo_url, turn)
            sg_latencies += await sluicegate_sequential(node_url, turn)
            done, seconds = await echo_in_flight(echo_url, turn, IN_FLIGHT)
            echo_done, echo_time = echo_done + done, echo_time + seconds
            ops, seconds, frame = await sluicegate_concurrent(node_url, turn, IN_FLIGHT)
            sg_ops, sg_time = sg_ops + ops, sg_time + seconds
            per_frame.append(frame)
            print(f"  round {number + 1}/{rounds} done", file=sys.stderr, flush=True)
        nursery.cancel_scope.cancel()
    return {
        "echo_p50_ms": statistics.median(echo_latencies) * 1000,
        "echo_rate": echo_done / echo_time,
        "sg_p50_ms": statistics.median(sg_latencies) * 1000,
        "sg_rate": sg_ops / sg_time,
        "per_frame": statistics.median(per_frame),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per measurement")
    parser.add_argument("--rounds", type=int, default=5, help="turns each measurement is cut in")
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="sluicegate-bench-"))
    with NodeProcess(CONFIG, workdir=workdir) as node:
        figures = trio.run(measure, f"ws://127.0.0.1:{node.port}", args.duration, args.rounds)

    print(f"WebSocket path, {args.duration:g} s per measurement in {args.rounds} turns")
    print(
        f"  echo (trio-websocket + msgpack)  p50 {figures['echo_p50_ms']:.3f} ms   "
        f"{IN_FLIGHT} in flight: {figures['echo_rate']:.0f} msgs/s"
    )
    print(f"  sluicegate sequential ops        p50 {figures['sg_p50_ms']:.3f} ms")
    print(
        f"  sluicegate {IN_FLIGHT} tasks, one client  {figures['sg_rate']:.0f} ops/s "
        f"({figures['per_frame']:.1f} requests per frame)"
    )
    p50_ratio = figures["sg_p50_ms"] / figures["echo_p50_ms"]
    rate_ratio = figures["sg_rate"] / figures["echo_rate"]
    print(f"  sequential p50 / echo p50: {p50_ratio:.2f}x (target <= 1.30x)")
    print(f"  {IN_FLIGHT} tasks / echo {IN_FLIGHT} in flight: {rate_ratio:.2f}x (target > 2.00x)")


if __name__ == "__main__":
    main()
