"""Quorum writes of a slot's records (docs/cluster.md, O2).

* `SlotCopy` is an acceptor's copy of one slot: the records it accepted last, with the ballot and
  version of the write that made them. A write applies if it follows the version the copy holds
  (or is the whole slot); otherwise the owner must send the slot whole.
* `SlotWriter` is an owner's side of one slot in one ballot: the versions it wrote, which
  acceptor holds which, and so which version is committed (held by a quorum).
* `CommitGate` holds back what a node would say (answers, messages) until the writes made before
  it are committed, and fails it if one of them never will be.

Records are the home's peers and the owner's semaphores (`PeerRecord`, `SemaphoreRecord`); each
has a `key` unique within its slot and ages by `aged(elapsed)`: its remaining lifetimes shrink by
`elapsed`, after growing by `STRETCH` (one hop: no copy runs out before its original).

Pure: `now` comes in.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

from .peers import PeerRecord
from .semaphore_leases import SemaphoreRecord
from .slots import NO_BALLOT, Ballot

Record = PeerRecord | SemaphoreRecord
# At most this many records go in one message (a slot's copy, whole, may be sent in parts).
PART_RECORDS = 2000


@dataclass(frozen=True, slots=True)
class Accept:
    """A write: the records of `slot` that changed (or all of them, `whole`), and the keys of
    those that are gone, as version `version` of `ballot`."""

    slot: int
    ballot: Ballot
    version: int
    whole: bool
    records: list[PeerRecord | SemaphoreRecord]
    gone: list[int | str]


@dataclass(frozen=True, slots=True)
class Accepted:
    """An acceptor holds `version` of `ballot` for `slot` (0: none of it; the owner sends the
    slot whole)."""

    slot: int
    ballot: Ballot
    version: int


def quorum(voters: Collection[str]) -> int:
    """How many voters make a quorum: more than half."""
    return len(voters) // 2 + 1


class SlotCopy:
    """An acceptor's copy of one slot."""

    __slots__ = ("accepted", "version", "_records")

    def __init__(self) -> None:
        self.accepted = NO_BALLOT
        self.version = 0
        # key -> (the record as it arrived, when by this node's clock)
        self._records: dict[int | str, tuple[Record, float]] = {}

    def apply(self, write: Accept, now: float) -> bool:
        """Apply `write` if it follows this copy (or is whole); False if it does not."""
        if write.ballot == self.accepted and write.version <= self.version:
            return True  # had it already (a whole copy sent again, or a repeat)
        if write.whole:
            self._records = {record.key: (record, now) for record in write.records}
        elif write.ballot != self.accepted or write.version != self.version + 1:
            return False
        else:
            for key in write.gone:
                self._records.pop(key, None)
            for record in write.records:
                self._records[record.key] = (record, now)
        self.accepted, self.version = write.ballot, write.version
        return True

    def records(self, now: float) -> list[Record]:
        """The records, their lifetimes counted down to `now`."""
        return [record.aged(now - arrived) for record, arrived in self._records.values()]

    def replace(self, ballot: Ballot, version: int, records: Iterable[Record], now: float) -> None:
        self._records = {record.key: (record, now) for record in records}
        self.accepted, self.version = ballot, version

    def clear(self) -> None:
        self.replace(NO_BALLOT, 0, (), 0.0)

    def __len__(self) -> int:
        return len(self._records)


class SlotWriter:
    """The versions an owner wrote of one slot under one ballot, and who holds them."""

    __slots__ = ("slot", "ballot", "version", "_held", "_whole_sent")

    def __init__(self, slot: int, ballot: Ballot) -> None:
        self.slot = slot
        self.ballot = ballot
        self.version = 0
        # member -> the version it told us it holds
        self._held: dict[str, int] = {}
        # member -> the version a whole copy was last sent it at (not again before news)
        self._whole_sent: dict[str, int] = {}

    def next_version(self) -> int:
        self.version += 1
        return self.version

    def held(self, member: str, version: int) -> bool:
        """`member` holds `version`; True if it needs the slot whole (it is behind what was
        sent it, and no whole copy is on its way since it said so)."""
        self._held[member] = max(self._held.get(member, 0), version)
        behind = self._held[member] < self.version
        if not behind or self._whole_sent.get(member, -1) >= version:
            return False
        self._whole_sent[member] = self.version
        return True

    def behind(self, voters: Iterable[str]) -> list[str]:
        """The `voters` that have not said they hold the latest version."""
        return sorted(m for m in voters if self._held.get(m, 0) < self.version)

    def sent_whole(self, member: str) -> None:
        """A whole copy of the latest version went to `member`."""
        self._whole_sent[member] = self.version

    def committed(self, voters: Collection[str]) -> int:
        """The highest version a quorum of `voters` holds."""
        versions = sorted((self._held.get(member, 0) for member in voters), reverse=True)
        return versions[quorum(voters) - 1] if versions else 0

    def pending(self, voters: Collection[str]) -> bool:
        return self.committed(voters) < self.version


T = TypeVar("T")


class CommitGate(Generic[T]):
    """What a node would say, held until the writes made before it are committed.

    Writes get increasing numbers. `hold(item)` keeps `item` behind every write made so far;
    `released()` gives back, in order, what no uncommitted write holds back any more, and
    `failed()` what a write that will never commit held back (its slot was lost)."""

    def __init__(self) -> None:
        self._next = 0
        # Writes not committed yet: number -> (slot, version).
        self._pending: dict[int, tuple[int, int]] = {}
        self._held: deque[tuple[int, T]] = deque()
        self._failed: list[T] = []

    def written(self, slot: int, version: int) -> None:
        self._next += 1
        self._pending[self._next] = (slot, version)

    def hold(self, item: T) -> None:
        self._held.append((self._next, item))

    def committed(self, slot: int, version: int) -> None:
        """Every write of `slot` up to `version` is committed."""
        for number, (s, v) in list(self._pending.items()):
            if s == slot and v <= version:
                del self._pending[number]

    def lost(self, slot: int) -> None:
        """`slot` is lost: its uncommitted writes never will be; what they held back fails."""
        numbers = [n for n, (s, _) in self._pending.items() if s == slot]
        if not numbers:
            return
        first = min(numbers)
        for number in numbers:
            del self._pending[number]
        kept: deque[tuple[int, T]] = deque()
        for mark, item in self._held:
            if mark >= first:
                self._failed.append(item)
            else:
                kept.append((mark, item))
        self._held = kept

    def released(self) -> list[T]:
        oldest = min(self._pending, default=self._next + 1)
        out = []
        while self._held and self._held[0][0] < oldest:
            out.append(self._held.popleft()[1])
        return out

    def failed(self) -> list[T]:
        failed, self._failed = self._failed, []
        return failed

    @property
    def waiting(self) -> int:
        """Items held back now."""
        return len(self._held)
