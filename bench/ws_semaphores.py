"""The WebSocket path against the ceiling of its stack, side by side in one run.

    python bench/ws_semaphores.py [--duration 5] [--rounds 5]

1. Echo: a raw trio-websocket server, in a process of its own as a node is, that decodes and
   re-encodes each msgpack frame, and a client that sends one small request map per frame.
   Sequential round trips give the stack's p50; then 64 frames in flight on one connection give
   its rate.
2. sluicegate, one node process on a free loopback port, our async client, under trio and under
   asyncio (the same client, on anyio), and under trio over TLS to a second node with TLS 1.3
   (a certificate made for the run), for TLS's cost beside plain text:
   * sequential: one task locks and unlocks an uncontended semaphore, one op per round trip
     (acquire, then release); the p50 of one op;
   * 64 tasks on one client, each looping lock/unlock: ops per second (each acquire and each
     release counts one). The client batches what the tasks ask at once into shared frames.

Targets: under trio, sequential p50 at most 1.3 x the echo's p50, and with 64 tasks more ops
per second than 2 x the echo's rate with 64 frames in flight; under asyncio, sequential p50
at most 1.3 x trio's, and with 64 tasks at least 0.8 x trio's rate. Everything shares the
machine's cores, and on this VM a round trip's time depends on whether the two
processes share a core, which the kernel decides and changes; so each measurement is cut into
turns, the echo's and ours taking turns, and the figures pool all turns.
"""

from __future__ import annotations

import argparse
import ssl
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
import trustme
from trio_websocket import open_websocket_url

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from sluicegate import client as sg  # noqa: E402
from tests.nodes import NodeProcess, node_files, tls_section  # noqa: E402

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


async def sluicegate_sequential(
    url: str, duration: float, context: ssl.SSLContext | None = None
) -> list[float]:
    """Latencies of single ops: one task locks and unlocks (acquire, then release)."""
    latencies = []
    async with await sg.connect(url, ssl_context=context) as client:
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


async def sluicegate_concurrent(
    url: str, duration: float, tasks: int, context: ssl.SSLContext | None = None
) -> tuple[int, float, float]:
    """(ops, seconds, requests per frame) of `tasks` tasks on one client, each looping
    lock/unlock (an acquire and a release count one op each)."""
    ops = 0
    async with await sg.connect(url, ssl_context=context) as client:
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


# The client's runs: under which event loop, and to the plain node or over TLS.
VARIANTS = {"trio": ("trio", False), "asyncio": ("asyncio", False), "trio, TLS": ("trio", True)}


def measure(nodes: dict[bool, str], context: ssl.SSLContext, duration: float, rounds: int) -> dict:
    """Every measurement in `rounds` short turns, interleaved, so that what the machine does
    meanwhile (and where it runs the processes) weighs on the echo and on sluicegate alike.
    Each turn is an event loop's run of its own (the echo's under trio). `nodes`: the plain
    node's URL and the TLS one's, by whether TLS; `context` trusts the latter."""
    turn = duration / rounds
    echo_latencies: list[float] = []
    echo_done = echo_time = 0.0
    latencies: dict[str, list[float]] = {name: [] for name in VARIANTS}
    ops = dict.fromkeys(VARIANTS, 0.0)
    times = dict.fromkeys(VARIANTS, 0.0)
    per_frame: dict[str, list[float]] = {name: [] for name in VARIANTS}
    with echo_server() as echo_url:
        for number in range(rounds):
            echo_latencies += trio.run(echo_sequential, echo_url, turn)
            for name, (backend, tls) in VARIANTS.items():
                latencies[name] += anyio.run(
                    sluicegate_sequential,
                    nodes[tls],
                    turn,
                    context if tls else None,
                    backend=backend,
                )
            done, seconds = trio.run(echo_in_flight, echo_url, turn, IN_FLIGHT)
            echo_done, echo_time = echo_done + done, echo_time + seconds
            for name, (backend, tls) in VARIANTS.items():
                done, seconds, frame = anyio.run(
                    sluicegate_concurrent,
                    nodes[tls],
                    turn,
                    IN_FLIGHT,
                    context if tls else None,
                    backend=backend,
                )
                ops[name] += done
                times[name] += seconds
                per_frame[name].append(frame)
            print(f"  round {number + 1}/{rounds} done", file=sys.stderr, flush=True)
    figures = {
        "echo_p50_ms": statistics.median(echo_latencies) * 1000,
        "echo_rate": echo_done / echo_time,
    }
    for name in VARIANTS:
        figures[f"{name}_p50_ms"] = statistics.median(latencies[name]) * 1000
        figures[f"{name}_rate"] = ops[name] / times[name]
        figures[f"{name}_per_frame"] = statistics.median(per_frame[name])
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per measurement")
    parser.add_argument("--rounds", type=int, default=5, help="turns each measurement is cut in")
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="sluicegate-bench-"))
    ca = trustme.CA()
    tls = tls_section(**node_files(ca, workdir / "tls"), minimum_version="1.3")
    context = ssl.create_default_context()
    ca.configure_trust(context)
    with (
        NodeProcess(CONFIG, workdir=workdir / "plain") as plain,
        NodeProcess(CONFIG + tls, workdir=workdir / "tls") as secure,
    ):
        nodes = {False: f"ws://127.0.0.1:{plain.port}", True: f"wss://127.0.0.1:{secure.port}"}
        figures = measure(nodes, context, args.duration, args.rounds)

    print(f"WebSocket path, {args.duration:g} s per measurement in {args.rounds} turns")
    print(
        f"  echo (trio-websocket + msgpack)  p50 {figures['echo_p50_ms']:.3f} ms   "
        f"{IN_FLIGHT} in flight: {figures['echo_rate']:.0f} msgs/s"
    )
    for name in VARIANTS:
        p50, rate = figures[f"{name}_p50_ms"], figures[f"{name}_rate"]
        print(
            f"  sluicegate under {name:<9}  sequential ops p50 {p50:.3f} ms   "
            f"{IN_FLIGHT} tasks, one client: {rate:.0f} ops/s "
            f"({figures[f'{name}_per_frame']:.1f} requests per frame)"
        )

    def ratios(name: str, over: str) -> tuple[float, float]:
        return (
            figures[f"{name}_p50_ms"] / figures[f"{over}_p50_ms"],
            figures[f"{name}_rate"] / figures[f"{over}_rate"],
        )

    p50_ratio, rate_ratio = ratios("trio", "echo")
    print(f"  trio sequential p50 / echo p50: {p50_ratio:.2f}x (target <= 1.30x)")
    print(
        f"  trio {IN_FLIGHT} tasks / echo {IN_FLIGHT} in flight: {rate_ratio:.2f}x (target > 2.00x)"
    )
    p50_ratio, rate_ratio = ratios("asyncio", "trio")
    print(f"  asyncio sequential p50 / trio's: {p50_ratio:.2f}x (target <= 1.30x)")
    print(f"  asyncio {IN_FLIGHT} tasks / trio's: {rate_ratio:.2f}x (target >= 0.80x)")
    p50_ratio, rate_ratio = ratios("trio, TLS", "trio")
    print(f"  TLS / plain (trio): sequential p50 {p50_ratio:.2f}x, ", end="")
    print(f"{IN_FLIGHT} tasks {rate_ratio:.2f}x")


if __name__ == "__main__":
    main()
