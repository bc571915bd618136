"""Rate-limit decisions per second: a token bucket as a Redis Lua script against sluicegate.

    python bench/rate_limits.py [--duration 5] [--redis-server /usr/bin/redis-server]

1. Redis (from Debian's packages; `make bench` installs it), started here on a free loopback
   port, with the token bucket of seed 002 as a Lua script called through redis-py: one call at
   a time (sequential), then pipelined in batches of 100.
2. sluicegate, one node process on a free loopback port with the same bucket, our async
   client: one check at a time, then 64 tasks checking at once on one client (the client
   batches what they ask into shared frames).

The bucket never runs dry (capacity and rate of 10^9), so every decision costs the same on both
sides. Target (issue 5): sluicegate's 64 callers at least 1.5 x Redis+Lua pipelined.
"""

from __future__ import annotations

import argparse
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from sluicegate import client as sg  # noqa: E402
from tests.nodes import NodeProcess  # noqa: E402

CAPACITY = RATE = 1_000_000_000
CONFIG = f"""
[rate_limits]
bench = {{ algorithm = "token_bucket", capacity = {CAPACITY}, rate = {RATE} }}
"""
PIPELINE = 100
TASKS = 64

# Seed 002's token bucket, taking the weight as well.
TOKEN_BUCKET = """
local key = KEYS[1]
local capacity = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
local now = tonumber(ARGV[3])
local n = tonumber(ARGV[4])
local tokens_key = key .. ":tokens"
local timestamp_key = key .. ":timestamp"
local tokens = tonumber(redis.call("get", tokens_key))
if not tokens then tokens = capacity end
local last_refreshed = tonumber(redis.call("get", timestamp_key))
if not last_refreshed then last_refreshed = now end
local delta = math.max(0, now - last_refreshed)
local filled_tokens = math.min(capacity, tokens + delta * rate)
local allowed = filled_tokens >= n
local new_tokens = filled_tokens
local new_timestamp = last_refreshed
if allowed then
  new_tokens = filled_tokens - n
  new_timestamp = now
end
redis.call("set", tokens_key, new_tokens)
redis.call("set", timestamp_key, new_timestamp)
return allowed
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class RedisServer:
    def __init__(self, executable: str) -> None:
        self.port = free_port()
        self.workdir = tempfile.mkdtemp(prefix="sluicegate-bench-redis-")
        self._process = subprocess.Popen(
            [
                executable,
                "--port", str(self.port),
                "--bind", "127.0.0.1",
                "--save", "",
                "--appendonly", "no",
                "--dir", self.workdir,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip

    def __enter__(self):
        import redis

        client = redis.Redis(host="127.0.0.1", port=self.port)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                return client
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def __exit__(self, *exc_info) -> None:
        self._process.kill()
        self._process.wait(10)
        shutil.rmtree(self.workdir, ignore_errors=True)


def redis_figures(client, duration: float) -> dict:
    """The fastest way redis-py offers: the script loaded once, then EVALSHA by its digest."""
    sha = client.script_load(TOKEN_BUCKET)
    latencies = []
    end = time.perf_counter() + duration
    while time.perf_counter() < end:
        started = time.perf_counter()
        client.evalsha(sha, 1, "bench", CAPACITY, RATE, time.time(), 1)
        latencies.append(time.perf_counter() - started)
    done, started = 0, time.perf_counter()
    end = started + duration
    while time.perf_counter() < end:
        pipe = client.pipeline(transaction=False)
        for _ in range(PIPELINE):
            pipe.evalsha(sha, 1, "bench", CAPACITY, RATE, time.time(), 1)
        pipe.execute()
        done += PIPELINE
    return {
        "sequential_rate": len(latencies) / sum(latencies),
        "p50_ms": statistics.median(latencies) * 1000,
        "pipelined_rate": done / (time.perf_counter() - started),
    }


async def sluicegate_figures(url: str, duration: float) -> dict:
    async with await sg.connect(url) as client:
        latencies = []
        end = trio.current_time() + duration
        while trio.current_time() < end:
            started = trio.current_time()
            await client.check("bench")
            latencies.append(trio.current_time() - started)
        done = 0
        started = trio.current_time()
        end = started + duration

        async def caller() -> None:
            nonlocal done
            while trio.current_time() < end:
                await client.check("bench")
                done += 1

        async with trio.open_nursery() as nursery:
            for _ in range(TASKS):
                nursery.start_soon(caller)
        return {
            "sequential_rate": len(latencies) / sum(latencies),
            "p50_ms": statistics.median(latencies) * 1000,
            "concurrent_rate": done / (trio.current_time() - started),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per measurement")
    parser.add_argument("--redis-server", default=shutil.which("redis-server") or "redis-server")
    args = parser.parse_args()

    print("Redis + Lua token bucket ...", file=sys.stderr, flush=True)
    with RedisServer(args.redis_server) as redis_client:
        redis = redis_figures(redis_client, args.duration)
    print("sluicegate ...", file=sys.stderr, flush=True)
    workdir = Path(tempfile.mkdtemp(prefix="sluicegate-bench-"))
    with NodeProcess(CONFIG, workdir=workdir) as node:
        ours = trio.run(sluicegate_figures, f"ws://127.0.0.1:{node.port}", args.duration)

    print(f"Rate-limit decisions, token bucket, {args.duration:g} s per measurement")
    print(
        f"  Redis + Lua, sequential            {redis['sequential_rate']:8.0f} /s   "
        f"p50 {redis['p50_ms']:.3f} ms"
    )
    print(f"  Redis + Lua, pipelined by {PIPELINE}       {redis['pipelined_rate']:8.0f} /s")
    print(
        f"  sluicegate, sequential             {ours['sequential_rate']:8.0f} /s   "
        f"p50 {ours['p50_ms']:.3f} ms"
    )
    print(f"  sluicegate, {TASKS} callers, one client  {ours['concurrent_rate']:8.0f} /s")
    ratio = ours["concurrent_rate"] / redis["pipelined_rate"]
    print(f"  sluicegate {TASKS} callers / Redis pipelined: {ratio:.2f}x (target >= 1.50x)")


if __name__ == "__main__":
    main()
