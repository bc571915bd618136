"""What the clients saw, stamped by one clock (virtual time in a simulation, a clock every
process shares in a real run): the record the checkers judge, and the trace."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import trio

from .clocks import TimeOfDay
from .rate_taps import RateLog
from .servers import ServerLog

if TYPE_CHECKING:
    from .workload import RateSend


@dataclass(frozen=True, slots=True)
class Event:
    at: float
    # Locks: "asked", "granted", "released", "refused". The protected resource: "write" (sent),
    # "applied", "rejected". Rate limits: "rate" (an answer; the sends are `History.rate`).
    # Faults: "fault", "healed", "whole" (every node serves again and agrees on the members);
    # "down" and "up": a node's life ended (crashed, left, or a task of it raised) or began;
    # "outage": no majority anywhere ("begins"), or again ("ends").
    # Broken promises the run itself finds: "stuck" (liveness), "failure" (a task raised).
    # And "note".
    kind: str
    who: str
    semaphore: str = ""
    count: int = 0
    token: int | None = None
    peer_id: int = 0
    detail: str = ""


class History:
    def __init__(self, clock: Callable[[], float] = trio.current_time) -> None:
        """`clock` stamps the events: trio's clock in a simulation (virtual time); in a real
        run, the wall clock (`time.time`), which all processes share and the nodes decide
        their rate limits' windows on."""
        self.events: list[Event] = []
        self.operations = 0
        self._clock = clock
        # Every rate-limit request on the wire, in the order sent.
        self.rate: list[RateSend] = []
        # What the nodes did with their slots and exact rate limits (a simulation taps them;
        # a chaos run cannot).
        self.servers = ServerLog()
        self.deciders = RateLog()
        # Each node's time of day, in a run whose nodes read one of their own (`wall`).
        self.times_of_day: dict[str, TimeOfDay] = {}

    def asked(self, who: str, semaphore: str, count: int) -> None:
        self._add(Event(self._clock(), "asked", who, semaphore, count))

    def granted(
        self, who: str, semaphore: str, count: int, token: int | None, peer_id: int
    ) -> None:
        self.operations += 1
        self._add(Event(self._clock(), "granted", who, semaphore, count, token, peer_id))

    def released(self, who: str, semaphore: str, count: int, lost: bool) -> None:
        self.operations += 1
        detail = "lost" if lost else ""
        self._add(Event(self._clock(), "released", who, semaphore, count, detail=detail))

    def refused(self, who: str, semaphore: str, why: str) -> None:
        self.operations += 1
        self._add(Event(self._clock(), "refused", who, semaphore, detail=why))

    def write_sent(self, who: str, token: int) -> None:
        self._add(Event(self._clock(), "write", who, "A", token=token))

    def wrote(self, who: str, token: int, applied: bool) -> None:
        kind = "applied" if applied else "rejected"
        self._add(Event(self._clock(), kind, who, "A", token=token))

    def rate_sent(self, send: RateSend) -> None:
        self.rate.append(send)

    def rate_answered(
        self, send: RateSend, at: float, decisions: list[dict] | None, error: str
    ) -> None:
        """`send` answered at `at` with a decision (a map) per time asked, or an `error`."""
        self.operations += send.times
        send.answered, send.error = at, error
        if decisions is not None:
            send.goes = [decision["go"] for decision in decisions]
            send.remaining = [decision["remaining"] for decision in decisions]
        outcome = error or " ".join("go" if go else "sorry" for go in send.goes)
        self._add(
            Event(
                at,
                "rate",
                send.client,
                send.limiter,
                send.n,
                detail=f"{send.op} {send.key} at {send.node} sent {send.sent:.4f}: {outcome}",
            )
        )

    def lease_went(self, who: str, limiter: str, key: str, n: int) -> None:
        """A check of `key` of a lease-mode limiter went, decided by client `who` from its
        slice (an event of kind "leased", its key the detail)."""
        self.operations += 1
        self._add(Event(self._clock(), "leased", who, limiter, n, detail=key))

    def fault(self, kind: str, victim: str, lasting: float) -> None:
        self._add(Event(self._clock(), "fault", victim, detail=f"{kind} for {lasting:.2f}s"))

    def healed(self, kind: str, victim: str) -> None:
        self._add(Event(self._clock(), "healed", victim, detail=kind))

    def down(self, node_id: str, left: bool = False) -> None:
        """A life of `node_id` ended: it crashed (or a task of it raised), or it `left`
        gracefully (it resigned its slots first)."""
        self._add(Event(self._clock(), "down", node_id, detail="left" if left else ""))

    def up(self, node_id: str) -> None:
        self._add(Event(self._clock(), "up", node_id))

    def outage(self, begins: bool) -> None:
        """No majority of the nodes can talk to each other (from now on, or no longer)."""
        self._add(Event(self._clock(), "outage", "-", detail="begins" if begins else "ends"))

    def whole(self) -> None:
        self._add(Event(self._clock(), "whole", "-"))

    def stuck(self, text: str) -> None:
        """A promise of liveness not kept (the checkers report it)."""
        self._add(Event(self._clock(), "stuck", "-", detail=text))

    def failure(self, who: str, text: str) -> None:
        """A task of a node (or a client) raised: a violation of its own."""
        self._add(Event(self._clock(), "failure", who, detail=text))

    def note(self, text: str) -> None:
        self._add(Event(self._clock(), "note", "-", detail=text))

    def lines(self) -> list[str]:
        return [
            f"{e.at:10.4f} {e.kind:<8} {e.who:<6} {e.semaphore} {e.count or ''}"
            f"{'' if e.token is None else f' token={e.token}'}"
            f"{f' peer={e.peer_id}' if e.peer_id else ''} {e.detail}".rstrip()
            for e in self.events
        ]

    def _add(self, event: Event) -> None:
        self.events.append(event)
