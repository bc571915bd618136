"""Where a cluster lock's CPU goes: the three-node cluster of `bench/cluster_vs_peers.py`, one
worker locking and unlocking a mutex at a node that does not own it, for `--duration` seconds,
while py-spy samples each node's Python stacks holding the GIL (so CPU, not waiting). Prints the
cycles per second, the servers' CPU per cycle, and each node's samples by the part of the node
they were in. Issue 39's rule: profile before you optimise.

    .venv/bin/python bench/cluster_profile.py                 # 15 s, 200 samples a second
    .venv/bin/python bench/cluster_profile.py --raw /tmp/prof # keep py-spy's raw stacks too

py-spy comes with the `bench` extra; it reads other processes' memory, so it needs ptrace
rights (root, or `kernel.yama.ptrace_scope = 0`).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.cluster_vs_peers import server_cpu  # noqa: E402
from bench.peers.sluicegate import CLIENT_NODE, Sluicegate  # noqa: E402
from sluicegate import client as sg  # noqa: E402

# The parts of a node, by a frame that marks each; a sample counts for the first that matches.
PARTS = [
    ("node links: WebSocket reader and wsproto", "WebSocketConnection._reader_task"),
    ("node links: send loop, encoding, socket", "Link._send_loop"),
    ("node links: decoding frames", "Codec.decode"),
    ("node links: handing messages to the actor", "Links._deliver_current"),
    ("shard actor: every rule, replication too", "ShardActor.run"),
    ("/ws shell: the client's connection", "ws_shell"),
    ("membership and gossip", "embership"),
]
SCHEDULER = "trio's scheduler and I/O wait"


def part_of(stack: str) -> str:
    for part, marker in PARTS:
        if marker in stack:
            return part
    leaf = stack.rsplit(";", 1)[-1]
    return SCHEDULER if "trio/_core" in leaf else "elsewhere"


def parts(raw: Path) -> tuple[int, Counter[str]]:
    """py-spy's raw output (`stack count` per line): all samples, and samples by part."""
    samples: Counter[str] = Counter()
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        samples[part_of(stack)] += int(count)
    return sum(samples.values()), samples


async def lock_loop(url: str, name: str, seconds: float) -> tuple[int, float]:
    async with await sg.connect(url) as client:
        async with client.lock(name):  # connected, the peer made: not measured
            pass
        cycles, started = 0, time.monotonic()
        while time.monotonic() - started < seconds:
            async with client.lock(name):
                pass
            cycles += 1
        return cycles, time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=15.0, help="seconds of locking")
    parser.add_argument("--rate", type=int, default=200, help="py-spy's samples a second")
    parser.add_argument("--raw", type=Path, help="a directory for py-spy's raw stacks")
    args = parser.parse_args()
    py_spy = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if py_spy is None:
        sys.exit("py-spy is not installed: .venv/bin/python -m pip install -e '.[bench]'")
    out = args.raw or Path(tempfile.mkdtemp(prefix="cluster-profile-"))
    out.mkdir(parents=True, exist_ok=True)
    system = Sluicegate()
    workdir = Path(tempfile.mkdtemp(prefix="cluster-profile-nodes-"))
    print("starting three nodes ...", file=sys.stderr)
    system.start(workdir)
    spies: list[subprocess.Popen] = []
    try:
        pids = system.members()
        for node_id, pid in pids.items():
            command = [py_spy, "record", "--gil", "-p", str(pid)]
            command += ["-d", str(int(args.duration) + 2), "-r", str(args.rate)]
            command += ["-f", "raw", "-o", str(out / f"{node_id}.txt")]
            spies.append(subprocess.Popen(command, stdout=subprocess.DEVNULL))
        time.sleep(1)  # py-spy attached
        print(f"locking for {args.duration:g} s ...", file=sys.stderr)
        before = server_cpu(pids)
        url = f"ws://127.0.0.1:{system.nodes[CLIENT_NODE].port}"
        cycles, took = anyio.run(lock_loop, url, system.locks[0], args.duration, backend="trio")
        cpu = server_cpu(pids) - before
        for spy in spies:
            spy.wait(timeout=args.duration + 30)
    finally:
        for spy in spies:
            spy.kill()
        system.stop()
    print(
        f"{cycles} cycles in {took:.1f} s: {cycles / took:.1f} cycles/s, "
        f"{1000 * took / cycles:.2f} ms a cycle, {1000 * cpu / cycles:.2f} ms of server CPU per "
        f"cycle; the client at {CLIENT_NODE}, the lock's owner {system.serving()}"
    )
    for node_id in pids:
        total, samples = parts(out / f"{node_id}.txt")
        role = "owner" if node_id == system.serving() else "entry" if node_id == CLIENT_NODE else ""
        print(f"{node_id} {role}: {total} samples holding the GIL ({total / args.rate:.1f} s)")
        for part, count in samples.most_common():
            print(f"  {100 * count / total:5.1f} %  {part}")
    print(f"raw stacks: {out}")


if __name__ == "__main__":
    main()
