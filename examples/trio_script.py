"""A trio script: ten tasks share C (three at a time, cluster-wide), and the lock decorator
keeps a nightly job to one runner.

    pip install sluicegate trio
    make run   # a node on 127.0.0.1:8000 with deploy/example.toml, in another terminal
    python examples/trio_script.py ws://127.0.0.1:8000
"""

from __future__ import annotations

import sys

import trio

from sluicegate import client as sluicegate


async def main(urls: list[str]) -> None:
    async with await sluicegate.connect(urls) as client:
        inside = most = 0

        async def job(number: int) -> None:
            nonlocal inside, most
            async with client.lock("C", timeout=30):  # C = 3 in deploy/example.toml
                inside += 1
                most = max(most, inside)
                await trio.sleep(0.05)
                inside -= 1

        @client.lock("B", timeout=10)  # each call holds the mutex B
        async def nightly() -> int:
            return await client.remainder("B")

        async with trio.open_nursery() as nursery:
            for number in range(10):
                nursery.start_soon(job, number)
        print(f"10 jobs done, at most {most} at once")
        print(f"nightly ran holding B ({await nightly()} of B left meanwhile)")


if __name__ == "__main__":
    trio.run(main, sys.argv[1:] or ["ws://127.0.0.1:8000"])
