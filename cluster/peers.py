"""The home's side of peers: expiry, held and pending locks, and every peer-level rule.

In a cluster, a peer's home (the ring owner of its id) serialises the peer's operations across
semaphores owned by other nodes: it runs acquire checks 1 to 8 of THROTTLE_API.md (configuration,
expiry update, count, unknown peer, idempotency, levels, one pending lock) and only then asks the
semaphore's owner for check 9, whether the count fits. The peer counts as pending from that moment
until the owner's grant arrives (`granted`).

Pure: `now` comes in; expiry is driven by `next_deadline()` and `expire(now)` over a lazy heap.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

from .errors import (
    AlreadyPending,
    InvalidLockCount,
    LockHierarchyViolation,
    LockNeverAcquirable,
    RestoreConflict,
    ShrinkingLockCount,
    UnknownPeer,
    UnknownSemaphore,
)
from .semaphore_leases import SemaphoreConfig


@dataclass(frozen=True)
class PeerRemoved:
    """A peer is gone, deleted by its client or expired; a request waiting for it must fail."""

    peer_id: int
    expired: bool


@dataclass(frozen=True, slots=True)
class PeerRecord:
    """One peer in a replica: its remaining lifetime, not a deadline, so no clock is shared;
    `lease`, the lifetime its client last asked for. `provisional`: taken over from a replica,
    not confirmed by its client since."""

    peer_id: int
    expires_in: float
    held: Mapping[str, int]
    pending_semaphore: str | None
    pending_count: int
    provisional: bool = False
    lease: float = 0.0


@dataclass(frozen=True)
class AskOwner:
    """Acquire passed every peer-level check: the semaphore's owner decides (check 9)."""

    semaphore: str
    count: int


class _Peer:
    __slots__ = ("held", "pending", "expires_at", "provisional", "lease")

    def __init__(
        self, expires_at: float, held: dict[str, int], provisional: bool = False, lease: float = 0.0
    ) -> None:
        self.held = held
        # The one lock this peer waits for, (semaphore, count), or None.
        self.pending: tuple[str, int] | None = None
        self.expires_at = expires_at
        # Taken over from a replica, which may be behind: the client says what it holds (it
        # restores the peer) before the peer serves it again.
        self.provisional = provisional
        # The lifetime its client last asked for (a heartbeat, or an acquire's `expires_in`).
        self.lease = lease

    def locks(self) -> list[str]:
        """Semaphores this peer holds or waits for: what its owners must release when it goes."""
        names = list(self.held)
        if self.pending is not None:
            names.append(self.pending[0])
        return names


class PeerTable:
    def __init__(self, semaphores: Mapping[str, SemaphoreConfig]) -> None:
        self._config = dict(semaphores)
        self._peers: dict[int, _Peer] = {}
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
        while True:
            peer_id = rng.getrandbits(64)
            if peer_id not in self._peers and homed_here(peer_id):
                break
        self._add(peer_id, _Peer(expires_at, {}, lease=lease))
        return peer_id

    def heartbeat(self, peer_id: int, expires_at: float, lease: float = 0.0) -> None:
        peer = self._peer(peer_id)
        peer.lease = lease
        self._set_expiry(peer, peer_id, expires_at)

    def remove(self, peer_id: int) -> list[str] | None:
        """Delete a peer; the semaphores its owners must release, or None if it was not there."""
        peer = self._peers.pop(peer_id, None)
        return peer.locks() if peer is not None else None

    def is_acquired(self, peer_id: int) -> bool:
        return self._peer(peer_id).pending is None

    def peer_ids(self) -> list[int]:
        return list(self._peers)

    def has_peer(self, peer_id: int) -> bool:
        return peer_id in self._peers

    def is_provisional(self, peer_id: int) -> bool:
        """Taken over from a replica and not restored by its client since: its locks may be
        behind what the client holds, or ahead of it."""
        peer = self._peers.get(peer_id)
        return peer is not None and peer.provisional

    def wants(self, peer_id: int, semaphore: str) -> int | None:
        """The count the peer holds or waits for on `semaphore`; None if neither."""
        peer = self._peers.get(peer_id)
        if peer is None:
            return None
        if peer.pending is not None and peer.pending[0] == semaphore:
            return peer.pending[1]
        return peer.held.get(semaphore)

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

    def locks(self, peer_ids: Iterator[int] | None = None) -> Iterator[tuple[int, str, int, bool]]:
        """(peer id, semaphore, count, waiting?) of every lock of `peer_ids` (default: all)."""
        for peer_id in self._peers if peer_ids is None else peer_ids:
            peer = self._peers.get(peer_id)
            if peer is None:
                continue
            for name, count in peer.held.items():
                yield peer_id, name, count, False
            if peer.pending is not None:
                yield peer_id, peer.pending[0], peer.pending[1], True

    # -- locks -------------------------------------------------------------------------------

    def acquire(
        self,
        peer_id: int,
        semaphore: str,
        count: int,
        now: float,
        expires_in: float | None = None,
    ) -> bool | AskOwner:
        """Checks 1 to 8; the answer (all acquired?) when they settle it, else `AskOwner`."""
        config = self._config.get(semaphore)
        if config is None:
            raise UnknownSemaphore(semaphore)
        if count > config.max:
            raise LockNeverAcquirable(count, config.max)
        if expires_in is not None:
            self._peer(peer_id).lease = expires_in
            self._set_expiry(self._peer(peer_id), peer_id, now + expires_in)
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
        return AskOwner(semaphore, count)

    def granted(self, peer_id: int, semaphore: str, count: int) -> bool:
        """The owner granted the peer's pending lock; False if the peer no longer waits for it
        (then the owner holds a lock nobody wants and must be told to release it)."""
        peer = self._peers.get(peer_id)
        if peer is None or peer.pending != (semaphore, count):
            return False
        peer.pending = None
        peer.held[semaphore] = count
        return True

    def release_lock(self, peer_id: int, semaphore: str) -> bool:
        """Release a held lock or withdraw the pending one; True if the owner must be told."""
        if semaphore not in self._config:
            raise UnknownSemaphore(semaphore)
        peer = self._peer(peer_id)
        if peer.held.pop(semaphore, None) is not None:
            return True
        if peer.pending is not None and peer.pending[0] == semaphore:
            peer.pending = None
            return True
        return False

    def restore(
        self, peer_id: int, acquired: Mapping[str, int], expires_at: float, lease: float = 0.0
    ) -> bool:
        """Recreate a forgotten peer holding `acquired`; True if created (or a provisional one
        replaced), False if an identical peer exists already (accepted as it is, its expiry
        untouched)."""
        for name in acquired:
            if name not in self._config:
                raise UnknownSemaphore(name)
        for count in acquired.values():
            if count < 1:
                raise InvalidLockCount(count)
        existing = self._peers.get(peer_id)
        if existing is not None and not existing.provisional:
            if existing.pending is None and existing.held == dict(acquired):
                return False
            raise RestoreConflict()
        self._add(peer_id, _Peer(expires_at, dict(acquired), lease=lease))
        return True

    # -- replicas ----------------------------------------------------------------------------

    def snapshot(self, now: float, peer_ids: Iterable[int] | None = None) -> list[PeerRecord]:
        """Records of the peers `peer_ids` (default: all), with lifetimes remaining from `now`."""
        chosen = self._peers if peer_ids is None else peer_ids
        return [
            PeerRecord(
                peer_id,
                peer.expires_at - now,
                dict(peer.held),
                peer.pending[0] if peer.pending else None,
                peer.pending[1] if peer.pending else 0,
                peer.provisional,
                peer.lease,
            )
            for peer_id, peer in ((p, self._peers[p]) for p in chosen)
        ]

    def load(
        self, records: list[PeerRecord], now: float, provisional_margin: float | None = None
    ) -> list[int]:
        """Take over the peers of a hand-over, or of a replica (`provisional_margin` given),
        which may be behind: its node may have renewed a peer since, until it saw it was cut off
        from the others. So a provisional peer lives at least a lease and the margin from `now`,
        in which its client hears it is unknown, and restores it. Peers known here already stay
        as they are. Returns the ids of the peers taken over."""
        loaded = []
        for record in records:
            if record.peer_id in self._peers:
                continue
            expires_at = now + record.expires_in
            if provisional_margin is not None:
                expires_at = max(expires_at, now + record.lease + provisional_margin)
            peer = _Peer(
                expires_at,
                dict(record.held),
                provisional_margin is not None or record.provisional,
                record.lease,
            )
            if record.pending_semaphore is not None:
                peer.pending = (record.pending_semaphore, record.pending_count)
            self._add(record.peer_id, peer)
            loaded.append(record.peer_id)
        return loaded

    def take(self, chosen: Callable[[int], bool], now: float) -> list[PeerRecord]:
        """Remove the peers whose ids are `chosen` and return them as records (they move to
        another node)."""
        records = [r for r in self.snapshot(now) if chosen(r.peer_id)]
        for record in records:
            del self._peers[record.peer_id]
        return records

    # -- time --------------------------------------------------------------------------------

    def next_deadline(self) -> float | None:
        """When `expire` has work to do next; None while there is no peer."""
        self._drop_stale_expiry()
        return self._expiry[0][0] if self._expiry else None

    def expire(self, now: float) -> list[tuple[int, list[str]]]:
        """Remove every peer whose deadline is at or before `now`: (peer id, its semaphores)."""
        expired = []
        while True:
            self._drop_stale_expiry()
            if not self._expiry or self._expiry[0][0] > now:
                return expired
            _, peer_id = heapq.heappop(self._expiry)
            expired.append((peer_id, self._peers.pop(peer_id).locks()))

    # -- internals ---------------------------------------------------------------------------

    def _peer(self, peer_id: int) -> _Peer:
        """The peer, for its client's operations: a provisional one is unknown to them, so that
        the client restores it with the locks it holds."""
        peer = self._peers.get(peer_id)
        if peer is None or peer.provisional:
            raise UnknownPeer(peer_id)
        return peer

    def _add(self, peer_id: int, peer: _Peer) -> None:
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
