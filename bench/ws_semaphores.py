"""The WebSocket path against the ceiling of its stack, side by side in one run.

    python bench/ws_semaphores.py [--duration 5] [--rounds 5]

1. Echo: a raw trio-websocket server, in a process of its own as a node is, that decodes and
   re-encodes each msgpack frame, and a client that sends one small request map per frame.
   Sequential round trips give the stack's p50; then 64 frames in flight on one connection give
   its rate.
2. sluicegate, one node process on a free loopback port, our async client, under trio and under
   asyncio (the same client, on anyio):
   * sequential: one task locks and unlocks an uncontended semaphore, one op per round trip
     (acquire, then release); the p50 of one op;
   * 64 tasks on one client, each looping lock/unlock: ops per second (each acquire and each
     release counts one). The client batches what the tasks ask at once into shared frames.

Targets: under trio (issue 4), sequential p50 at most 1.3 x the echo's p50, and with 64 tasks
more ops per second than 2 x the echo's rate with 64 frames in flight; under asyncio (issue 18),
sequential p50 at most 1.3 x trio's, and with 64 tasks at least 0.8 x trio's rate. Everything
shares the machine's cores, and on this VM a round trip's time depends on whether the two
processes share a core, which the kernel decides and changes; so each measurement is cut into
turns, the echo's and ours taking turns, and the figures pool all turns.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
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


@contextmanager
def echo_server() -> Iterator[str]:
    """The echo server, in a process of its own as a node is; its URL."""
    process = subprocess.Popen([sys.executable, "-c", ECHO_SERVER], stdout=subprocess.PIPE)
    try:
        port = int(process.stdout.readline().split()[0])
        yield f"ws://127.0.0.1:{port}/"
    finally:
        process.kill()
        process.wait()


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
        end = anyio.current_time() + duration
        while anyio.current_time() < end:
            started = anyio.current_time()
            lock = client.lock("bench")
            await lock.__aenter__()
            acquired = anyio.current_time()
            await lock.__aexit__(None, None, None)
            released = anyio.current_time()
            latencies += [acquired - started, released - acquired]
    return latencies


async def sluicegate_concurrent(url: str, duration: float, tasks: int) -> tuple[int, float, float]:
    """(ops, seconds, requests per frame) of `tasks` tasks on one client, each looping
    lock/unlock (an acquire and a release count one op each)."""
    ops = 0
    async with await sg.connect(url) as client:
        async with client.lock("bench"):  # warm up: peers, connection
            pass
        end = anyio.current_time() + duration
        started = anyio.current_time()

        async def worker() -> None:
            nonlocal ops
            while anyio.current_time() < end:
                async with client.lock("bench"):
                    pass
                ops += 2

        frames, requests = client.connection.frames_sent, client.connection.requests_sent
        async with anyio.create_task_group() as nursery:
            for _ in range(tasks):
                nursery.start_soon(worker)
        elapsed = anyio.current_time() - started
        frames = client.connection.frames_sent - frames
        requests = client.connection.requests_sent - requests
    return ops, elapsed, requests / max(frames, 1)


BACKENDS = ("trio", "asyncio")


def measure(node_url: str, duration: float, rounds: int) -> dict:
    """Every measurement in `rounds` short turns, interleaved, so that what the machine does
    meanwhile (and where it runs the processes) weighs on the echo and on sluicegate alike.
    Each turn is an event loop's run of its own (the echo's under trio)."""
    turn = duration / rounds
    echo_latencies: list[float] = []
    echo_done = echo_time = 0.0
    latencies: dict[str, list[float]] = {backend: [] for backend in BACKENDS}
    ops = dict.fromkeys(BACKENDS, 0.0)
    times = dict.fromkeys(BACKENDS, 0.0)
    per_frame: dict[str, list[float]] = {backend: [] for backend in BACKENDS}
    with echo_server() as echo_url:
        for number in range(rounds):
            echo_latencies += trio.run(echo_sequential, echo_url, turn)
            for backend in BACKENDS:
                latencies[backend] += anyio.run(
                    sluicegate_sequential, node_url, turn, backend=backend
                )
            done, seconds = trio.run(echo_in_flight, echo_url, turn, IN_FLIGHT)
            echo_done, echo_time = echo_done + done, echo_time + seconds
            for backend in BACKENDS:
                done, seconds, frame = anyio.run(
                    sluicegate_concurrent, node_url, turn, IN_FLIGHT, backend=backend
                )
                ops[backend] += done
                times[backend] += seconds
                per_frame[backend].append(frame)
            print(f"  round {number + 1}/{rounds} done", file=sys.stderr, flush=True)
    figures = {
        "echo_p50_ms": statistics.median(echo_latencies) * 1000,
        "echo_rate": echo_done / echo_time,
    }
    for backend in BACKENDS:
        figures[f"{backend}_p50_ms"] = statistics.median(latencies[backend]) * 1000
        figures[f"{backend}_rate"] = ops[backend] / times[backend]
        figures[f"{backend}_per_frame"] = statistics.median(per_frame[backend])
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per measurement")
    parser.add_argument("--rounds", type=int, default=5, help="turns each measurement is cut in")
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="sluicegate-bench-"))
    with NodeProcess(CONFIG, workdir=workdir) as node:
        figures = measure(f"ws://127.0.0.1:{node.port}", args.duration, args.rounds)

    print(f"WebSocket path, {args.duration:g} s per measurement in {args.rounds} turns")
    print(
        f"  echo (trio-websocket + msgpack)  p50 {figures['echo_p50_ms']:.3f} ms   "
        f"{IN_FLIGHT} in flight: {figures['echo_rate']:.0f} msgs/s"
    )
    for backend in BACKENDS:
        p50, rate = figures[f"{backend}_p50_ms"], figures[f"{backend}_rate"]
        print(
            f"  sluicegate under {backend:<7}  sequential ops p50 {p50:.3f} ms   "
            f"{IN_FLIGHT} tasks, one client: {rate:.0f} ops/s "
            f"({figures[f'{backend}_per_frame']:.1f} requests per frame)"
        )
    p50_ratio = figures["trio_p50_ms"] / figures["echo_p50_ms"]
    rate_ratio = figures["trio_rate"] / figures["echo_rate"]
    print(f"  trio sequential p50 / echo p50: {p50_ratio:.2f}x (target <= 1.30x)")
    print(
        f"  trio {IN_FLIGHT} tasks / echo {IN_FLIGHT} in flight: {rate_ratio:.2f}x (target > 2.00x)"
    )
    p50_ratio = figures["asyncio_p50_ms"] / figures["trio_p50_ms"]
    rate_ratio = figures["asyncio_rate"] / figures["trio_rate"]
    print(f"  asyncio sequential p50 / trio's: {p50_ratio:.2f}x (target <= 1.30x)")
    print(f"  asyncio {IN_FLIGHT} tasks / trio's: {rate_ratio:.2f}x (target >= 0.80x)")


if __name__ == "__main__":
    main()
