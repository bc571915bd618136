"""The owner's side of semaphores: who holds how much, who waits, and when a waiter is granted.

In a cluster, the ring owner of a semaphore is the only authority for grants on it. This core is
that authority: it sees requests that already passed every peer-level check at the peer's home
(levels, one pending lock, idempotency) and decides only whether the count fits now or waits, in
strict arrival order. Granting the next waiter costs O(1): each semaphore keeps its waiters in an
arrival-ordered queue and only ever looks at the head.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .errors import UnknownSemaphore


@dataclass(frozen=True)
class SemaphoreConfig:
    max: int
    level: int = 0


@dataclass(frozen=True)
class LockGranted:
    """A waiting lock was granted; its peer now holds all of its locks."""

    peer_id: int
    semaphore: str
    count: int


@dataclass(frozen=True)
class SemaphoreStats:
    name: str
    max: int
    acquired: int
    pending: int
    longest_pending: float


# Fencing tokens: epoch * 2**22 + grants so far. The epoch orders the owner's lives (a restarted
# owner continues above its previous tokens); 2**22 grants per semaphore fit in one epoch, and more
# only carry into the epoch part, which still increases.
TOKEN_EPOCH_SHIFT = 22


@dataclass(frozen=True, slots=True)
class LockRecord:
    """A lock at its semaphore's owner, as written to its slot's acceptors: the home's `ticket`
    for it, the fencing token it was granted with (0 while it waits), and its `place`, which
    orders a semaphore's holders (as they were granted) and its waiters (as they came)."""

    semaphore: str
    peer_id: int
    count: int
    ticket: int
    token: int
    waiting: bool
    place: int

    @property
    def key(self) -> str:
        return lock_key(self.semaphore, self.peer_id)

    def aged(self, elapsed: float) -> LockRecord:
        return self


@dataclass(frozen=True, slots=True)
class SemaphoreRecord:
    """One semaphore's own state as written to its slot's acceptors: the next fencing token
    and the next place. Each of its locks is a record of its own (`LockRecord`), so a write
    carries the locks that changed, not every holder and waiter."""

    name: str
    next_token: int
    next_place: int

    @property
    def key(self) -> str:
        return "s:" + self.name

    def aged(self, elapsed: float) -> SemaphoreRecord:
        return self


def lock_key(semaphore: str, peer_id: int) -> str:
    """The key of a lock's record in its slot: apart from a semaphore's ("s:...") and a peer's
    (an int)."""
    return f"l:{peer_id}:{semaphore}"


class WaitQueue:
    """Waiters in arrival order: peer id -> (count, waiting since). Two dicts of plain values,
    which the garbage collector stops walking once it has seen them: an `OrderedDict` was three
    references per waiter for every full collection, tens of thousands at once. A waiter's
    entry keeps its arrival number, the other dict the waiter of each number; the head is the
    smallest number still there, found by moving forward past those gone (each is passed once).
    """

    __slots__ = ("_entries", "_by_number", "_head", "_next")

    def __init__(self) -> None:
        self._entries: dict[int, tuple[int, int, float]] = {}
        self._by_number: dict[int, int] = {}
        self._head = 0
        self._next = 0

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, peer_id: int, count: int, since: float) -> None:
        """`peer_id` waits for `count` since `since`: at the end, or where it already stood."""
        entry = self._entries.get(peer_id)
        if entry is None:
            number = self._next
            self._next += 1
            self._by_number[number] = peer_id
        else:
            number = entry[0]
        self._entries[peer_id] = (number, count, since)

    def get(self, peer_id: int) -> tuple[int, float] | None:
        """The count `peer_id` waits for and since when; None if it does not wait."""
        entry = self._entries.get(peer_id)
        return None if entry is None else entry[1:]

    def pop(self, peer_id: int) -> tuple[int, float] | None:
        """Take `peer_id` out of the queue, wherever it stands: what `get` said."""
        entry = self._entries.pop(peer_id, None)
        if entry is None:
            return None
        del self._by_number[entry[0]]
        return entry[1:]

    def first(self) -> tuple[int, int, float] | None:
        """The waiter at the head: (peer id, count, since); None if none waits."""
        if not self._entries:
            self._head = self._next
            return None
        while self._head not in self._by_number:
            self._head += 1
        peer_id = self._by_number[self._head]
        return (peer_id, *self._entries[peer_id][1:])


class _Semaphore:
    __slots__ = (
        "name",
        "max",
        "acquired",
        "pending",
        "holders",
        "tokens",
        "tickets",
        "next_token",
        "queue",
        "places",
        "next_place",
        "grace_until",
    )

    def __init__(self, name: str, config: SemaphoreConfig, epoch: int) -> None:
        self.name = name
        self.max = config.max
        self.acquired = 0
        self.pending = 0
        self.holders: dict[int, int] = {}
        # Fencing token of each holder's grant.
        self.tokens: dict[int, int] = {}
        # The home's ticket of each holder's and waiter's lock (see `request`).
        self.tickets: dict[int, int] = {}
        self.next_token = epoch << TOKEN_EPOCH_SHIFT
        # Waiters in arrival order: peer id -> (count, waiting since).
        self.queue = WaitQueue()
        # Each lock's place: holders' in the order they were granted, waiters' as they came.
        self.places: dict[int, int] = {}
        self.next_place = 0
        # While set, a grace period runs until then: restores count, nothing new is granted.
        self.grace_until: float | None = None


class SemaphoreLeases:
    def __init__(self, semaphores: Mapping[str, SemaphoreConfig], epoch: int = 0) -> None:
        """`epoch` must grow from one life of the owner to the next (the node's start time in
        milliseconds does), so fencing tokens never repeat."""
        self._config = dict(semaphores)
        self._semaphores = {name: _Semaphore(name, cfg, epoch) for name, cfg in semaphores.items()}
        # The semaphores whose grace period runs: read on every wake-up, so not a scan of all.
        self._in_grace: set[str] = set()
        # The semaphores with holders or waiters (tickets): `any_in_use` on every wake-up.
        self._in_use: set[str] = set()
        self._events: list[LockGranted] = []
        # Restores that left a semaphore above its max (clients allowed it; operators watch it).
        self.restores_beyond_max = 0

    def request(
        self,
        peer_id: int,
        semaphore: str,
        count: int,
        now: float,
        ticket: int = 0,
    ) -> bool | None:
        """A lock asks for `count`: True if granted now, False if it waits in line, None if its
        ticket is below the latest this owner knows of the peer (a stale request: ignored).

        A new lock arrives last, so it may only be granted if everything already asked for
        (held or waiting) leaves room; otherwise it would overtake the waiters. The same ticket
        again (the home asking again) is the same lock; a larger one supersedes the peer's lock
        here (the home released it: the release may still be on its way).
        """
        sem = self._semaphore(semaphore)
        known = sem.tickets.get(peer_id)
        if known is not None:
            if ticket < known:
                return None
            if ticket == known:
                return peer_id in sem.holders
            self._drop(peer_id, sem)
            self._grant_waiters(sem)
        if sem.grace_until is None and sem.acquired + sem.pending + count <= sem.max:
            self._hold(sem, peer_id, count)
        else:
            sem.queue.put(peer_id, count, now)
            sem.pending += count
            _place(sem, peer_id)
        sem.tickets[peer_id] = ticket
        self._in_use.add(sem.name)
        return peer_id in sem.holders

    def release(self, peer_id: int, semaphore: str, ticket: int | None = None) -> None:
        """Release the peer's held lock or withdraw its waiting one, then grant who fits.

        With a `ticket`, only a lock of that ticket or an older one: a release that crossed a
        newer request of the same peer on the way must not drop the newer lock."""
        sem = self._semaphore(semaphore)
        known = sem.tickets.get(peer_id)
        if ticket is not None and (known is None or known > ticket):
            return
        if self._drop(peer_id, sem):
            self._grant_waiters(sem)

    def release_all(self, peer_id: int, semaphores: Iterable[str]) -> None:
        """A peer is gone: drop all its locks first, then grant waiters semaphore by semaphore."""
        self.release_peers([(peer_id, semaphores)])

    def release_peers(self, gone: Iterable[tuple[int, Iterable[str]]]) -> None:
        """Peers are gone together (expired at the same moment): drop all their locks before
        granting anyone, so no grant goes to a peer that is gone too."""
        affected: dict[str, _Semaphore] = {}
        for peer_id, semaphores in gone:
            for sem in map(self._semaphore, semaphores):
                if self._drop(peer_id, sem):
                    affected.setdefault(sem.name, sem)
        for sem in affected.values():
            self._grant_waiters(sem)

    def restore(self, peer_id: int, semaphore: str, count: int, ticket: int = 0) -> bool:
        """Count a lock a client says it holds, even beyond max: it is using the resource
        already. False if the ticket is below the latest this owner knows of the peer (stale).

        The same ticket again counts once and keeps its token; a larger one replaces the
        peer's lock here, with a new token (it may be one whose release was lost)."""
        sem = self._semaphore(semaphore)
        known = sem.tickets.get(peer_id)
        if known is not None and ticket < known:
            return False
        if known == ticket and sem.holders.get(peer_id) == count:
            return True
        if known is not None:
            self._drop(peer_id, sem)
        self._hold(sem, peer_id, count)
        sem.tickets[peer_id] = ticket
        self._in_use.add(sem.name)
        if sem.acquired > sem.max:
            self.restores_beyond_max += 1
        return True

    def header(self, name: str) -> SemaphoreRecord:
        """The semaphore's own record."""
        sem = self._semaphore(name)
        return SemaphoreRecord(name, sem.next_token, sem.next_place)

    def lock_record(self, name: str, peer_id: int) -> LockRecord | None:
        """The record of the peer's lock on `name`; None if it has none there."""
        sem = self._semaphore(name)
        count = sem.holders.get(peer_id)
        if count is not None:
            token = sem.tokens[peer_id]
            return LockRecord(
                name, peer_id, count, sem.tickets[peer_id], token, False, sem.places[peer_id]
            )
        waiting = sem.queue.get(peer_id)
        if waiting is None:
            return None
        ticket, place = sem.tickets[peer_id], sem.places[peer_id]
        return LockRecord(name, peer_id, waiting[0], ticket, 0, True, place)

    def holdings(self, semaphore: str) -> list[tuple[int, int]]:
        """(peer id, ticket) of every holder and waiter of `semaphore`."""
        sem = self._semaphore(semaphore)
        return list(sem.tickets.items())

    def load(self, records: Iterable[SemaphoreRecord | LockRecord], now: float, epoch: int) -> None:
        """Take on the semaphores of `records` (whose slot this node now acts for), in place of
        what was known of them here. Tokens continue from the record's counter, and at least in
        `epoch` (a new era's: above every token of the eras before). Holders and waiters go back
        to their places; the waiters' waiting starts `now`."""
        headers: dict[str, SemaphoreRecord] = {}
        locks: dict[str, list[LockRecord]] = {}
        for record in records:
            if isinstance(record, SemaphoreRecord):
                headers[record.name] = record
            else:
                locks.setdefault(record.semaphore, []).append(record)
        for name, header in headers.items():
            old = self._semaphores.get(name)
            if old is None:
                # A semaphore another node defines and this one does not (members configured
                # otherwise): its records stay on the acceptors as they were, for an owner that
                # defines it.
                continue
            self._in_grace.discard(name)
            sem = self._semaphores[name] = _Semaphore(name, self._config[name], 0)
            sem.next_token = max(header.next_token, old.next_token, epoch << TOKEN_EPOCH_SHIFT)
            ordered = sorted(locks.get(name, ()), key=lambda lock: lock.place)
            sem.next_place = max(header.next_place, *(lock.place + 1 for lock in ordered), 0)
            for lock in ordered:
                if not lock.waiting:
                    sem.holders[lock.peer_id] = lock.count
                    sem.tokens[lock.peer_id] = lock.token
                    sem.tickets[lock.peer_id] = lock.ticket
                    sem.places[lock.peer_id] = lock.place
                    sem.acquired += lock.count
            for lock in ordered:
                if lock.waiting:
                    sem.queue.put(lock.peer_id, lock.count, now)
                    sem.tickets[lock.peer_id] = lock.ticket
                    sem.places[lock.peer_id] = lock.place
                    sem.pending += lock.count
            if sem.tickets:
                self._in_use.add(sem.name)
            else:
                self._in_use.discard(sem.name)

    def start_epoch(self, names: Iterable[str], epoch: int) -> None:
        """Tokens of `names` go on in `epoch` at least (a new era started them empty)."""
        for name in names:
            sem = self._semaphores[name]
            sem.next_token = max(sem.next_token, epoch << TOKEN_EPOCH_SHIFT)

    def ticket(self, peer_id: int, semaphore: str) -> int | None:
        return self._semaphore(semaphore).tickets.get(peer_id)

    def drop(self, names: Iterable[str]) -> None:
        """Forget the semaphores `names` (another node acts for them now); tokens keep
        counting."""
        for name in names:
            old = self._semaphores[name]
            sem = self._semaphores[name] = _Semaphore(name, self._config[name], 0)
            self._in_grace.discard(name)
            self._in_use.discard(name)
            sem.next_token = old.next_token

    def in_use(self, name: str) -> bool:
        sem = self._semaphore(name)
        return bool(sem.tickets)

    def any_in_use(self) -> bool:
        return bool(self._in_use)

    def start_grace(self, until: float, names: Iterable[str] | None = None) -> None:
        """After a takeover the holders are not known yet: until `until`, accept their restores
        but grant nothing new on `names` (default: all) (it could exceed max); waiters queue in
        arrival order meanwhile."""
        for name in self._semaphores if names is None else names:
            self._semaphores[name].grace_until = until
            self._in_grace.add(name)

    def in_grace(self) -> list[str]:
        return sorted(self._in_grace)

    @property
    def grace_until(self) -> float | None:
        """When the next grace period ends; None while none runs."""
        ends = [self._semaphores[n].grace_until for n in self._in_grace]
        return min([end for end in ends if end is not None], default=None)

    def end_grace(self, now: float) -> bool:
        """End the grace periods whose time has come, granting the waiters that fit."""
        ended = []
        for name in self._in_grace:
            until = self._semaphores[name].grace_until
            if until is None or now >= until:
                ended.append(name)
        for name in ended:
            self._in_grace.discard(name)
            sem = self._semaphores[name]
            sem.grace_until = None
            self._grant_waiters(sem)
        return bool(ended)

    def token(self, peer_id: int, semaphore: str) -> int | None:
        """The fencing token of the peer's grant on `semaphore`; None unless it holds a lock."""
        return self._semaphore(semaphore).tokens.get(peer_id)

    def grant(self, peer_id: int, semaphore: str) -> tuple[int, int]:
        """(ticket, fencing token) of a lock the peer holds; KeyError if it holds none."""
        sem = self._semaphore(semaphore)
        return sem.tickets[peer_id], sem.tokens[peer_id]

    def remainder(self, semaphore: str) -> int:
        sem = self._semaphore(semaphore)
        return sem.max - sem.acquired

    def stats(self, now: float, names: Iterable[str] | None = None) -> list[SemaphoreStats]:
        result = []
        for sem in self._semaphores.values() if names is None else map(self._semaphore, names):
            oldest = sem.queue.first()
            longest = now - oldest[2] if oldest is not None else 0.0
            result.append(SemaphoreStats(sem.name, sem.max, sem.acquired, sem.pending, longest))
        return result

    def events(self) -> list[LockGranted]:
        """Grants of waiting locks since the last call, in order."""
        events, self._events = self._events, []
        return events

    def _semaphore(self, name: str) -> _Semaphore:
        sem = self._semaphores.get(name)
        if sem is None:
            raise UnknownSemaphore(name)
        return sem

    def _drop(self, peer_id: int, sem: _Semaphore) -> bool:
        count = sem.holders.pop(peer_id, None)
        if count is not None:
            sem.acquired -= count
            del sem.tokens[peer_id]
        else:
            waiting = sem.queue.pop(peer_id)
            if waiting is None:
                return False
            sem.pending -= waiting[0]
        sem.tickets.pop(peer_id, None)
        del sem.places[peer_id]
        if not sem.tickets:
            self._in_use.discard(sem.name)
        return True

    def _grant_waiters(self, sem: _Semaphore) -> None:
        # Strict FIFO: stop at the first waiter that does not fit, so a large count is never
        # starved by small ones arriving after it. Nobody is granted during a grace period.
        if sem.grace_until is not None:
            return
        room = sem.max - sem.acquired
        queue = sem.queue
        while (first := queue.first()) is not None:
            peer_id, count, _ = first
            if count > room:
                return
            queue.pop(peer_id)
            room -= count
            sem.pending -= count
            self._hold(sem, peer_id, count)
            self._events.append(LockGranted(peer_id, sem.name, count))

    def _hold(self, sem: _Semaphore, peer_id: int, count: int) -> None:
        sem.holders[peer_id] = count
        sem.acquired += count
        sem.tokens[peer_id] = sem.next_token
        sem.next_token += 1
        _place(sem, peer_id)


def _place(sem: _Semaphore, peer_id: int) -> None:
    """The lock of `peer_id` goes last among the holders or the waiters it just joined."""
    sem.places[peer_id] = sem.next_place
    sem.next_place += 1
