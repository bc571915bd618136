"""One client process of a chaos run (`simulations/chaos.py` starts a few):

    python -m simulations.chaos_client URL --name c0 --seed 7 --journal c0.jsonl

A `sluicegate.client.Client` on the load balancer's URL, with `--tasks` tasks locking A (max 1)
and B (max 3) as the simulation's clients do, until SIGTERM or SIGINT. Every grant, release and
refusal goes to the journal at once, one JSON line per event, stamped with `time.monotonic()`:
Linux's monotonic clock is the same in every process, so the journals of all clients and the
parent's faults merge into one history. A client killed or stuck still leaves what it saw.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import signal
import time
from pathlib import Path
from typing import TextIO

import trio

from sluicegate.client.client import Client

from .history import Event, History

# A lock body lasts up to `SHORT_HOLD` seconds, or, one time in `LONG_HOLD_ONE_IN`, between 0.6
# and 1.6 peer expiries: heartbeats alone keep it (as in `simulations/run.py`).
SHORT_HOLD = 0.5
LONG_HOLD_ONE_IN = 10
LOCK_TIMEOUT = 10.0
# Written once the client is connected: the parent waits for it before the first fault.
CONNECTED = "connected"


class Journal(History):
    """A history that also writes each event to `out` as it happens, one JSON line each."""

    def __init__(self, out: TextIO) -> None:
        super().__init__(clock=time.monotonic)
        self._out = out

    def _add(self, event: Event) -> None:
        super()._add(event)
        self._out.write(json.dumps(dataclasses.asdict(event)) + "\n")
        self._out.flush()


def read_journal(text: str) -> list[Event]:
    """The events of a journal's complete lines (a client killed mid-write leaves half a line)."""
    return [
        Event(**json.loads(line)) for line in text.splitlines(keepends=True) if line[-1:] == "\n"
    ]


async def run_client(
    url: str, name: str, seed: int, tasks: int, expires_in: float, journal: Journal
) -> None:
    rng = random.Random(seed)
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as stop_signals:
        client = Client([url], expires_in=expires_in, rng=random.Random(rng.getrandbits(64)))
        async with client:
            journal.note(f"{name} {CONNECTED}")
            async with trio.open_nursery() as workload:
                for number in range(tasks):
                    task_rng = random.Random(rng.getrandbits(64))
                    workload.start_soon(
                        _locker, f"{name}.{number}", client, journal, task_rng, expires_in
                    )
                async for _ in stop_signals:
                    break
                workload.cancel_scope.cancel()
    journal.note(f"{name} stopped")


async def _locker(
    name: str, client: Client, history: History, rng: random.Random, expires_in: float
) -> None:
    long_hold = (expires_in * 0.6, expires_in * 1.6)
    while True:
        semaphore, count = rng.choice([("A", 1), ("B", 1), ("B", 2)])
        try:
            async with client.lock(semaphore, count=count, timeout=LOCK_TIMEOUT) as lease:
                history.granted(name, semaphore, count, lease.fencing_token, lease.peer_id)
                try:
                    long = rng.randrange(LONG_HOLD_ONE_IN) == 0
                    await trio.sleep(
                        rng.uniform(*long_hold) if long else rng.uniform(0, SHORT_HOLD)
                    )
                finally:
                    history.released(name, semaphore, count, lease.lost)
        except Exception as error:  # noqa: BLE001 (every refusal is part of the history)
            why = " ".join(str(error).split())  # the node's message, on one line
            history.refused(name, semaphore, f"{type(error).__name__}: {why}"[:200])
        await trio.sleep(rng.uniform(0, 0.2))


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m simulations.chaos_client", description=__doc__)
    parser.add_argument("url", help="ws://host:port/ws of the load balancer")
    parser.add_argument("--name", required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--tasks", type=int, default=2)
    parser.add_argument("--expires-in", type=float, required=True)
    parser.add_argument("--journal", type=Path, required=True)
    args = parser.parse_args()
    with open(args.journal, "a", encoding="utf-8") as out:
        journal = Journal(out)
        trio.run(run_client, args.url, args.name, args.seed, args.tasks, args.expires_in, journal)


if __name__ == "__main__":
    main()
