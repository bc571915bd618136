"""Quorum writes of a slot's records (docs/cluster.md, O2).

* `SlotCopy` is an acceptor's copy of one slot: the records it accepted last, with the ballot and
  version of the write that made them. A write applies if it follows the version the copy holds
  (or is the whole slot); otherwise the owner must send the slot whole.
* `SlotWriter` is an owner's side of one slot in one ballot: the versions it wrote, which
  acceptor holds which, and so which version is committed: held by a quorum at once, each
  acceptor's word counting only for `vote_life` after the write it answers was sent
  (docs/cluster.md, "Which life a vote belongs to").
* `CommitGate` holds back what a node would say (answers, messages) until the writes made before
  it are committed, and fails it if one of them never will be.

Records are the home's peers and the owner's semaphores and their locks (`PeerRecord`,
`SemaphoreRecord`, `LockRecord`); each has a `key` unique within its slot and ages by
`aged(elapsed)`: its remaining lifetimes shrink by `elapsed`, after growing by `STRETCH` (one hop:
no copy runs out before its original).

Pure: `now` comes in.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

from .peers import PeerRecord
from .semaphore_leases import LockRecord, SemaphoreRecord
from .slots import NO_BALLOT, Ballot

Record = PeerRecord | SemaphoreRecord | LockRecord
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
    records: list[PeerRecord | SemaphoreRecord | LockRecord]
    gone: list[int | str]


@dataclass(frozen=True, slots=True)
class Accepted:
    """An acceptor holds `version` of `ballot` for `slot` (0: it could not apply the write, as
    it does not follow what it holds; the owner sends the slot whole)."""

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
        # key -> the record as it arrived, and when by this node's clock (`_kept`)
        self._records: dict[int | str, tuple] = {}

    def apply(self, write: Accept, now: float) -> bool:
        """Apply `write` if it follows this copy (or is whole); False if it does not."""
        if write.ballot == self.accepted and write.version <= self.version:
            return True  # had it already (a whole copy sent again, or a repeat)
        if write.whole:
            self._records = {record.key: _kept(record, now) for record in write.records}
        elif write.ballot != self.accepted or write.version != self.version + 1:
            return False
        else:
            for key in write.gone:
                self._records.pop(key, None)
            for record in write.records:
                self._records[record.key] = _kept(record, now)
        self.accepted, self.version = write.ballot, write.version
        return True

    def records(self, now: float) -> list[Record]:
        """The records, their lifetimes counted down to `now`."""
        return [_restored(kept, now) for kept in self._records.values()]

    def replace(self, ballot: Ballot, version: int, records: Iterable[Record], now: float) -> None:
        self._records = {record.key: _kept(record, now) for record in records}
        self.accepted, self.version = ballot, version

    def clear(self) -> None:
        self.replace(NO_BALLOT, 0, (), 0.0)

    def __len__(self) -> int:
        return len(self._records)


def _kept(record: Record, now: float) -> tuple:
    """How a copy keeps a record that arrived at `now`: a tag, then plain values, which the
    garbage collector stops tracking. Every node keeps every peer and every lock of the cluster
    as an acceptor: as objects they made its full collections long (140 ms for 100,000 peers),
    and one semaphore kept as an object kept its slot's whole table of locks in them."""
    if isinstance(record, LockRecord):
        r = record
        return ("lock", r.semaphore, r.peer_id, r.count, r.ticket, r.token, r.waiting, r.place)
    if isinstance(record, PeerRecord):
        return (
            "peer",
            now,
            record.peer_id,
            record.expires_in,
            record.lease,
            tuple(record.held.items()),
            record.pending_semaphore,
            record.pending_count,
            tuple(record.tickets.items()),
            tuple(record.tokens.items()),
            record.next_ticket,
            record.last_op,
        )
    return ("semaphore", record.name, record.next_token, record.next_place)


def _restored(kept: tuple, now: float) -> Record:
    """The record `_kept` kept, its lifetimes counted down to `now` (locks and semaphores do
    not age)."""
    kind = kept[0]
    if kind == "lock":
        return LockRecord(*kept[1:])
    if kind == "semaphore":
        return SemaphoreRecord(*kept[1:])
    _, arrived, peer, expires_in, lease, held, pending, count, tickets, tokens, ticket, op = kept
    held, tickets, tokens = dict(held), dict(tickets), dict(tokens)
    record = PeerRecord(peer, expires_in, lease, held, pending, count, tickets, tokens, ticket, op)
    return record.aged(now - arrived)


class SlotWriter:
    """The versions an owner wrote of one slot under one ballot, and who holds them."""

    __slots__ = (
        "slot",
        "ballot",
        "version",
        "vote_life",
        "_committed",
        "committed_first_sent",
        "_sent",
        "_held",
        "_whole_sent",
        "_began",
        "_stalled_from",
    )

    def __init__(self, slot: int, ballot: Ballot, now: float, vote_life: float) -> None:
        self.slot = slot
        self.ballot = ballot
        self.version = 0
        self.vote_life = vote_life
        self._committed = 0
        # When the latest committed version was first sent (its quorum counted the voters of
        # then: cluster/departures.py).
        self.committed_first_sent = -math.inf
        # version -> when it was first sent, for the versions not committed yet: an acceptor
        # that says it holds one accepted it since then
        self._sent: dict[int, float] = {}
        # member -> the version it told us it holds
        self._held: dict[str, int] = {}
        # member -> the version a whole copy was last sent it at (not again before news)
        self._whole_sent: dict[str, int] = {}
        # member -> since when it has been behind without saying it holds anything newer
        # (one not in it: since the writer began)
        self._began = now
        self._stalled_from: dict[str, float] = {}

    def next_version(self, now: float) -> int:
        for member, version in self._held.items():
            if version == self.version:  # caught up until this write
                self._stalled_from[member] = now
        self.version += 1
        self._sent[self.version] = now
        return self.version

    def sent_at(self, version: int) -> float:
        """When `version`, not committed yet, was first sent."""
        return self._sent[version]

    def held(self, member: str, version: int, now: float) -> bool:
        """`member` holds `version`, or (0) could not apply what it was sent; True if it needs
        the slot whole: it said 0, and no whole copy is on its way to it. (A member that says
        a version below the latest is not missing anything: the writes after it are on their
        way, in order, on the same link.)"""
        before = self._held.get(member, 0)
        self._held[member] = max(before, version)
        if version > before:
            self._stalled_from[member] = now
        if version > 0:
            return False
        if self._held[member] < self._whole_sent.get(member, 0):
            return False  # the whole copy sent it is still on its way
        self._whole_sent[member] = self.version
        return True

    def stalled(self, voters: Iterable[str], now: float, patience: float) -> list[str]:
        """The `voters` behind the latest version that have said they hold nothing newer for
        `patience`: a write to them, or their answer, may be lost. (One that is behind but
        answering is only slow: sending it more would slow it further.)"""
        return sorted(
            member
            for member in voters
            if self._held.get(member, 0) < self.version
            and now - self._stalled_from.get(member, self._began) >= patience
        )

    def sent_whole(self, member: str, now: float) -> None:
        """A whole copy of the latest version went to `member`."""
        self._whole_sent[member] = self.version
        self._stalled_from[member] = now

    def committed(self, voters: Collection[str], now: float) -> int:
        """The highest version a quorum of `voters` holds, counting an acceptor's word only
        while the version it holds was sent at most `vote_life` ago. A word older than that
        may come from a life that has since died and recovered without it: its new life reads
        the others only once a quorum counted on this clock would have formed
        (docs/cluster.md)."""
        fresh = sorted(
            (
                held
                for member in voters
                if (held := self._held.get(member, 0)) > self._committed
                and now - self._sent[held] <= self.vote_life
            ),
            reverse=True,
        )
        need = quorum(voters)
        if len(fresh) >= need:
            self._committed = fresh[need - 1]
            self.committed_first_sent = self._sent[self._committed]
            sent = self._sent  # in the order written, which is the order of versions
            while sent and (oldest := next(iter(sent))) <= self._committed:
                del sent[oldest]
        return self._committed

    def pending(self, voters: Collection[str], now: float) -> bool:
        return self.committed(voters, now) < self.version


T = TypeVar("T")


class CommitGate(Generic[T]):
    """What a node would say, held until the writes made before it are committed.

    Writes get increasing numbers. `hold(item)` keeps `item` behind every write made so far;
    `released()` gives back, in order, what no uncommitted write holds back any more, and
    `failed()` what a write that will never commit held back (its slot was lost)."""

    def __init__(self) -> None:
        self._next = 0
        # Writes not committed yet: number -> (slot, version); their numbers in order (some
        # committed already: dropped when they come first); and per slot, (version, number).
        self._pending: dict[int, tuple[int, int]] = {}
        self._order: deque[int] = deque()
        self._by_slot: dict[int, deque[tuple[int, int]]] = {}
        self._held: deque[tuple[int, T]] = deque()
        self._failed: list[T] = []

    def written(self, slot: int, version: int) -> None:
        self._next += 1
        self._pending[self._next] = (slot, version)
        self._order.append(self._next)
        self._by_slot.setdefault(slot, deque()).append((version, self._next))

    def hold(self, item: T) -> None:
        self._held.append((self._next, item))

    def committed(self, slot: int, version: int) -> None:
        """Every write of `slot` up to `version` is committed."""
        writes = self._by_slot.get(slot)
        while writes and writes[0][0] <= version:
            del self._pending[writes.popleft()[1]]
        if writes is not None and not writes:
            del self._by_slot[slot]

    def lost(self, slot: int) -> None:
        """`slot` is lost: its uncommitted writes never will be; what they held back fails."""
        writes = self._by_slot.pop(slot, None)
        if not writes:
            return
        first = writes[0][1]
        for _, number in writes:
            del self._pending[number]
        kept: deque[tuple[int, T]] = deque()
        for mark, item in self._held:
            if mark >= first:
                self._failed.append(item)
            else:
                kept.append((mark, item))
        self._held = kept

    def released(self) -> list[T]:
        order = self._order
        while order and order[0] not in self._pending:
            order.popleft()
        oldest = order[0] if order else self._next + 1
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
