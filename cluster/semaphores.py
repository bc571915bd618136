"""The semaphore core: peers, locks, strict FIFO waiting, lock levels, expiry and restore.

A sans-IO state machine in the manner of h11: the caller passes `now` into every operation that
reads the clock, asks `next_deadline()` when to call `expire(now)` again, and collects what happened
to other peers with `events()`. Every rule of Throttle's semaphore API lives here, checked in
exactly the order THROTTLE_API.md gives; nothing here knows about HTTP.

Cost: acquire, release and heartbeat are O(log n) in the number of peers (the expiry heap); granting
waiters after a release is O(1) per granted waiter, because each semaphore keeps its waiters in an
insertion-ordered queue and only ever looks at the head.
"""

from __future__ import annotations

import heapq
import random
from collections import OrderedDict
from collections.abc import Mapping
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
class PeerRemoved:
    """A peer is gone, deleted by its client or expired; a request waiting for it must fail."""

    peer_id: int
    expired: bool


Event = LockGranted | PeerRemoved


@dataclass(frozen=True)
class SemaphoreStats:
    name: str
    max: int
    acquired: int
    pending: int
    longest_pending: float


class _Peer:
    __slots__ = ("acquired", "pending", "expires_at")

    def __init__(self, expires_at: float, acquired: dict[str, int]) -> None:
        self.acquired = acquired
        # Name of the one semaphore this peer waits for; its count sits in that semaphore's queue.
        self.pending: str | None = None
        self.expires_at = expires_at


class _Semaphore:
    __slots__ = ("name", "max", "level", "acquired", "pending", "queue")

    def __init__(self, name: str, config: SemaphoreConfig) -> None:
        self.name = name
        self.max = config.max
        self.level = config.level
        self.acquired = 0
        self.pending = 0
        # Waiters in arrival order: peer id -> (count, waiting since).
        self.queue: OrderedDict[int, tuple[int, float]] = OrderedDict()


class SemaphoreCore:
    def __init__(self, semaphores: Mapping[str, SemaphoreConfig]) -> None:
        self._semaphores = {name: _Semaphore(name, cfg) for name, cfg in semaphores.items()}
        self._peers: dict[int, _Peer] = {}
        # (expires_at, peer_id); an entry is stale once the peer is gone or its expiry moved.
        self._expiry: list[tuple[float, int]] = []
        self._events: list[Event] = []

    # -- peers -------------------------------------------------------------------------------

    def new_peer(self, expires_at: float, rng: random.Random) -> int:
        while True:
            peer_id = rng.getrandbits(64)
            if peer_id not in self._peers:
                break
        self._peers[peer_id] = _Peer(expires_at, {})
        heapq.heappush(self._expiry, (expires_at, peer_id))
        return peer_id

    def heartbeat(self, peer_id: int, expires_at: float) -> None:
        self._set_expiry(self._peer(peer_id), peer_id, expires_at)

    def release_peer(self, peer_id: int) -> bool:
        """Delete a peer with all its locks; False if it was not there."""
        if peer_id not in self._peers:
            return False
        self._remove_peer(peer_id, expired=False)
        return True

    def is_acquired(self, peer_id: int) -> bool:
        return self._peer(peer_id).pending is None

    def peer_ids(self) -> list[int]:
        return list(self._peers)

    def has_peer(self, peer_id: int) -> bool:
        return peer_id in self._peers

    # -- locks -------------------------------------------------------------------------------

    def acquire(
        self,
        peer_id: int,
        semaphore: str,
        count: int,
        now: float,
        expires_in: float | None = None,
    ) -> bool:
        """Ask for a lock; True if the peer now holds all its locks, False if this one waits."""
        sem = self._semaphore(semaphore)
        if count > sem.max:
            raise LockNeverAcquirable(count, sem.max)
        if expires_in is not None:
            self._set_expiry(self._peer(peer_id), peer_id, now + expires_in)
        if count < 1:
            raise InvalidLockCount(count)
        peer = self._peer(peer_id)

        previous = peer.acquired.get(semaphore)
        if previous is None and peer.pending == semaphore:
            previous = sem.queue[peer_id][0]
        if previous is not None:
            if count == previous:
                return peer.pending is None
            if count < previous:
                raise ShrinkingLockCount()
            raise LockHierarchyViolation(sem.level, sem.level)

        if peer.acquired:
            current = min(self._semaphores[name].level for name in peer.acquired)
            if current <= sem.level:
                raise LockHierarchyViolation(current, sem.level)
        if peer.pending is not None:
            raise AlreadyPending()

        # A new lock arrives last: it may only be granted if everything already asked for (held or
        # waiting) leaves room, otherwise it would overtake the waiters.
        if sem.acquired + sem.pending + count <= sem.max:
            peer.acquired[semaphore] = count
            sem.acquired += count
            return True
        peer.pending = semaphore
        sem.queue[peer_id] = (count, now)
        sem.pending += count
        return False

    def release_lock(self, peer_id: int, semaphore: str) -> None:
        """Release a held lock, or withdraw a waiting one; nothing to release is fine."""
        sem = self._semaphore(semaphore)
        peer = self._peer(peer_id)
        count = peer.acquired.pop(semaphore, None)
        if count is not None:
            sem.acquired -= count
        elif peer.pending == semaphore:
            self._withdraw(peer, peer_id, sem)
        else:
            return
        self._grant_waiters(sem)

    def remainder(self, semaphore: str) -> int:
        sem = self._semaphore(semaphore)
        return sem.max - sem.acquired

    def restore(self, peer_id: int, acquired: Mapping[str, int], expires_at: float) -> None:
        """Recreate a peer the node forgot, holding `acquired` even beyond max.

        An identical existing peer is accepted as it is (its expiry untouched), so a client can
        repeat a restore safely.
        """
        for name in acquired:
            self._semaphore(name)
        for count in acquired.values():
            if count < 1:
                raise InvalidLockCount(count)
        existing = self._peers.get(peer_id)
        if existing is not None:
            if existing.pending is None and existing.acquired == dict(acquired):
                return
            raise RestoreConflict()
        self._peers[peer_id] = _Peer(expires_at, dict(acquired))
        heapq.heappush(self._expiry, (expires_at, peer_id))
        for name, count in acquired.items():
            self._semaphores[name].acquired += count

    # -- time --------------------------------------------------------------------------------

    def next_deadline(self) -> float | None:
        """When `expire` has work to do next; None while there is no peer."""
        self._drop_stale_expiry()
        return self._expiry[0][0] if self._expiry else None

    def expire(self, now: float) -> list[int]:
        """Remove every peer whose deadline is at or before `now`; returns their ids."""
        expired = []
        while True:
            self._drop_stale_expiry()
            if not self._expiry or self._expiry[0][0] > now:
                return expired
            _, peer_id = heapq.heappop(self._expiry)
            self._remove_peer(peer_id, expired=True)
            expired.append(peer_id)

    # -- observation -------------------------------------------------------------------------

    def events(self) -> list[Event]:
        """What happened since the last call, in order."""
        events, self._events = self._events, []
        return events

    def stats(self, now: float) -> list[SemaphoreStats]:
        result = []
        for sem in self._semaphores.values():
            oldest = next(iter(sem.queue.values()), None)
            longest = now - oldest[1] if oldest is not None else 0.0
            result.append(SemaphoreStats(sem.name, sem.max, sem.acquired, sem.pending, longest))
        return result

    # -- internals ---------------------------------------------------------------------------

    def _semaphore(self, name: str) -> _Semaphore:
        sem = self._semaphores.get(name)
        if sem is None:
            raise UnknownSemaphore(name)
        return sem

    def _peer(self, peer_id: int) -> _Peer:
        peer = self._peers.get(peer_id)
        if peer is None:
            raise UnknownPeer(peer_id)
        return peer

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

    def _withdraw(self, peer: _Peer, peer_id: int, sem: _Semaphore) -> None:
        count, _ = sem.queue.pop(peer_id)
        sem.pending -= count
        peer.pending = None

    def _remove_peer(self, peer_id: int, expired: bool) -> None:
        peer = self._peers.pop(peer_id)
        affected = []
        for name, count in peer.acquired.items():
            sem = self._semaphores[name]
            sem.acquired -= count
            affected.append(sem)
        if peer.pending is not None:
            sem = self._semaphores[peer.pending]
            self._withdraw(peer, peer_id, sem)
            affected.append(sem)
        self._events.append(PeerRemoved(peer_id, expired))
        for sem in affected:
            self._grant_waiters(sem)

    def _grant_waiters(self, sem: _Semaphore) -> None:
        # Strict FIFO: stop at the first waiter that does not fit, so a large count is never
        # starved by small ones arriving after it.
        room = sem.max - sem.acquired
        queue = sem.queue
        while queue:
            peer_id, (count, _) = next(iter(queue.items()))
            if count > room:
                return
            queue.popitem(last=False)
            room -= count
            sem.pending -= count
            sem.acquired += count
            peer = self._peers[peer_id]
            peer.pending = None
            peer.acquired[sem.name] = count
            self._events.append(LockGranted(peer_id, sem.name, count))
