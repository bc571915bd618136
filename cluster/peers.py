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
from typing import Final, TypeVar, cast, overload

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
from .graveyard import FREED_AT_ONCE, Graveyard
from .peer_ids import stamped
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


R = TypeVar("R")

# A new peer's first ticket.
FIRST_TICKET = 1

# How far a new home raises each peer's next ticket (`raise_tickets`): above every ticket the
# homes before it may have sent ahead of its write.
TICKET_GAP = 2**20


def raise_tickets(records: list[R]) -> list[R]:
    """What a new owner of a slot writes of the copy it adopted: every peer's next ticket
    `TICKET_GAP` higher (docs/cluster.md, "Tickets across homes")."""
    return [
        cast(R, replace(r, next_ticket=r.next_ticket + TICKET_GAP))
        if isinstance(r, PeerRecord)
        else r
        for r in records
    ]


@dataclass(frozen=True)
class AskOwner:
    """Acquire passed every peer-level check: the semaphore's owner decides (check 9) the lock
    of this `ticket`."""

    semaphore: str
    count: int
    ticket: int


# A peer is one plain tuple, rebuilt on every change: (expires_at, lease, op, held, pending,
# tickets, tokens, next_ticket), where `lease` is the lifetime its client last asked for (a
# heartbeat's, or an acquire's `expires_in`), `op` the highest numbered operation of its client
# applied (0: none), `held`, `tickets` and `tokens` are ((semaphore, value), ...) in the order the
# locks were taken, and `pending` is the one lock it waits for, (semaphore, count), or None.
#
# The garbage collector stops tracking a tuple of plain values once it has looked at it, and a
# dict of untracked values with it, so a full collection does not walk the peers: an object per
# peer made a node's full collections 30 to 40 ms long at 100,000 peers. Such tuples must be built
# at run time: a constant tuple is frozen with the module and stays tracked.
Peer = tuple[float, float, int, tuple, "tuple[str, int] | None", tuple, tuple, int]
EXPIRES_AT: Final = 0
LEASE: Final = 1
OP: Final = 2
HELD: Final = 3
PENDING: Final = 4
TICKETS: Final = 5
TOKENS: Final = 6
NEXT_TICKET: Final = 7


@overload
def _get(pairs: tuple, key: str) -> int | None: ...
@overload
def _get(pairs: tuple, key: str, default: int) -> int: ...
def _get(pairs: tuple, key: str, default: int | None = None) -> int | None:
    for name, value in pairs:
        if name == key:
            return value
    return default


def _ticket(peer: Peer, name: str) -> int:
    """The ticket of a lock the peer holds or waits for (each has one)."""
    ticket = _get(peer[TICKETS], name)
    if ticket is None:
        raise KeyError(f"no ticket for {name!r}")
    return ticket


def _put(pairs: tuple, key: str, value: int) -> tuple:
    for index, pair in enumerate(pairs):
        if pair[0] == key:
            return pairs[:index] + ((key, value),) + pairs[index + 1 :]
    return pairs + ((key, value),)


def _without(pairs: tuple, key: str) -> tuple:
    for index, pair in enumerate(pairs):
        if pair[0] == key:
            return pairs[:index] + pairs[index + 1 :]
    return pairs


def _names(peer: Peer) -> list[str]:
    """Semaphores a peer holds or waits for: what their owners must release when it goes."""
    names = [name for name, _ in peer[HELD]]
    if peer[PENDING] is not None:
        names.append(peer[PENDING][0])
    return names


def _with_tickets(peer: Peer) -> list[tuple[str, int]]:
    return [(name, _ticket(peer, name)) for name in _names(peer)]


class PeerTable:
    def __init__(
        self,
        semaphores: Mapping[str, SemaphoreConfig],
        most: int = 100_000,
        restore_count: int = 1_000_000,
        group_of: Callable[[int], int] | None = None,
        graveyard: Graveyard = FREED_AT_ONCE,
    ) -> None:
        """`most`: the most peers `new_peer` and `restore` bring the table to (peers a slot
        brings along when this node takes it over are never refused); `restore_count`: the
        largest count a restore may claim for one lock; `group_of`: a peer id's group (a
        cluster home's: its slot), to drop a group's peers without looking at the others;
        `graveyard`: where dropped peers wait to be freed (by default, freed at once)."""
        self._graveyard = graveyard
        self._config = dict(semaphores)
        self._most = most
        self._restore_count = restore_count
        self._peers: dict[int, Peer] = {}
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
        key: bytes | None = None,
    ) -> int:
        """A new peer with a random id; in a cluster, an id whose home is this node; with a
        token's `key`, an id that names the token (cluster/peer_ids.py)."""
        self._make_room()
        while True:
            peer_id = rng.getrandbits(64)
            if key is not None:
                peer_id = stamped(key, peer_id)
            if peer_id not in self._peers and homed_here(peer_id):
                break
        self._add(peer_id, (expires_at, lease, 0, (), None, (), (), FIRST_TICKET))
        return peer_id

    def numbered(self, peer_id: int, op: int | None) -> None:
        """The client's operation number `op` (None: unnumbered): refuse it as stale below the
        highest applied, else note it as applied."""
        if op is None:
            return
        peer = self._peer(peer_id)
        if op < peer[OP]:
            raise StaleOperation(op, peer[OP])
        if op != peer[OP]:
            self._peers[peer_id] = cast(Peer, (*peer[:OP], op, *peer[OP + 1 :]))

    def heartbeat(self, peer_id: int, expires_at: float, lease: float = 0.0) -> None:
        self._set_lease(peer_id, self._peer(peer_id), lease)
        self._set_expiry(peer_id, expires_at)

    def remove(self, peer_id: int) -> list[tuple[str, int]] | None:
        """Delete a peer; its locks (semaphore, ticket) its owners must release, or None if it
        was not there."""
        peer = self._pop(peer_id)
        return _with_tickets(peer) if peer is not None else None

    def is_acquired(self, peer_id: int) -> bool:
        return self._peer(peer_id)[PENDING] is None

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
        return peer is not None and _get(peer[TICKETS], semaphore, 0) >= ticket

    def holds(self, peer_id: int, semaphore: str) -> int | None:
        """The count the peer holds on `semaphore`; None unless it holds it."""
        peer = self._peers.get(peer_id)
        return _get(peer[HELD], semaphore) if peer is not None else None

    def locks_of(self, peer_id: int) -> list[str]:
        """The semaphores the peer holds or waits for."""
        peer = self._peers.get(peer_id)
        return _names(peer) if peer is not None else []

    def pending(self, peer_id: int) -> tuple[str, int] | None:
        """The lock the peer waits for, (semaphore, count); None if it waits for none."""
        peer = self._peers.get(peer_id)
        return peer[PENDING] if peer is not None else None

    def ticket(self, peer_id: int, semaphore: str) -> int | None:
        peer = self._peers.get(peer_id)
        return _get(peer[TICKETS], semaphore) if peer is not None else None

    def token(self, peer_id: int, semaphore: str) -> int | None:
        """The fencing token of the peer's held lock on `semaphore`, once its owner said it."""
        peer = self._peers.get(peer_id)
        return _get(peer[TOKENS], semaphore) if peer is not None else None

    def lease(self, peer_id: int) -> float:
        """The lifetime the peer's client last asked for."""
        return self._peer(peer_id)[LEASE]

    def locks(
        self, peer_ids: Iterable[int] | None = None
    ) -> Iterator[tuple[int, str, int, bool, int]]:
        """(peer id, semaphore, count, waiting?, ticket) of every lock of `peer_ids` (default:
        all)."""
        for peer_id in self._peers if peer_ids is None else peer_ids:
            peer = self._peers.get(peer_id)
            if peer is None:
                continue
            for name, count in peer[HELD]:
                yield peer_id, name, count, False, _ticket(peer, name)
            if peer[PENDING] is not None:
                name, count = peer[PENDING]
                yield peer_id, name, count, True, _ticket(peer, name)

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
            self._set_lease(peer_id, self._peer(peer_id), expires_in)
            self._set_expiry(peer_id, now + expires_in * stretch)
        if count < 1:
            raise InvalidLockCount(count)
        expires_at, lease, op, held, pending, tickets, tokens, next_ticket = self._peer(peer_id)

        previous = _get(held, semaphore)
        if previous is None and pending is not None and pending[0] == semaphore:
            previous = pending[1]
        if previous is not None:
            if count == previous:
                return pending is None
            if count < previous:
                raise ShrinkingLockCount()
            raise LockHierarchyViolation(config.level, config.level)

        if held:
            current = min(self._config[name].level for name, _ in held)
            if current <= config.level:
                raise LockHierarchyViolation(current, config.level)
        if pending is not None:
            raise AlreadyPending()
        self._peers[peer_id] = (
            expires_at,
            lease,
            op,
            held,
            (semaphore, count),
            _put(tickets, semaphore, next_ticket),
            tokens,
            next_ticket + 1,
        )
        return AskOwner(semaphore, count, next_ticket)

    def granted(self, peer_id: int, semaphore: str, ticket: int, token: int) -> bool:
        """The owner granted the lock of `ticket` (with `token`); False if the peer no longer
        waits for that lock (then the owner holds a lock nobody wants and must release it)."""
        peer = self._peers.get(peer_id)
        if peer is None or _get(peer[TICKETS], semaphore) != ticket:
            return False
        expires_at, lease, op, held, pending, tickets, tokens, next_ticket = peer
        if pending is not None and pending[0] == semaphore:
            held = _put(held, semaphore, pending[1])
            pending = None
        elif _get(held, semaphore) is None:
            return False
        tokens = _put(tokens, semaphore, token)
        self._peers[peer_id] = (expires_at, lease, op, held, pending, tickets, tokens, next_ticket)
        return True

    def release_lock(self, peer_id: int, semaphore: str) -> int | None:
        """Release a held lock or withdraw the pending one; the ticket the owner must be told
        of, or None if there was nothing to release."""
        if semaphore not in self._config:
            raise UnknownSemaphore(semaphore)
        expires_at, lease, op, held, pending, tickets, tokens, next_ticket = self._peer(peer_id)
        if _get(held, semaphore) is None:
            if pending is None or pending[0] != semaphore:
                return None
            pending = None
        else:
            held = _without(held, semaphore)
        ticket = _get(tickets, semaphore)
        tickets, tokens = _without(tickets, semaphore), _without(tokens, semaphore)
        self._peers[peer_id] = (expires_at, lease, op, held, pending, tickets, tokens, next_ticket)
        return ticket

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
            if existing[PENDING] is None and dict(existing[HELD]) == dict(acquired):
                return None
            raise RestoreConflict()
        self._make_room()
        tickets = {name: ticket for ticket, name in enumerate(acquired, start=1)}
        held, numbered = tuple(acquired.items()), tuple(tickets.items())
        self._add(peer_id, (expires_at, lease, op or 0, held, None, numbered, (), len(tickets) + 1))
        return tickets

    # -- records -----------------------------------------------------------------------------

    def snapshot(self, now: float, peer_ids: Iterable[int] | None = None) -> list[PeerRecord]:
        """Records of the peers `peer_ids` (default: all), with lifetimes remaining from `now`."""
        chosen = self._peers if peer_ids is None else peer_ids
        return [_record(peer_id, self._peers[peer_id], now) for peer_id in chosen]

    def load(self, records: Iterable[PeerRecord], now: float) -> list[int]:
        """Take on the peers of `records` (a slot this node now acts for); returns their ids.

        A heartbeat that kept a peer's lease wrote nothing, so its record's expiry may be older
        than the one the previous home last set; that home stopped before now, so a whole lease
        from now (`STRETCH`ed, for clock drift) is later than any expiry it set."""
        loaded = []
        for record in records:
            expires_in = max(record.expires_in, record.lease * STRETCH)
            pending = None
            if record.pending_semaphore is not None:
                pending = (record.pending_semaphore, record.pending_count)
            peer = (
                now + expires_in,
                record.lease,
                record.last_op,
                tuple(record.held.items()),
                pending,
                tuple(record.tickets.items()),
                tuple(record.tokens.items()),
                record.next_ticket,
            )
            self._add(record.peer_id, peer)
            loaded.append(record.peer_id)
        return loaded

    def drop(self, groups: Iterable[int]) -> list[int]:
        """Forget the peers of `groups` (their slots are another node's now); their ids, group
        by group. What they leave is buried, not freed (`graveyard`); all of them (a stop) leave
        the table itself, which starts afresh."""
        groups = list(groups)
        gone = [peer_id for group in groups for peer_id in self._groups.get(group, ())]
        if gone and len(gone) == len(self._peers):
            self._graveyard.bury(self._peers, self._expiry, self._groups)
            self._peers, self._expiry, self._groups = {}, [], {}
            return gone
        for group in groups:
            self._groups.pop(group, None)
        pop = self._peers.pop
        self._graveyard.bury([pop(peer_id) for peer_id in gone])
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
        expired: list[tuple[int, list[tuple[str, int]]]] = []
        later = []
        while len(expired) < most:
            self._drop_stale_expiry()
            if not self._expiry or self._expiry[0][0] > now:
                break
            entry = heapq.heappop(self._expiry)
            if spared(entry[1]):
                later.append(entry)
                continue
            peer = self._pop(entry[1])
            assert peer is not None  # the entry was not stale
            expired.append((entry[1], _with_tickets(peer)))
        for entry in later:
            heapq.heappush(self._expiry, entry)
        return expired

    def expire_peer(self, peer_id: int, now: float) -> list[tuple[str, int]] | None:
        """Remove the peer if its deadline is at or before `now`: its locks (semaphore,
        ticket); None if it is not due (or not here)."""
        peer = self._peers.get(peer_id)
        if peer is None or peer[EXPIRES_AT] > now:
            return None
        self._pop(peer_id)  # its entry in the expiry heap is stale now
        return _with_tickets(peer)

    # -- internals ---------------------------------------------------------------------------

    def _pop(self, peer_id: int) -> Peer | None:
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

    def _peer(self, peer_id: int) -> Peer:
        peer = self._peers.get(peer_id)
        if peer is None:
            raise UnknownPeer(peer_id)
        return peer

    def _add(self, peer_id: int, peer: Peer) -> None:
        if self._group_of is not None and peer_id not in self._peers:
            self._groups.setdefault(self._group_of(peer_id), set()).add(peer_id)
        self._peers[peer_id] = peer
        self._set_expiry(peer_id, peer[EXPIRES_AT])

    def _set_lease(self, peer_id: int, peer: Peer, lease: float) -> None:
        if lease != peer[LEASE]:
            self._peers[peer_id] = (peer[EXPIRES_AT], lease, *peer[OP:])

    def _set_expiry(self, peer_id: int, expires_at: float) -> None:
        peer = self._peers[peer_id]
        if expires_at != peer[EXPIRES_AT]:
            self._peers[peer_id] = (expires_at, *peer[LEASE:])
        heapq.heappush(self._expiry, (expires_at, peer_id))
        self._compact_expiry()

    def _compact_expiry(self) -> None:
        # Every heartbeat leaves a stale entry behind, and every peer of a dropped slot: rebuild
        # once they outnumber the peers (popping the 100,000 entries of the peers a node handed
        # on at SIGTERM took 0.1 s in one step).
        if len(self._expiry) > 2 * len(self._peers) + 64:
            self._graveyard.bury(self._expiry)
            self._expiry = [(peer[EXPIRES_AT], peer_id) for peer_id, peer in self._peers.items()]
            heapq.heapify(self._expiry)

    def _drop_stale_expiry(self) -> None:
        self._compact_expiry()
        heap = self._expiry
        while heap:
            expires_at, peer_id = heap[0]
            peer = self._peers.get(peer_id)
            if peer is not None and peer[EXPIRES_AT] == expires_at:
                return
            heapq.heappop(heap)


def _record(peer_id: int, peer: Peer, now: float) -> PeerRecord:
    expires_at, lease, op, held, pending, tickets, tokens, next_ticket = peer
    return PeerRecord(
        peer_id,
        expires_at - now,
        lease,
        dict(held),
        pending[0] if pending else None,
        pending[1] if pending else 0,
        dict(tickets),
        dict(tokens),
        next_ticket,
        op,
    )
