"""Slots and ballots: the words ownership (`cluster/ownership.py`) and replication
(`cluster/replication.py`) share.

Every key (a peer, a semaphore, an exact rate-limit key) hashes to one of `SLOTS` slots; a slot is
what is owned and replicated. A ballot names one term of one slot's ownership: every change of
owner uses a larger one (docs/cluster.md).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from .ring import Ring, stable_hash

SLOTS = 256
# How far any node's clock may run from real time, as a rate: leases keep a margin for it.
DRIFT = 0.02
# A deadline that travels (a peer's expiry) grows by this factor at every hop, so that no copy
# runs out before its original on a clock running up to DRIFT fast.
STRETCH = 1 + 2 * DRIFT
# The most one node's clock can run faster than another's: each is within DRIFT of real time.
DRIFT_RATIO = (1 + DRIFT) / (1 - DRIFT)


def takeover_bound(down_after: float, lease: float) -> float:
    """How long a slot can go without an acting owner after its owner is lost, seen from a member
    that reaches a quorum: the others count the owner down after `down_after`, the lease
    promises it holds run out within `lease` on a clock up to DRIFT slow, and the next owner's
    prepare and first write take a round trip or two (half a lease, with room)."""
    return max(down_after, lease * DRIFT_RATIO) + lease / 2


@dataclass(frozen=True, order=True, slots=True)
class Ballot:
    """One term of a slot's ownership: `era` (the cluster's cold start it belongs to), then
    `number`, then the `member` that took the slot; compared in that order."""

    era: int
    number: int
    member: str


NO_BALLOT = Ballot(0, 0, "")


# Every step asks again for the slots of the same few peers and keys: a hash each time was 2 %
# of a member's CPU on a lock's path.
@functools.lru_cache(maxsize=1 << 14)
def slot_of(key: bytes) -> int:
    """The slot of a ring key (`cluster/ring.py`'s `peer_key`, `semaphore_key`, `rate_key`)."""
    return stable_hash(key) % SLOTS


def slot_owners(ring: Ring) -> list[str | None]:
    """The member `ring` names for each slot (None on an empty ring)."""
    return [ring.owner(b"slot/%d" % slot) for slot in range(SLOTS)]


def slot_successors(ring: Ring) -> list[str | None]:
    """The member `ring` names next after each slot's owner: who takes the slot if the owner is
    gone (None on a ring of one member or none)."""
    successors: list[str | None] = []
    for slot in range(SLOTS):
        members = ring.preference_list(b"slot/%d" % slot, 2)
        successors.append(members[1] if len(members) == 2 else None)
    return successors


def member_for(ring: Ring, key: bytes) -> str | None:
    """The member `ring` names for the slot of `key` (its owner, once the members settle)."""
    return ring.owner(b"slot/%d" % slot_of(key))
