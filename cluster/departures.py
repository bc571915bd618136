"""Departed members: one that left gracefully or was forgotten took its copies with it, and a
new life's recovery read counts it among the voters until every slot has been written again
without it (docs/cluster.md, "A departure, then a crash").

Each node marks, for each departed life it knows of, the slots it acted for when a version it
first sent after learning of the departure was committed (`Settling`). That version's quorum
counted only the voters that remain, and each of them holds the slot's whole state up to it.
Every node gossips its marks (`MemberState.settled`, cluster/membership.py). A departure is
settled once the marks of all of them together cover every slot (`unsettled`). From then on
every committed write is on a quorum of the remaining voters, and the read argument holds
among them alone.

Pure: `now` comes in as an argument.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterable
from dataclasses import dataclass

from .slots import SLOTS

# A departed life: (node id, generation).
Departed = tuple[str, int]
EVERY_SLOT = (1 << SLOTS) - 1
SLOT_BYTES = SLOTS // 8


@dataclass(frozen=True, slots=True)
class Claim:
    """What one node says it settled of a departed life."""

    node_id: str
    generation: int
    # A bit per slot, little-endian: more bits than a wire's integer holds.
    slots: bytes


class Settling:
    """The slots this node's own writes settled, of each departure it knows of."""

    def __init__(self) -> None:
        # Departed life -> this node's marks (a bit per slot).
        self._marked: dict[Departed, int] = {}
        # The departures not yet settled everywhere -> when this node learned of each (a
        # version first sent since then was counted without it): only these are marked still,
        # on every commit (a hot path) and at every lease round.
        self._since: dict[Departed, float] = {}
        # Counts the changes of the marks: whoever gossips them looks here first.
        self.revision = 0

    def departures(
        self, departed: Collection[Departed], settled: Collection[Departed], now: float
    ) -> None:
        """The departed lives known now, and those settled everywhere (the marks of every
        node cover every slot): each of those is marked whole, so that it stays settled for a
        node that learns of it from this one alone."""
        before = dict(self._marked)
        for life in departed:
            if life not in self._marked:
                self._marked[life] = 0
                self._since[life] = now
        for life in list(self._marked):
            if life not in departed:  # it came back: a member again
                del self._marked[life]
                self._since.pop(life, None)
            elif life in settled:
                self._marked[life] = EVERY_SLOT
                self._since.pop(life, None)
        if self._marked != before:
            self.revision += 1

    def committed(self, slot: int, first_sent: float) -> None:
        """A version of `slot` this node first sent at `first_sent` is committed."""
        bit = 1 << slot
        for life, since in self._since.items():
            if first_sent >= since and not self._marked[life] & bit:
                self._marked[life] |= bit
                self.revision += 1

    def unmarked(self, slot: int) -> bool:
        """Is `slot` to be written again, for some departure?"""
        bit = 1 << slot
        return any(not self._marked[life] & bit for life in self._since)

    def claims(self) -> tuple[Claim, ...]:
        return tuple(
            Claim(node, generation, marked.to_bytes(SLOT_BYTES, "little"))
            for (node, generation), marked in sorted(self._marked.items())
        )


def unsettled(departed: Iterable[Departed], claims: Iterable[Claim]) -> set[Departed]:
    """The departed lives whose slots the claims of every node together do not yet cover."""
    covered: dict[Departed, int] = defaultdict(int)
    for claim in claims:
        covered[claim.node_id, claim.generation] |= int.from_bytes(claim.slots, "little")
    return {life for life in departed if covered[life] != EVERY_SLOT}


def reads_needed(voters: int, departed: int) -> int:
    """How many ready others a new life reads: n − q + 1 (that is, n − n // 2) of n, the
    voters and the departed lives not yet settled, which it reads as not answering. At most
    the voters less itself: past that, the departures and the crash that restarted it took a
    majority's memory, which no read can give back, so it counts as many departed lives as
    still leave a read possible."""
    counted = departed
    while counted and _reads(voters + counted) > voters - 1:
        counted -= 1
    return _reads(voters + counted)


def _reads(n: int) -> int:
    return n - (n // 2 + 1) + 1
