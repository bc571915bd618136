"""Rate-limit decisions per second: a token bucket as a Redis Lua script against sluicegate.

    python bench/rate_limits.py [--duration 5] [--rounds 5] [--redis-server PATH]

1. Redis (from Debian's packages; `make bench` installs it), started here on a free loopback
   port, with the token bucket of seed 002 as a Lua script called through redis-py: one call at
   a time (sequential), then pipelined in batches of 100.
2. sluicegate, one node process on a free loopback port with the same bucket, our async
   client: one check at a time, then 64 tasks checking at once on one client (the client
   batches what they ask into shared frames).

The bucket never runs dry (capacity and rate of 10^9), so every decision costs the same on both
sides. The measurements take turns (as in bench/ws_semaphores.py) and pool them. Target:
sluicegate's 64 callers at least 1.5 x Redis+Lua pipelined.
"""

from __future__ import annotations

import argparse
import os
import resource
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


def redis_sequential(client, sha: str, duration: float) -> list[float]:
    latencies = []
    end = time.perf_counter() + duration
    while time.perf_counter() < end:
        started = time.perf_counter()
        client.evalsha(sha, 1, "bench", CAPACITY, RATE, time.time(), 1)
        latencies.append(time.perf_counter() - started)
    return latencies


def redis_pipelined(client, sha: str, duration: float) -> tuple[int, float]:
    done, started = 0, time.perf_counter()
    end = started + duration
    while time.perf_counter() < end:
        pipe = client.pipeline(transaction=False)
        for _ in range(PIPELINE):
            pipe.evalsha(sha, 1, "bench", CAPACITY, RATE, time.time(), 1)
        pipe.execute()
        done += PIPELINE
    return done, time.perf_counter() - started


async def sluicegate_sequential(url: str, duration: float) -> list[float]:
    latencies = []
    async with await sg.connect(url) as client:
        end = trio.current_time() + duration
        while trio.current_time() < end:
            started = trio.current_time()
            await client.check("bench")
            latencies.append(trio.current_time() - started)
    return latencies


async def sluicegate_concurrent(url: str, duration: float) -> tuple[int, float]:
    done = 0
    async with await sg.connect(url) as client:
        await client.check("bench")  # connected
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
        return done, trio.current_time() - started


def cpu_seconds(pid: int | None = None) -> float:
    """CPU time (user + system) of this process, or of process `pid` (Linux `/proc`)."""
    if pid is None:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per measurement")
    parser.add_argument("--rounds", type=int, default=5, help="turns each measurement is cut in")
    parser.add_argument("--redis-server", default=shutil.which("redis-server") or "redis-server")
    args = parser.parse_args()

    # Interleaved turns, pooled: what else the machine does weighs on both alike.
    turn = args.duration / args.rounds
    figures = {"redis_seq": [], "sg_seq": [], "redis_pipe": [0, 0.0], "sg_conc": [0, 0.0]}
    # CPU seconds spent by this client and by the node during the 64-caller turns.
    cpu = {"client": 0.0, "node": 0.0}
    workdir = Path(tempfile.mkdtemp(prefix="sluicegate-bench-"))
    with (
        RedisServer(args.redis_server) as redis_client,
        NodeProcess(CONFIG, workdir=workdir) as node,
    ):
        sha = redis_client.script_load(TOKEN_BUCKET)
        url = f"ws://127.0.0.1:{node.port}"
        for number in range(args.rounds):
            figures["redis_seq"] += redis_sequential(redis_client, sha, turn)
            figures["sg_seq"] += trio.run(sluicegate_sequential, url, turn)
            before = cpu_seconds(), cpu_seconds(node.process.pid)
            concurrent = trio.run(sluicegate_concurrent, url, turn)
            cpu["client"] += cpu_seconds() - before[0]
            cpu["node"] += cpu_seconds(node.process.pid) - before[1]
            for name, (done, seconds) in (
                ("redis_pipe", redis_pipelined(redis_client, sha, turn)),
                ("sg_conc", concurrent),
            ):
                figures[name][0] += done
                figures[name][1] += seconds
            print(f"  round {number + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    redis = {
        "sequential_rate": len(figures["redis_seq"]) / sum(figures["redis_seq"]),
        "p50_ms": statistics.median(figures["redis_seq"]) * 1000,
        "pipelined_rate": figures["redis_pipe"][0] / figures["redis_pipe"][1],
    }
    ours = {
        "sequential_rate": len(figures["sg_seq"]) / sum(figures["sg_seq"]),
        "p50_ms": statistics.median(figures["sg_seq"]) * 1000,
        "concurrent_rate": figures["sg_conc"][0] / figures["sg_conc"][1],
    }

    print(
        f"Rate-limit decisions, token bucket, {args.duration:g} s per measurement "
        f"in {args.rounds} turns"
    )
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
    checks = figures["sg_conc"][0]
    print(
        f"    CPU per check: client {cpu['client'] / checks * 1e6:.1f} us, "
        f"node {cpu['node'] / checks * 1e6:.1f} us (the client's includes connecting)"
    )
    ratio = ours["concurrent_rate"] / redis["pipelined_rate"]
    print(f"  sluicegate {TASKS} callers / Redis pipelined: {ratio:.2f}x (target >= 1.50x)")


if __name__ == "__main__":
    main()
