"""Replicas of a node's share at the other members, kept current by deltas.

Every node streams what changed in its share (peers it is home of, semaphores it owns) to every
other member: the records of the peers and semaphores that changed since the last send, and the
ids of the peers that went away. A member that dies leaves each of its keys to a ring successor,
which takes over from the replica it holds (`cluster/shard.py`).

A stream is a sequence of `ReplicaDelta`s numbered per receiver. The first of a stream resets the
receiver's copy (a full copy follows in deltas); after that each applies on top of the last. A
receiver that sees a number out of order (a frame lost with a broken link) asks for a new stream
(`ReplicaResync`) and ignores the rest until it starts. Large copies go in parts of at most
`PART_RECORDS` records, so no message comes near the link's frame limit.

Pure: `now` comes in; records carry remaining lifetimes, rebased on arrival.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from .peers import PeerRecord
from .semaphore_leases import SemaphoreRecord
from .semaphores import Replica

PART_RECORDS = 2000


@dataclass(frozen=True, slots=True)
class ReplicaDelta:
    seq: int
    reset: bool  # the first of a stream: forget the copy so far
    peers: list[PeerRecord]
    removed: list[int]
    semaphores: list[SemaphoreRecord]


@dataclass(frozen=True, slots=True)
class ReplicaResync:
    """A receiver lost track of the stream: start a new one."""


class ReplicaStore:
    """One member's replica as received: peers with their expiry by the receiver's clock."""

    def __init__(self) -> None:
        self._peers: dict[int, tuple[PeerRecord, float]] = {}
        self._semaphores: dict[str, SemaphoreRecord] = {}
        self._expected: int | None = None
        self._asked = False

    def apply(self, delta: ReplicaDelta, now: float) -> bool:
        """Apply a delta; False when one does not follow the last: ask for a new stream (once:
        the deltas after it are ignored until the new stream starts)."""
        if delta.reset:
            self._peers.clear()
            self._semaphores.clear()
            self._asked = False
        elif delta.seq != self._expected:
            self._expected = None
            asked, self._asked = self._asked, True
            return asked
        self._expected = delta.seq + 1
        for record in delta.peers:
            self._peers[record.peer_id] = (record, now + record.expires_in)
        for peer_id in delta.removed:
            self._peers.pop(peer_id, None)
        for record in delta.semaphores:
            self._semaphores[record.name] = record
        return True

    @property
    def in_step(self) -> bool:
        return self._expected is not None

    def replica(self, now: float) -> Replica:
        """The copy as it stands, with lifetimes remaining from `now`."""
        return Replica(
            [replace(record, expires_in=at - now) for record, at in self._peers.values()],
            list(self._semaphores.values()),
        )


class ReplicaFeed:
    """The sending side: what changed since the last send, and each receiver's stream."""

    def __init__(self) -> None:
        self._changed_peers: set[int] = set()
        self._removed_peers: set[int] = set()
        self._changed_semaphores: set[str] = set()
        self._next_seq: dict[str, int] = {}

    def peer_changed(self, peer_id: int) -> None:
        self._changed_peers.add(peer_id)
        self._removed_peers.discard(peer_id)

    def peer_removed(self, peer_id: int) -> None:
        self._changed_peers.discard(peer_id)
        self._removed_peers.add(peer_id)

    def semaphores_changed(self, names: Iterable[str]) -> None:
        self._changed_semaphores.update(names)

    def restart(self, member: str) -> None:
        """Send `member` a whole new copy next time (it is new, or it lost track)."""
        self._next_seq.pop(member, None)

    def take_changes(self) -> tuple[set[int], set[int], set[str]]:
        """(changed peers, removed peers, changed semaphores) since the last call."""
        changes = (self._changed_peers, self._removed_peers, self._changed_semaphores)
        self._changed_peers, self._removed_peers, self._changed_semaphores = set(), set(), set()
        return changes

    def needs_copy(self, member: str) -> bool:
        return member not in self._next_seq

    def deltas(
        self,
        member: str,
        peers: list[PeerRecord],
        removed: list[int],
        semaphores: list[SemaphoreRecord],
    ) -> list[ReplicaDelta]:
        """The next deltas for `member`, in parts; a whole copy if it needs one."""
        reset = member not in self._next_seq
        if not (reset or peers or removed or semaphores):
            return []
        seq = self._next_seq.get(member, 0)
        deltas = []
        items: list[tuple[str, object]] = [
            *(("peer", r) for r in peers),
            *(("removed", i) for i in removed),
            *(("semaphore", r) for r in semaphores),
        ]
        for start in range(0, max(len(items), 1), PART_RECORDS):
            part = items[start : start + PART_RECORDS]
            deltas.append(
                ReplicaDelta(
                    seq,
                    reset and start == 0,
                    [r for kind, r in part if kind == "peer"],
                    [i for kind, i in part if kind == "removed"],
                    [r for kind, r in part if kind == "semaphore"],
                )
            )
            seq += 1
        self._next_seq[member] = seq
        return deltas
