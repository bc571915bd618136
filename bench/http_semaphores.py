"""Acquire+release cycles over Throttle's HTTP API: throughput and latency, 1 and 32 peers, in
plain text and over TLS.

    python bench/http_semaphores.py [--duration 5] [--url http://127.0.0.1:8000]

Without --url it starts its own node processes on free loopback ports: one in plain text, and
one with TLS (a certificate made for the run, TLS 1.3), and reports TLS's cost as the ratio of
its rows to the plain ones, measured in the same run. Each peer has its own
keep-alive connection and loops `PUT /peers/{id}/bench` (count 1) then `DELETE /peers/{id}/bench`.
The semaphore's max (64) exceeds the number of peers, so no acquire ever waits: this measures the
cost of the path, not of contention. The client is h11 on trio, the same event loop the node uses,
and shares the machine's cores with the node.
"""

from __future__ import annotations

import argparse
import json
import ssl
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import h11
import trio
import trustme

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.nodes import NodeProcess, node_files, tls_section  # noqa: E402

CONFIG = "[semaphores]\nbench = 64\n"


# How a connection's stream is opened: plain, or over TLS.
Opener = Callable[[], Awaitable[trio.abc.Stream]]


class Connection:
    """One keep-alive HTTP/1.1 connection."""

    def __init__(self, opener: Opener, stream: trio.abc.Stream, host: str) -> None:
        self.opener = opener
        self.stream = stream
        self.host = host.encode()
        self.h11 = h11.Connection(h11.CLIENT)

    @classmethod
    async def open(cls, host: str, port: int, context: ssl.SSLContext | None) -> Connection:
        async def opener() -> trio.abc.Stream:
            if context is None:
                return await trio.open_tcp_stream(host, port)
            return await trio.open_ssl_over_tcp_stream(
                host, port, ssl_context=context, https_compatible=True
            )

        return cls(opener, await opener(), host)

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
                    await self.stream.aclose()
                    self.stream = await self.opener()
                    self.h11 = h11.Connection(h11.CLIENT)
                else:
                    self.h11.start_next_cycle()
                return status, b"".join(chunks)


async def peer_loop(
    host, port, context, stop_at, latencies: list[float], cycles: list[int]
) -> None:
    conn = await Connection.open(host, port, context)
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


async def scenario(
    host: str, port: int, context: ssl.SSLContext | None, peers: int, duration: float
) -> dict:
    # A short warm-up, then the measured run.
    for seconds in (min(1.0, duration / 5), duration):
        latencies: list[float] = []
        cycles: list[int] = []
        stop_at = time.perf_counter() + seconds
        started = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for _ in range(peers):
                nursery.start_soon(peer_loop, host, port, context, stop_at, latencies, cycles)
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

    targets = []  # (name, url, TLS context)
    nodes = []
    if args.url is None:
        ca = trustme.CA()
        workdir = Path(tempfile.mkdtemp(prefix="sluicegate-bench-"))
        config = CONFIG + tls_section(**node_files(ca, workdir), minimum_version="1.3")
        nodes = [NodeProcess(CONFIG).start(), NodeProcess(config, workdir=workdir).start()]
        context = ssl.create_default_context()
        ca.configure_trust(context)
        targets = [("plain", nodes[0].url, None), ("TLS", nodes[1].url, context)]
    else:
        targets = [("given", args.url, None)]
    rows = []
    try:
        for peers in (1, 32):
            for name, url, context in targets:
                host, port = url.split("//", 1)[1].rsplit(":", 1)
                row = trio.run(scenario, host, int(port), context, peers, args.duration)
                rows.append({"node": name, **row})
    finally:
        for node in nodes:
            node.stop()
    print(f"HTTP acquire+release, {args.duration:g} s per row")
    header = f"{'node':>5}  {'peers':>5}  {'cycles/s':>9}  {'requests/s':>10}  {'p50 ms':>7}"
    print(f"{header}  {'p99 ms':>7}")
    for row in rows:
        print(
            f"{row['node']:>5}  {row['peers']:>5}  {row['cycles_per_s']:>9.0f}  "
            f"{row['requests_per_s']:>10.0f}  {row['p50_ms']:>7.3f}  {row['p99_ms']:>7.3f}"
        )
    if len(targets) == 2:
        for plain, secure in zip(rows[::2], rows[1::2], strict=True):
            print(
                f"  TLS / plain, {plain['peers']} peers: cycles/s "
                f"{secure['cycles_per_s'] / plain['cycles_per_s']:.2f}x, p50 "
                f"{secure['p50_ms'] / plain['p50_ms']:.2f}x"
            )
    if args.json:
        print(json.dumps(rows))


if __name__ == "__main__":
    main()
