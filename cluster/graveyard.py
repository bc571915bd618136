"""What a core lets go of in bulk, freed a chunk a step.

CPython frees an object as soon as its last reference goes, so a table let go of at once is
freed at once: the 20,000 peers of the slots a node hands on when it stops took 50 ms of one
step of its loop to free. A core buries such a table (`bury`) instead of dropping it, and
whoever steps the core frees a chunk of what is buried each step (`free`) until none is left.

Pure: no clock, no I/O.
"""

from __future__ import annotations

# Entries freed a step: a peer with its locks takes about a microsecond to free.
FREE_CHUNK = 2000


class Graveyard:
    def __init__(self) -> None:
        self._graves: list[dict | list] = []

    def __bool__(self) -> bool:
        """Is anything left to free?"""
        return bool(self._graves)

    def bury(self, *remains: dict | list) -> None:
        """Keep each of `remains` (no one else refers to them any more) until `free` frees it."""
        self._graves.extend(each for each in remains if each)

    def free(self, most: int = FREE_CHUNK) -> None:
        """Free up to `most` entries of what is buried, the last buried first."""
        graves = self._graves
        while most > 0 and graves:
            grave = graves[-1]
            count = min(most, len(grave))
            if isinstance(grave, dict):
                for _ in range(count):
                    grave.popitem()
            else:
                del grave[-count:]
            most -= count
            if not grave:
                graves.pop()


class FreedAtOnce(Graveyard):
    """No graveyard: what is let go of is freed at once (a table nobody steps through `free`)."""

    def bury(self, *remains: dict | list) -> None:
        pass


FREED_AT_ONCE = FreedAtOnce()
