"""Rate-limit decisions per second: a token bucket as a Redis Lua script against sluicegate.

    python bench/rate_limits.py [--duration 5] [--rounds 5] [--redis-server PATH]

1. Redis (from Debian's packages; `make bench` installs it), started here on a free loopback
   port, with the token bucket of seed 002 as a Lua script called through redis-py: one call at
   a time (sequential), then pipelined in batches of 100.
2. sluicegate, one node process on a free loopback port with the same bucket, our async
   client: one check at a time, then 64 tasks checking at once on one client (the client
   batches what they ask into shared frames).
3. The same bucket in lease mode (our client decides from slices of it), one task and 64 tasks,
   beside the bucket's own checks in this process (the ceiling, no network at all).
4. Four client processes of 16 tasks each sharing one lease-mode key that runs dry (1,000
   tokens, 10,000 a second) for `--shared-seconds`: what went, against the configured rate.

The bucket never runs dry (capacity and rate of 10^9), so every decision costs the same on both
sides. The measurements take turns (as in bench/ws_semaphores.py) and pool them. Targets:
sluicegate's 64 callers at least 1.5 x Redis+Lua pipelined; in lease mode, one client at least
20 x Redis+Lua pipelined, and the four processes within 10% of the configured rate, never
beyond capacity + rate x t.
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
from sluicegate.cluster.rate_algorithms import TokenBucket  # noqa: E402
from tests.nodes import NodeProcess  # noqa: E402

CAPACITY = RATE = 1_000_000_000
# The four processes' key: it runs dry, so they share what it refills.
SHARED_CAPACITY, SHARED_RATE = 1_000, 10_000
CONFIG = f"""
[rate_limits]
bench = {{ algorithm = "token_bucket", capacity = {CAPACITY}, rate = {RATE} }}
leased = {{ algorithm = "token_bucket", capacity = {CAPACITY}, rate = {RATE}, mode = "lease" }}

[rate_limits.shared]
algorithm = "token_bucket"
capacity = {SHARED_CAPACITY}
rate = {SHARED_RATE}
mode = "lease"
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


async def sluicegate_sequential(url: str, duration: float, limiter: str = "bench") -> list[float]:
    latencies = []
    async with await sg.connect(url) as client:
        end = trio.current_time() + duration
        while trio.current_time() < end:
            started = trio.current_time()
            await client.check(limiter)
            latencies.append(trio.current_time() - started)
    return latencies


async def sluicegate_concurrent(url: str, duration: float, limiter: str) -> tuple[int, float]:
    done = 0
    async with await sg.connect(url) as client:
        await client.check(limiter)  # connected
        started = trio.current_time()
        end = started + duration

        async def caller() -> None:
            nonlocal done
            while trio.current_time() < end:
                await client.check(limiter)
                done += 1

        async with trio.open_nursery() as nursery:
            for _ in range(TASKS):
                nursery.start_soon(caller)
        return done, trio.current_time() - started


async def sluicegate_leased(url: str, duration: float, tasks: int) -> tuple[int, float]:
    """Checks of the lease-mode bucket from `tasks` tasks on one client, the clock read once
    every 1000 checks (as `in_process` does)."""
    done = 0
    async with await sg.connect(url) as client:
        await client.check("leased")  # connected, and a first slice
        started = time.perf_counter()
        end = started + duration

        async def caller() -> None:
            nonlocal done
            while time.perf_counter() < end:
                for _ in range(1000):
                    await client.check("leased")
                done += 1000

        async with trio.open_nursery() as nursery:
            for _ in range(tasks):
                nursery.start_soon(caller)
        return done, time.perf_counter() - started


def in_process(duration: float) -> tuple[int, float]:
    """The ceiling: the same token bucket's checks in this process, no network."""
    bucket = TokenBucket(CAPACITY, RATE)
    state = bucket.new_state(time.monotonic())
    done, started = 0, time.perf_counter()
    end = started + duration
    while time.perf_counter() < end:
        for _ in range(1000):
            bucket.check(state, 1, time.monotonic())
        done += 1000
    return done, time.perf_counter() - started


SHARER = """
import sys, trio
from sluicegate import client as sg

async def main(url, seconds):
    went = 0
    async with await sg.connect(url) as client:
        await client.check("shared")
        print("ready", flush=True)
        sys.stdin.readline()
        end = trio.current_time() + seconds

        async def caller():
            nonlocal went
            while trio.current_time() < end:
                decision = await client.check("shared")
                if decision.go:
                    went += 1
                else:
                    await trio.sleep(decision.retry_after)

        async with trio.open_nursery() as nursery:
            for _ in range(16):
                nursery.start_soon(caller)
    print(went, flush=True)

trio.run(main, sys.argv[1], float(sys.argv[2]))
"""


def shared_key(url: str, processes: int, seconds: float) -> int:
    """`processes` client processes, 16 tasks each, checking one lease-mode key for `seconds`
    from the same moment: how many went in all."""
    sharers = [
        subprocess.Popen(
            [sys.executable, "-c", SHARER, url, str(seconds)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(processes)
    ]
    try:
        for sharer in sharers:
            assert sharer.stdout is not None and sharer.stdout.readline().strip() == "ready"
        for sharer in sharers:
            assert sharer.stdin is not None
            sharer.stdin.write("go\n")
            sharer.stdin.flush()
        return sum(int(sharer.communicate(timeout=seconds + 30)[0]) for sharer in sharers)
    finally:
        for sharer in sharers:
            sharer.kill()


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
    parser.add_argument(
        "--shared-seconds", type=float, default=30.0, help="how long 4 processes share one key"
    )
    args = parser.parse_args()

    # Interleaved turns, pooled: what else the machine does weighs on both alike.
    turn = args.duration / args.rounds
    figures: dict[str, list] = {
        "redis_seq": [],
        "sg_seq": [],
        "lease_one": [0, 0.0],
        "redis_pipe": [0, 0.0],
        "sg_conc": [0, 0.0],
        "lease_conc": [0, 0.0],
        "in_process": [0, 0.0],
    }
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
            figures["sg_seq"] += trio.run(sluicegate_sequential, url, turn, "bench")
            before = cpu_seconds(), cpu_seconds(node.process.pid)
            concurrent = trio.run(sluicegate_concurrent, url, turn, "bench")
            cpu["client"] += cpu_seconds() - before[0]
            cpu["node"] += cpu_seconds(node.process.pid) - before[1]
            for name, (done, seconds) in (
                ("redis_pipe", redis_pipelined(redis_client, sha, turn)),
                ("sg_conc", concurrent),
                ("lease_one", trio.run(sluicegate_leased, url, turn, 1)),
                ("lease_conc", trio.run(sluicegate_leased, url, turn, TASKS)),
                ("in_process", in_process(turn)),
            ):
                figures[name][0] += done
                figures[name][1] += seconds
            print(f"  round {number + 1}/{args.rounds} done", file=sys.stderr, flush=True)
        shared = shared_key(url, 4, args.shared_seconds) if args.shared_seconds else None
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

    lease_one = figures["lease_one"][0] / figures["lease_one"][1]
    lease_many = figures["lease_conc"][0] / figures["lease_conc"][1]
    ceiling = figures["in_process"][0] / figures["in_process"][1]
    print("Lease mode: the client decides from slices of the key")
    print(f"  sluicegate lease, one task          {lease_one:8.0f} /s")
    print(f"  sluicegate lease, {TASKS} tasks        {lease_many:8.0f} /s")
    print(f"  in-process token bucket (ceiling)   {ceiling:8.0f} /s")
    for name, rate in (("one task", lease_one), (f"{TASKS} tasks", lease_many)):
        print(
            f"  lease {name} / Redis pipelined: {rate / redis['pipelined_rate']:.1f}x "
            f"(target >= 20x); / in-process: {rate / ceiling:.2f}x"
        )
    if shared is not None:
        seconds = args.shared_seconds
        configured = SHARED_RATE * seconds
        bound = SHARED_CAPACITY + SHARED_RATE * seconds
        print(
            f"  4 processes x 16 tasks on one key for {seconds:g} s: {shared} went; "
            f"the rate allows {configured:.0f} ({shared / configured:.3f}x, target 0.9 to "
            f"1.1x), the bound {bound:.0f}"
        )


if __name__ == "__main__":
    main()
