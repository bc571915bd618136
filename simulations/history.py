"""What the clients saw, stamped by one clock (virtual time in a simulation, a clock every
process shares in a real run): the record the checkers judge, and the trace."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import trio


@dataclass(frozen=True, slots=True)
class Event:
    at: float
    kind: str  # "granted", "released", "refused", "fault", "healed", "stuck", "note"
    who: str
    semaphore: str = ""
    count: int = 0
    token: int | None = None
    peer_id: int = 0
    detail: str = ""


class History:
    def __init__(self, clock: Callable[[], float] = trio.current_time) -> None:
        """`clock` stamps the events: trio's clock in a simulation (virtual time); a clock that
        all processes share in a real run (`time.monotonic`, system-wide on Linux)."""
        self.events: list[Event] = []
        self.operations = 0
        self._clock = clock

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

    def fault(self, kind: str, victim: str, lasting: float) -> None:
        self._add(Event(self._clock(), "fault", victim, detail=f"{kind} for {lasting:.2f}s"))

    def healed(self, kind: str, victim: str) -> None:
        self._add(Event(self._clock(), "healed", victim, detail=kind))

    def stuck(self, text: str) -> None:
        """A promise of liveness not kept (the checkers report it)."""
        self._add(Event(self._clock(), "stuck", "-", detail=text))

    def note(self, text: str) -> None:
        self._add(Event(self._clock(), "note", "-", detail=text))

    def lines(self) -> list[str]:
        return [
            f"{e.at:10.4f} {e.kind:<8} {e.who:<6} {e.semaphore} {e.count or ''}"
            f"{'' if e.token is None else f' token={e.token}'} {e.detail}".rstrip()
            for e in self.events
        ]

    def _add(self, event: Event) -> None:
        self.events.append(event)
