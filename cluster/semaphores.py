"""The semaphore core of one node: a peer table and the semaphore leases, composed in-process.

A sans-IO state machine in the manner of h11: the caller passes `now` into every operation that
reads the clock, asks `next_deadline()` when to call `expire(now)` again, and collects what happened
to other peers with `events()`. Every rule of Throttle's semaphore API is checked in exactly the
order THROTTLE_API.md gives; nothing here knows about HTTP.

The rules live in two halves that a cluster places on different nodes: `PeerTable` at the peer's
home (checks 1 to 8, expiry) and `SemaphoreLeases` at the semaphore's owner (check 9, FIFO grants).
This class is the whole path inside one process, a cluster of one, so a single node and the cluster
share every rule.

Cost: acquire, release and heartbeat are O(log n) in the number of peers (the expiry heap); granting
waiters after a release is O(1) per granted waiter.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping

from .limits import DEFAULT_LIMITS, Limits
from .peers import AskOwner, PeerRemoved, PeerTable
from .semaphore_leases import LockGranted, SemaphoreConfig, SemaphoreLeases, SemaphoreStats

__all__ = [
    "Event",
    "LockGranted",
    "PeerRemoved",
    "SemaphoreConfig",
    "SemaphoreCore",
    "SemaphoreStats",
]

Event = LockGranted | PeerRemoved


class SemaphoreCore:
    def __init__(
        self,
        semaphores: Mapping[str, SemaphoreConfig],
        epoch: int = 0,
        limits: Limits = DEFAULT_LIMITS,
    ) -> None:
        self._peers = PeerTable(semaphores, limits.peers, limits.restore_count)
        self._leases = SemaphoreLeases(semaphores, epoch)
        self._events: list[Event] = []

    # -- peers -------------------------------------------------------------------------------

    def new_peer(self, expires_at: float, rng: random.Random, key: bytes | None = None) -> int:
        return self._peers.new_peer(expires_at, rng, key=key)

    def heartbeat(self, peer_id: int, expires_at: float) -> None:
        self._peers.heartbeat(peer_id, expires_at)

    def release_peer(self, peer_id: int) -> bool:
        """Delete a peer with all its locks; False if it was not there."""
        locks = self._peers.remove(peer_id)
        if locks is None:
            return False
        self._peer_gone(peer_id, [name for name, _ in locks], expired=False)
        return True

    def numbered(self, peer_id: int, op: int | None) -> None:
        """Refuse a client's operation numbered below the highest applied (`StaleOperation`)."""
        self._peers.numbered(peer_id, op)

    def is_acquired(self, peer_id: int) -> bool:
        return self._peers.is_acquired(peer_id)

    def peer_ids(self, low: int = 0, high: int = 2**64, most: float = math.inf) -> list[int] | None:
        return self._peers.peer_ids(low, high, most)

    def has_peer(self, peer_id: int) -> bool:
        return self._peers.has_peer(peer_id)

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
        decision = self._peers.acquire(peer_id, semaphore, count, now, expires_in)
        if not isinstance(decision, AskOwner):
            return decision
        if self._leases.request(peer_id, semaphore, count, now, decision.ticket):
            _, token = self._leases.grant(peer_id, semaphore)
            self._peers.granted(peer_id, semaphore, decision.ticket, token)
            return True
        return False

    def locks_of(self, peer_id: int) -> list[str]:
        return self._peers.locks_of(peer_id)

    def release_lock(self, peer_id: int, semaphore: str) -> None:
        """Release a held lock, or withdraw a waiting one; nothing to release is fine."""
        if self._peers.release_lock(peer_id, semaphore) is not None:
            self._leases.release(peer_id, semaphore)
            self._deliver_grants()

    def remainder(self, semaphore: str) -> int:
        return self._leases.remainder(semaphore)

    def fencing_token(self, peer_id: int, semaphore: str) -> int | None:
        """The token of the peer's grant on `semaphore` (None unless it holds it): it strictly
        increases per semaphore, so a protected resource can refuse holders whose lease lapsed."""
        return self._leases.token(peer_id, semaphore)

    def restore(
        self,
        peer_id: int,
        acquired: Mapping[str, int],
        expires_at: float,
        op: int | None = None,
    ) -> None:
        """Recreate a peer the node forgot, holding `acquired` even beyond max.

        An identical existing peer is accepted as it is (its expiry untouched), so a client can
        repeat a restore safely.
        """
        tickets = self._peers.restore(peer_id, acquired, expires_at, op=op)
        if tickets is not None:
            for name, count in acquired.items():
                self._leases.restore(peer_id, name, count, tickets[name])

    # -- time --------------------------------------------------------------------------------

    def start_grace(self, until: float) -> None:
        """Accept restores but grant nothing new until `until` (after a takeover)."""
        self._leases.start_grace(until)

    @property
    def restores_beyond_max(self) -> int:
        return self._leases.restores_beyond_max

    def next_deadline(self) -> float | None:
        """When `expire` has work to do next: a peer's expiry or the end of a grace period."""
        deadlines = [
            d for d in (self._peers.next_deadline(), self._leases.grace_until) if d is not None
        ]
        return min(deadlines) if deadlines else None

    def expire(self, now: float, most: float = math.inf) -> list[int]:
        """Remove the peers whose deadline is at or before `now` (at most `most`, soonest
        first: `next_deadline` says when the rest are due), and end a grace period that is
        over; returns the ids of the expired peers."""
        expired = self._peers.expire(now, most=most)
        for peer_id, _ in expired:
            self._events.append(PeerRemoved(peer_id, True))
        self._leases.release_peers(
            (peer_id, [name for name, _ in locks]) for peer_id, locks in expired
        )
        self._deliver_grants()
        if self._leases.end_grace(now):
            self._deliver_grants()
        return [peer_id for peer_id, _ in expired]

    # -- observation -------------------------------------------------------------------------

    def events(self) -> list[Event]:
        """What happened since the last call, in order."""
        events, self._events = self._events, []
        return events

    def stats(self, now: float) -> list[SemaphoreStats]:
        return self._leases.stats(now)

    # -- internals ---------------------------------------------------------------------------

    def _peer_gone(self, peer_id: int, locks: list[str], expired: bool) -> None:
        self._events.append(PeerRemoved(peer_id, expired))
        self._leases.release_all(peer_id, locks)
        self._deliver_grants()

    def _deliver_grants(self) -> None:
        for grant in self._leases.events():
            # In one process the home always still waits for the grant it asked for.
            ticket, token = self._leases.grant(grant.peer_id, grant.semaphore)
            delivered = self._peers.granted(grant.peer_id, grant.semaphore, ticket, token)
            assert delivered, grant
            self._events.append(grant)
