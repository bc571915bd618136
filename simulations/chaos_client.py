"""One client process of a chaos run (`simulations/chaos.py` starts a few):

    python -m simulations.chaos_client URL --name c0 --seed 7 --journal c0.jsonl

A `sluicegate.client.Client` on the load balancer's URL, with `--tasks` tasks locking A (max 1)
and B (max 3) as the simulation's clients do, and the simulation's rate task (checks of an
exact, a gossip and a lease-mode limiter, waits on the exact one:
`simulations.workload.rates`), until SIGTERM or SIGINT. Every WebSocket the client opens is
wrapped in `simulations.workload.Tap`, which records each rate-limit request as it leaves and
its answer as it arrives.

Everything goes to the journal at once, one JSON line each, stamped with `CLOCK`: every grant,
release and refusal (an `Event`), and every rate-limit request (a `RateSend`, numbered) when it
is sent and again when it is answered. A client killed or stuck still leaves what it saw; a
request it never saw answered stays unanswered.
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
from sluicegate.client.websocket import open_websocket

from .history import Event, History
from .workload import RateSend, Tap, rates

# The clock of the journals (the parent's faults too) and of the Tap's stamps: the wall clock,
# on which the nodes decide their rate limits' fixed windows (`RateLimitService`), so that the
# checkers place each decision in the nodes' windows. Every process on the machine shares it.
CLOCK = time.time
# A lock body lasts up to `SHORT_HOLD` seconds, or, one time in `LONG_HOLD_ONE_IN`, between 0.6
# and 1.6 peer expiries: heartbeats alone keep it (as in `simulations/run.py`).
SHORT_HOLD = 0.5
LONG_HOLD_ONE_IN = 10
LOCK_TIMEOUT = 10.0
# Written once the client is connected: the parent waits for it before the first fault.
CONNECTED = "connected"


class Journal(History):
    """A history that also writes to `out` as it happens, one JSON line each: every event, and
    every rate-limit request when sent and again when answered, with its number in this
    journal (`rate_send`) so that a reader keeps the last state of each."""

    def __init__(self, out: TextIO) -> None:
        super().__init__(clock=CLOCK)
        self._out = out
        self._numbers: dict[int, int] = {}  # id() of a send -> its number

    def rate_sent(self, send: RateSend) -> None:
        super().rate_sent(send)
        self._numbers[id(send)] = len(self.rate) - 1
        self._write({"rate_send": self._numbers[id(send)], **dataclasses.asdict(send)})

    def rate_answered(
        self, send: RateSend, at: float, decisions: list[dict] | None, error: str
    ) -> None:
        super().rate_answered(send, at, decisions, error)
        self._write({"rate_send": self._numbers[id(send)], **dataclasses.asdict(send)})

    def _add(self, event: Event) -> None:
        super()._add(event)
        self._write(dataclasses.asdict(event))

    def _write(self, record: dict) -> None:
        self._out.write(json.dumps(record) + "\n")
        self._out.flush()


def read_journal(text: str) -> tuple[list[Event], dict[int, RateSend]]:
    """The events and rate-limit requests (by number, in their last state) of a journal's
    complete lines (a client killed mid-write leaves half a line)."""
    events: list[Event] = []
    sends: dict[int, RateSend] = {}
    for line in text.splitlines(keepends=True):
        if line[-1:] != "\n":
            continue
        record = json.loads(line)
        number = record.pop("rate_send", None)
        if number is None:
            events.append(Event(**record))
        else:
            sends[number] = RateSend(**{**record, "retry_ids": tuple(record["retry_ids"])})
    return events, sends


async def run_client(
    url: str, name: str, seed: int, tasks: int, expires_in: float, journal: Journal
) -> None:
    rng = random.Random(seed)

    current: Tap | None = None

    async def open_tapped_websocket(url: str) -> Tap:
        nonlocal current
        # Behind the load balancer the client cannot tell which node it reached: the Tap reads
        # it from the node's welcome.
        tap = Tap(await open_websocket(url), name, None, journal, clock=CLOCK)
        current = tap.replaces(current)
        return current

    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as stop_signals:
        client = Client(
            [url],
            expires_in=expires_in,
            rng=random.Random(rng.getrandbits(64)),
            open_websocket=open_tapped_websocket,
        )
        async with client:
            journal.note(f"{name} {CONNECTED}")
            async with trio.open_nursery() as workload:
                for number in range(tasks):
                    task_rng = random.Random(rng.getrandbits(64))
                    workload.start_soon(
                        _locker, f"{name}.{number}", client, journal, task_rng, expires_in
                    )
                workload.start_soon(
                    rates, f"{name}.r", client, journal, random.Random(rng.getrandbits(64))
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
