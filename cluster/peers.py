"""The home's side of peers: expiry, held and pending locks, and every peer-level rule.

In a cluster, a peer's home (the owner of its slot) serialises the peer's operations across
semaphores owned by other nodes: it runs acquire checks 1 to 8 of THROTTLE_API.md (configuration,
expiry update, count, unknown peer, idempotency, levels, one pending lock) and only then asks the
semaphore's owner for check 9, whether the count fits. The peer counts as pending from that moment
until the owner's grant arrives (`granted`).

Each lock a peer asks for gets the next number of the peer's ticket counter: messages about the
lock quote it, and an owner ignores anything below the latest ticket it has seen of the peer
(docs/cluster.md, O3). A client may number its operations on a peer (`op`); one numbered below
the highest applied is stale and refused.

Pure: `now` comes in; expiry is driven by `next_deadline()` and `expire(now)` over a lazy heap.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace

from .errors import (
    AlreadyPending,
    BeyondLimit,
    InvalidLockCount,
    LockHierarchyViolation,
    LockNeverAcquirable,
    QuotaFull,
    RestoreConflict,
    ShrinkingLockCount,
    StaleOperation,
    UnknownPeer,
    UnknownSemaphore,
)
from .semaphore_leases import SemaphoreConfig
from .slots import STRETCH

# Peers expired in one step at most (about 10 ms of work): the rest are due at once, and an
# actor expires them in its next steps, after whatever else is ready (500,000 peers expiring in
# one step stalled a node for 8.8 s).
EXPIRE_CHUNK = 1000


@dataclass(frozen=True)
class PeerRemoved:
    """A peer is gone, deleted by its client or expired; a request waiting for it must fail."""

    peer_id: int
    expired: bool


@dataclass(frozen=True, slots=True)
class PeerRecord:
    """One peer as written to its slot's acceptors: its remaining lifetime (not a deadline: no
    clock is shared); `lease`, the lifetime its client last asked for; its locks with their
    tickets, and the fencing tokens of those held; the next ticket; the highest numbered client
    operation applied."""

    peer_id: int
    expires_in: float
    lease: float
    held: Mapping[str, int]
    pending_semaphore: str | None
    pending_count: int
    tickets: Mapping[str, int]
    tokens: Mapping[str, int]
    next_ticket: int
    last_op: int

    @property
    def key(self) -> int:
        return self.peer_id

    def aged(self, elapsed: float) -> PeerRecord:
        """This record `elapsed` seconds later, after a hop (`STRETCH`)."""
        return replace(self, expires_in=max(0.0, self.expires_in * STRETCH - elapsed))


@dataclass(frozen=True)
class AskOwner:
    """Acquire passed every peer-level check: the semaphore's owner decides (check 9) the lock
    of this `ticket`."""

    semaphore: str
    count: int
    ticket: int


class _Peer:
    __slots__ = ("held", "pending", "expires_at", "lease", "tickets", "tokens", "next_ticket", "op")

    def __init__(self, expires_at: float, held: dict[str, int], lease: float = 0.0) -> None:
        self.held = held
        # The one lock this peer waits for, (semaphore, count), or None.
        self.pending: tuple[str, int] | None = None
        self.expires_at = expires_at
        # The lifetime its client last asked for (a heartbeat, or an acquire's `expires_in`).
        self.lease = lease
        # The ticket of each lock held or pending, and the token of each held one.
        self.tickets: dict[str, int] = {}
        self.tokens: dict[str, int] = {}
        self.next_ticket = 1
        # The highest numbered operation of its client applied (0: none).
        self.op = 0

    def locks(self) -> list[str]:
        """Semaphores this peer holds or waits for: what its owners must release when it goes."""
        names = list(self.held)
        if self.pending is not None:
            names.append(self.pending[0])
        return names

    def ticket(self, semaphore: str) -> int:
        ticket = self.tickets[semaphore] = self.next_ticket
        self.next_ticket += 1
        return ticket


class PeerTable:
    def __init__(
        self,
        semaphores: Mapping[str, SemaphoreConfig],
        most: int = 100_000,
        restore_count: int = 1_000_000,
        group_of: Callable[[int], int] | None = None,
    ) -> None:
        """`most`: the most peers `new_peer` and `restore` bring the table to (peers a slot
        brings along when this node takes it over are never refused); `restore_count`: the
        largest count a restore may claim for one lock; `group_of`: a peer id's group (a
        cluster home's: its slot), to drop a group's peers without looking at the others."""
        self._config = dict(semaphores)
        self._most = most
        self._restore_count = restore_count
        self._peers: dict[int, _Peer] = {}
        self._group_of = group_of
        self._groups: dict[int, set[int]] = {}
        # (expires_at, peer_id); an entry is stale once the peer is gone or its expiry moved.
        self._expiry: list[tuple[float, int]] = []

    # -- peers -------------------------------------------------------------------------------

    def new_peer(
        self,
        expires_at: float,
        rng: random.Random,
        homed_here: Callable[[int], bool] = lambda peer_id: True,
        lease: float = 0.0,
    ) -> int:
        """A new peer with a random id; in a cluster, an id whose home is this node."""
        self._make_room()
        while True:
            peer_id = rng.getrandbits(64)
            if peer_id not in self._peers and homed_here(peer_id):
                break
        self._add(peer_id, _Peer(expires_at, {}, lease))
        return peer_id

    def numbered(self, peer_id: int, op: int | None) -> None:
        """The client's operation number `op` (None: unnumbered): refuse it as stale below the
        highest applied, else note it as applied."""
        if op is None:
            return
        peer = self._peer(peer_id)
        if op < peer.op:
            raise StaleOperation(op, peer.op)
        peer.op = op

    def heartbeat(self, peer_id: int, expires_at: float, lease: float = 0.0) -> None:
        peer = self._peer(peer_id)
        peer.lease = lease
        self._set_expiry(peer, peer_id, expires_at)

    def remove(self, peer_id: int) -> list[tuple[str, int]] | None:
        """Delete a peer; its locks (semaphore, ticket) its owners must release, or None if it
        was not there."""
        peer = self._pop(peer_id)
        return _locks(peer) if peer is not None else None

    def is_acquired(self, peer_id: int) -> bool:
        return self._peer(peer_id).pending is None

    def peer_ids(self, low: int = 0, high: int = 2**64, most: float = math.inf) -> list[int] | None:
        """The ids from `low` to `high` (both included); None if they are more than `most`."""
        if low <= 0 and high >= 2**64 - 1:
            found = list(self._peers)
        else:
            found = [peer_id for peer_id in self._peers if low <= peer_id <= high]
        return found if len(found) <= most else None

    def has_peer(self, peer_id: int) -> bool:
        return peer_id in self._peers

    def __len__(self) -> int:
        return len(self._peers)

    def wants(self, peer_id: int, semaphore: str, ticket: int) -> bool:
        """Does the peer hold or wait for the lock of `ticket` on `semaphore`, or a later one?"""
        peer = self._peers.get(peer_id)
        return peer is not None and peer.tickets.get(semaphore, 0) >= ticket

    def holds(self, peer_id: int, semaphore: str) -> int | None:
        """The count the peer holds on `semaphore`; None unless it holds it."""
        peer = self._peers.get(peer_id)
        return peer.held.get(semaphore) if peer is not None else None

    def locks_of(self, peer_id: int) -> list[str]:
        """The semaphores the peer holds or waits for."""
        peer = self._peers.get(peer_id)
        return peer.locks() if peer is not None else []

    def pending(self, peer_id: int) -> tuple[str, int] | None:
        """The lock the peer waits for, (semaphore, count); None if it waits for none."""
        peer = self._peers.get(peer_id)
        return peer.pending if peer is not None else None

    def ticket(self, peer_id: int, semaphore: str) -> int | None:
        peer = self._peers.get(peer_id)
        return peer.tickets.get(semaphore) if peer is not None else None

    def token(self, peer_id: int, semaphore: str) -> int | None:
        """The fencing token of the peer's held lock on `semaphore`, once its owner said it."""
        peer = self._peers.get(peer_id)
        return peer.tokens.get(semaphore) if peer is not None else None

    def lease(self, peer_id: int) -> float:
        """The lifetime the peer's client last asked for."""
        return self._peer(peer_id).lease

    def locks(
        self, peer_ids: Iterable[int] | None = None
    ) -> Iterator[tuple[int, str, int, bool, int]]:
        """(peer id, semaphore, count, waiting?, ticket) of every lock of `peer_ids` (default:
        all)."""
        for peer_id in self._peers if peer_ids is None else peer_ids:
            peer = self._peers.get(peer_id)
            if peer is None:
                continue
            for name, count in peer.held.items():
                yield peer_id, name, count, False, peer.tickets[name]
            if peer.pending is not None:
                name, count = peer.pending
                yield peer_id, name, count, True, peer.tickets[name]

    # -- locks -------------------------------------------------------------------------------

    def acquire(
        self,
        peer_id: int,
        semaphore: str,
        count: int,
        now: float,
        expires_in: float | None = None,
        stretch: float = 1.0,
    ) -> bool | AskOwner:
        """Checks 1 to 8; the answer (all acquired?) when they settle it, else `AskOwner`.
        `expires_in` renews the peer, for `stretch` times that (a cluster's home: STRETCH)."""
        config = self._config.get(semaphore)
        if config is None:
            raise UnknownSemaphore(semaphore)
        if count > config.max:
            raise LockNeverAcquirable(count, config.max)
        if expires_in is not None:
            self._peer(peer_id).lease = expires_in
            self._set_expiry(self._peer(peer_id), peer_id, now + expires_in * stretch)
        if count < 1:
            raise InvalidLockCount(count)
        peer = self._peer(peer_id)

        previous = peer.held.get(semaphore)
        if previous is None and peer.pending is not None and peer.pending[0] == semaphore:
            previous = peer.pending[1]
        if previous is not None:
            if count == previous:
                return peer.pending is None
            if count < previous:
                raise ShrinkingLockCount()
            raise LockHierarchyViolation(config.level, config.level)

        if peer.held:
            current = min(self._config[name].level for name in peer.held)
            if current <= config.level:
                raise LockHierarchyViolation(current, config.level)
        if peer.pending is not None:
            raise AlreadyPending()
        peer.pending = (semaphore, count)
        return AskOwner(semaphore, count, peer.ticket(semaphore))

    def granted(self, peer_id: int, semaphore: str, ticket: int, token: int) -> bool:
        """The owner granted the lock of `ticket` (with `token`); False if the peer no longer
        waits for that lock (then the owner holds a lock nobody wants and must release it)."""
        peer = self._peers.get(peer_id)
        if peer is None or peer.tickets.get(semaphore) != ticket:
            return False
        if peer.pending is not None and peer.pending[0] == semaphore:
            peer.held[semaphore] = peer.pending[1]
            peer.pending = None
        elif semaphore not in peer.held:
            return False
        peer.tokens[semaphore] = token
        return True

    def release_lock(self, peer_id: int, semaphore: str) -> int | None:
        """Release a held lock or withdraw the pending one; the ticket the owner must be told
        of, or None if there was nothing to release."""
        if semaphore not in self._config:
            raise UnknownSemaphore(semaphore)
        peer = self._peer(peer_id)
        if peer.held.pop(semaphore, None) is None:
            if peer.pending is None or peer.pending[0] != semaphore:
                return None
            peer.pending = None
        peer.tokens.pop(semaphore, None)
        return peer.tickets.pop(semaphore)

    def restore(
        self,
        peer_id: int,
        acquired: Mapping[str, int],
        expires_at: float,
        lease: float = 0.0,
        op: int | None = None,
    ) -> dict[str, int] | None:
        """Recreate a forgotten peer holding `acquired`; the tickets of its locks if created,
        None if an identical peer exists already (accepted as it is, its expiry untouched)."""
        for name in acquired:
            if name not in self._config:
                raise UnknownSemaphore(name)
        for name, count in acquired.items():
            if count < 1:
                raise InvalidLockCount(count)
            if count > self._restore_count:
                # Above max is allowed (max may have shrunk since the lock was granted); this
                # much would starve the semaphore for the peer's whole life.
                raise BeyondLimit(
                    "restore_count", f"a restore of count {count} of {name!r} is too large"
                )
        existing = self._peers.get(peer_id)
        if existing is not None:
            if existing.pending is None and existing.held == dict(acquired):
                return None
            raise RestoreConflict()
        self._make_room()
        peer = _Peer(expires_at, dict(acquired), lease)
        peer.op = op or 0
        tickets = {name: peer.ticket(name) for name in acquired}
        self._add(peer_id, peer)
        return tickets

    # -- records -----------------------------------------------------------------------------

    def snapshot(self, now: float, peer_ids: Iterable[int] | None = None) -> list[PeerRecord]:
        """Records of the peers `peer_ids` (default: all), with lifetimes remaining from `now`."""
        chosen = self._peers if peer_ids is None else peer_ids
        return [
            PeerRecord(
                peer_id,
                peer.expires_at - now,
                peer.lease,
                dict(peer.held),
                peer.pending[0] if peer.pending else None,
                peer.pending[1] if peer.pending else 0,
                dict(peer.tickets),
                dict(peer.tokens),
                peer.next_ticket,
                peer.op,
            )
            for peer_id, peer in ((p, self._peers[p]) for p in chosen)
        ]

    def load(self, records: Iterable[PeerRecord], now: float) -> list[int]:
        """Take on the peers of `records` (a slot this node now acts for); returns their ids.

        A heartbeat that kept a peer's lease wrote nothing, so its record's expiry may be older
        than the one the previous home last set; that home stopped before now, so a whole lease
        from now (`STRETCH`ed, for clock drift) is later than any expiry it set."""
        loaded = []
        for record in records:
            expires_in = max(record.expires_in, record.lease * STRETCH)
            peer = _Peer(now + expires_in, dict(record.held), record.lease)
            if record.pending_semaphore is not None:
                peer.pending = (record.pending_semaphore, record.pending_count)
            peer.tickets = dict(record.tickets)
            peer.tokens = dict(record.tokens)
            peer.next_ticket = record.next_ticket
            peer.op = record.last_op
            self._add(record.peer_id, peer)
            loaded.append(record.peer_id)
        return loaded

    def drop(self, group: int) -> list[int]:
        """Forget the peers of `group` (their slot is another node's now); their ids."""
        gone = list(self._groups.pop(group, ()))
        for peer_id in gone:
            del self._peers[peer_id]
        return gone

    # -- time --------------------------------------------------------------------------------

    def next_deadline(self) -> float | None:
        """When `expire` has work to do next; None while there is no peer."""
        self._drop_stale_expiry()
        return self._expiry[0][0] if self._expiry else None

    def expire(
        self,
        now: float,
        spared: Callable[[int], bool] = lambda peer_id: False,
        most: float = math.inf,
    ) -> list[tuple[int, list[tuple[str, int]]]]:
        """Remove the peers whose deadline is at or before `now` (unless `spared`, for now), at
        most `most` of them, soonest first: (peer id, its locks (semaphore, ticket))."""
        expired = []
        later = []
        while len(expired) < most:
            self._drop_stale_expiry()
            if not self._expiry or self._expiry[0][0] > now:
                break
            entry = heapq.heappop(self._expiry)
            if spared(entry[1]):
                later.append(entry)
                continue
            expired.append((entry[1], _locks(self._pop(entry[1]))))
        for entry in later:
            heapq.heappush(self._expiry, entry)
        return expired

    def expire_peer(self, peer_id: int, now: float) -> list[tuple[str, int]] | None:
        """Remove the peer if its deadline is at or before `now`: its locks (semaphore,
        ticket); None if it is not due (or not here)."""
        peer = self._peers.get(peer_id)
        if peer is None or peer.expires_at > now:
            return None
        self._pop(peer_id)  # its entry in the expiry heap is stale now
        return _locks(peer)

    # -- internals ---------------------------------------------------------------------------

    def _pop(self, peer_id: int) -> _Peer | None:
        peer = self._peers.pop(peer_id, None)
        if peer is not None and self._group_of is not None:
            key = self._group_of(peer_id)
            group = self._groups[key]
            group.discard(peer_id)
            if not group:
                del self._groups[key]
        return peer

    def _make_room(self) -> None:
        if len(self._peers) >= self._most:
            raise QuotaFull("peers", f"this node holds {len(self._peers)} peers, the most it may")

    def _peer(self, peer_id: int) -> _Peer:
        peer = self._peers.get(peer_id)
        if peer is None:
            raise UnknownPeer(peer_id)
        return peer

    def _add(self, peer_id: int, peer: _Peer) -> None:
        if self._group_of is not None and peer_id not in self._peers:
            self._groups.setdefault(self._group_of(peer_id), set()).add(peer_id)
        self._peers[peer_id] = peer
        heapq.heappush(self._expiry, (peer.expires_at, peer_id))

    def _set_expiry(self, peer: _Peer, peer_id: int, expires_at: float) -> None:
        peer.expires_at = expires_at
        heapq.heappush(self._expiry, (expires_at, peer_id))
        # Every heartbeat leaves a stale entry behind; rebuild before they outnumber the peers.
        if len(self._expiry) > 2 * len(self._peers) + 64:
            self._expiry = [(p.expires_at, pid) for pid, p in self._peers.items()]
            heapq.heapify(self._expiry)

    def _drop_stale_expiry(self) -> None:
        heap = self._expiry
        while heap:
            expires_at, peer_id = heap[0]
            peer = self._peers.get(peer_id)
            if peer is not None and peer.expires_at == expires_at:
                return
            heapq.heappop(heap)


def _locks(peer: _Peer) -> list[tuple[str, int]]:
    return [(name, peer.tickets[name]) for name in peer.locks()]
