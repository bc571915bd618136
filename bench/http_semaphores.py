"""Acquire+release cycles over Throttle's HTTP API: throughput and latency, 1 and 32 peers.

    python bench/http_semaphores.py [--duration 5] [--url http://127.0.0.1:8000]

Without --url it starts its own node process on a free loopback port. Each peer has its own
keep-alive connection and loops `PUT /peers/{id}/bench` (count 1) then `DELETE /peers/{id}/bench`.
The semaphore's max (64) exceeds the number of peers, so no acquire ever waits: this measures the
cost of the path, not of contention. The client is h11 on trio, the same event loop the node uses,
and shares the machine's cores with the node.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import h11
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.nodes import NodeProcess  # noqa: E402

CONFIG = "[semaphores]\nbench = 64\n"


class Connection:
    """One keep-alive HTTP/1.1 connection."""

    def __init__(self, stream: trio.SocketStream, host: str) -> None:
        self.stream = stream
        self.host = host.encode()
        self.h11 = h11.Connection(h11.CLIENT)

    @classmethod
    async def open(cls, host: str, port: int) -> Connection:
        return cls(await trio.open_tcp_stream(host, port), host)

    async def request(self, method: str, target: str, body: bytes = b"") -> tuple[int, bytes]:
        headers = [("host", self.host), ("content-length", str(len(body)))]
        if body:
            headers.append(("content-type", "application/json"))
        data = self.h11.send(h11.Request(method=method, target=target, headers=headers))
        data += self.h11.send(h11.Data(data=body)) if body else b""
        data += self.h11.send(h11.EndOfMessage())
        await self.stream.send_all(data)
        status, chunks = 0, []
        while True:
            event = self.h11.next_event()
            if event is h11.NEED_DATA:
                self.h11.receive_data(await self.stream.receive_some(65536))
            elif isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                if self.h11.our_state is h11.MUST_CLOSE:
                    # Hypercorn ends a keep-alive connection after 1000 requests; reconnect.
                    address = self.stream.socket.getpeername()
                    await self.stream.aclose()
                    self.stream = await trio.open_tcp_stream(*address)
                    self.h11 = h11.Connection(h11.CLIENT)
                else:
                    self.h11.start_next_cycle()
                return status, b"".join(chunks)


async def peer_loop(host, port, stop_at, latencies: list[float], cycles: list[int]) -> None:
    conn = await Connection.open(host, port)
    status, body = await conn.request("POST", "/new_peer", b'{"expires_in":"5m"}')
    assert status == 200, (status, body)
    peer_id = int(body)
    done = 0
    while time.perf_counter() < stop_at:
        for method, body in (("PUT", b"1"), ("DELETE", b"")):
            started = time.perf_counter()
            status, answer = await conn.request(method, f"/peers/{peer_id}/bench", body)
            latencies.append(time.perf_counter() - started)
            assert status == 200, (method, status, answer)
        done += 1
    cycles.append(done)
    await conn.request("DELETE", f"/peers/{peer_id}")
    await conn.stream.aclose()


async def scenario(host: str, port: int, peers: int, duration: float) -> dict:
    # A short warm-up, then the measured run.
    for seconds in (min(1.0, duration / 5), duration):
        latencies: list[float] = []
        cycles: list[int] = []
        stop_at = time.perf_counter() + seconds
        started = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for _ in range(peers):
                nursery.start_soon(peer_loop, host, port, stop_at, latencies, cycles)
        elapsed = time.perf_counter() - started
    latencies.sort()
    return {
        "peers": peers,
        "cycles_per_s": sum(cycles) / elapsed,
        "requests_per_s": len(latencies) / elapsed,
        "p50_ms": statistics.median(latencies) * 1000,
        "p99_ms": latencies[int(len(latencies) * 0.99) - 1] * 1000,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per scenario")
    parser.add_argument(
        "--url", help="an already running node with a semaphore `bench` (max >= 32)"
    )
    parser.add_argument("--json", action="store_true", help="print the rows as JSON as well")
    args = parser.parse_args()

    node = None
    url = args.url
    if url is None:
        node = NodeProcess(CONFIG).start()
        url = node.url
    host, port = url.split("//", 1)[1].rsplit(":", 1)
    try:
        rows = [trio.run(scenario, host, int(port), n, args.duration) for n in (1, 32)]
    finally:
        if node is not None:
            node.stop()
    print(f"HTTP acquire+release against {url}, {args.duration:g} s per row")
    print(f"{'peers':>5}  {'cycles/s':>9}  {'requests/s':>10}  {'p50 ms':>7}  {'p99 ms':>7}")
    for row in rows:
        print(
            f"{row['peers']:>5}  {row['cycles_per_s']:>9.0f}  {row['requests_per_s']:>10.0f}  "
            f"{row['p50_ms']:>7.3f}  {row['p99_ms']:>7.3f}"
        )
    if args.json:
        print(json.dumps(rows))


if __name__ == "__main__":
    main()
