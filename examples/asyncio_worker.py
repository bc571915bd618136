"""A plain asyncio worker: fetches a list of URLs politely (no more than the `crawl` limiter
allows per host) and writes each result while holding a share of `A`.

    pip install sluicegate
    make run   # a node on 127.0.0.1:8000 with deploy/example.toml, in another terminal
    python examples/asyncio_worker.py ws://127.0.0.1:8000

It stands in for the fetch and the write with sleeps, and prints what it did.
"""

from __future__ import annotations

import asyncio
import sys
import time
from urllib.parse import urlsplit

from sluicegate import client as sluicegate

URLS = [f"https://{host}/page/{n}" for host in ("a.example", "b.example") for n in range(3)]


async def crawl(client: sluicegate.Client, url: str, started: float) -> None:
    host = urlsplit(url).hostname
    # Waits in line at the node for the host's turn: 2 fetches per host in any second.
    async with client.rate_limited("crawl", key=host, timeout=30):
        fetched_at = time.monotonic() - started
        await asyncio.sleep(0.01)  # the fetch
    async with client.lock("A", timeout=10) as lease:
        await asyncio.sleep(0.01)  # the write, fenced with lease.fencing_token
    print(f"{url} fetched at {fetched_at:.1f} s, written with token {lease.fencing_token}")


async def main(urls: list[str]) -> None:
    started = time.monotonic()
    async with await sluicegate.connect(urls) as client:
        async with asyncio.TaskGroup() as tasks:
            for url in URLS:
                tasks.create_task(crawl(client, url, started))
    print(f"done: {len(URLS)} pages in {time.monotonic() - started:.1f} s")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:] or ["ws://127.0.0.1:8000"]))
