"""The semaphore API as data: one value per request, applied to a core by `apply`.

Shells turn bytes into these values and actors apply them; the same values will travel between
nodes when a request is forwarded to the owner of a semaphore.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .semaphores import SemaphoreCore


@dataclass(frozen=True, slots=True)
class NewPeer:
    expires_in: float
    # On a node with tokens: the key of the token that asks (cluster/peer_ids.py), so that the
    # id names it.
    key: bytes | None = field(default=None, repr=False)


@dataclass(frozen=True, slots=True)
class Heartbeat:
    peer_id: int
    expires_in: float


@dataclass(frozen=True, slots=True)
class ReleasePeer:
    peer_id: int
    # The client's number for this operation on the peer (see `Acquire.op`).
    op: int | None = None


@dataclass(frozen=True, slots=True)
class Acquire:
    peer_id: int
    semaphore: str
    count: int
    expires_in: float | None = None
    # How long the caller is willing to wait for the grant; the actor, not the core, waits.
    block_for: float | None = None
    # Our client numbers its operations on a peer (a retry keeps the number): one numbered
    # below the highest applied is stale and refused (docs/cluster.md, O3). None: unnumbered.
    op: int | None = None


@dataclass(frozen=True, slots=True)
class AcquireOutcome:
    """An acquire's answer: does the peer now hold all its locks (Throttle's 200 rather than
    202), and the fencing token of the requested lock once it is held."""

    acquired: bool
    fencing_token: int | None = None


@dataclass(frozen=True, slots=True)
class ReleaseLock:
    peer_id: int
    semaphore: str
    op: int | None = None


@dataclass(frozen=True, slots=True)
class IsAcquired:
    peer_id: int


@dataclass(frozen=True, slots=True)
class Remainder:
    semaphore: str


@dataclass(frozen=True, slots=True)
class Restore:
    peer_id: int
    expires_in: float
    acquired: Mapping[str, int] = field(default_factory=dict)
    op: int | None = None


# Peer ids one `ListPeers` answers with at most (450 KB of msgpack: half a node link's frame).
PEER_PAGE = 50_000
LAST_PEER_ID = 2**64 - 1


@dataclass(frozen=True, slots=True)
class ListPeers:
    """The ids of the peers from `low` to `high` (both included), or None if they are more
    than `most`: the asker splits the range and asks again."""

    low: int = 0
    high: int = LAST_PEER_ID
    most: int = PEER_PAGE


Operation = (
    NewPeer
    | Heartbeat
    | ReleasePeer
    | Acquire
    | ReleaseLock
    | IsAcquired
    | Remainder
    | Restore
    | ListPeers
)


def apply(core: SemaphoreCore, op: Operation, now: float, rng: random.Random) -> object:
    """Apply one operation on one node; returns its answer or raises a `SemaphoreError`."""
    match op:
        case Acquire(peer_id, semaphore, count, expires_in, _, number):
            core.numbered(peer_id, number)
            return core.acquire(peer_id, semaphore, count, now, expires_in)
        case ReleaseLock(peer_id, semaphore, number):
            core.numbered(peer_id, number)
            core.release_lock(peer_id, semaphore)
            return None
        case Heartbeat(peer_id, expires_in):
            core.heartbeat(peer_id, now + expires_in)
            return None
        case NewPeer(expires_in, key):
            return core.new_peer(now + expires_in, rng, key)
        case ReleasePeer(peer_id, number):
            if core.has_peer(peer_id):
                core.numbered(peer_id, number)
            return core.release_peer(peer_id)
        case IsAcquired(peer_id):
            return core.is_acquired(peer_id)
        case Remainder(semaphore):
            return core.remainder(semaphore)
        case Restore(peer_id, expires_in, acquired, number):
            core.restore(peer_id, acquired, now + expires_in, number)
            return None
        case ListPeers(low, high, most):
            return core.peer_ids(low, high, most)
    raise TypeError(f"not a semaphore operation: {op!r}")
