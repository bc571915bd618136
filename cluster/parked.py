"""Acquires waiting at their peer's home for an answer: by peer, by request id and by deadline.

Each way in costs at most the peer's own waiting acquires (a handful) or a logarithm, so that
however many wait, no step of the node walks all of them.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import KeysView
from dataclasses import dataclass

from .semaphore_ops import Acquire

# Parked acquires a stop answers in one step: the node's loop runs between two such steps.
STOP_CHUNK = 1000


@dataclass(eq=False)
class ParkedAcquire:
    request_id: int
    op: Acquire
    deadline: float
    # Parked only until the owner decides (no `block_for`): "queued" answers it.
    undecided: bool


class ParkedAcquires:
    """Kept as plain values (ints, strings and tuples of them), which the garbage collector
    stops walking once it has seen them: a `ParkedAcquire` and its `Acquire` for each were two
    more objects, and seven references, in every full collection per acquire waiting. The
    objects are made again on the way out."""

    def __init__(self) -> None:
        # Peer -> the ids of its waiting acquires, oldest first.
        self._by_peer: dict[int, tuple[int, ...]] = {}
        # Request id -> the acquire's fields, then its deadline and whether it is undecided.
        self._by_id: dict[int, tuple] = {}
        # (deadline, sequence, request id). Request ids are never parked twice.
        self._deadlines: list[tuple[float, int, int]] = []
        # Entries of `_deadlines` taken out before their deadline.
        self._stale = 0
        self._sequence = itertools.count()

    def __len__(self) -> int:
        return len(self._by_id)

    def park(self, request_id: int, op: Acquire, deadline: float, undecided: bool) -> None:
        peer_id = op.peer_id
        self._by_peer[peer_id] = self._by_peer.get(peer_id, ()) + (request_id,)
        self._by_id[request_id] = (
            peer_id,
            op.semaphore,
            op.count,
            op.expires_in,
            op.block_for,
            op.op,
            deadline,
            undecided,
        )
        heapq.heappush(self._deadlines, (deadline, next(self._sequence), request_id))

    def of_peer(self, peer_id: int) -> list[ParkedAcquire]:
        """A peer's waiting acquires, oldest first."""
        return [self._request(request_id) for request_id in self._by_peer.get(peer_id, ())]

    def peers(self) -> KeysView[int]:
        """The peers with an acquire waiting."""
        return self._by_peer.keys()

    def count_of(self, peer_id: int) -> int:
        return len(self._by_peer.get(peer_id, ()))

    def take(self, request: ParkedAcquire) -> None:
        """Take one waiting acquire out, to be answered now."""
        self._unlist(request.op.peer_id, request.request_id)
        del self._by_id[request.request_id]
        self._stale += 1  # its entry stays in `_deadlines` until it comes up

    def take_peer(self, peer_id: int) -> list[ParkedAcquire]:
        """Take all of a peer's waiting acquires out, oldest first."""
        requests = [self._request(request_id) for request_id in self._by_peer.pop(peer_id, ())]
        for request in requests:
            del self._by_id[request.request_id]
        self._stale += len(requests)
        return requests

    def take_first(self, most: int) -> list[ParkedAcquire]:
        """Take out the `most` acquires parked longest ago (all, if fewer wait)."""
        requests = [self._request(i) for i in itertools.islice(self._by_id, most)]
        for request in requests:
            self._unlist(request.op.peer_id, request.request_id)
            del self._by_id[request.request_id]
        if self._by_id:
            self._stale += len(requests)
        else:
            self._deadlines, self._stale = [], 0
        return requests

    def withdraw(self, request_id: int) -> bool:
        """Drop a waiting acquire unanswered (whoever asked has gone); False if none waits."""
        fields = self._by_id.pop(request_id, None)
        if fields is None:
            return False
        self._unlist(fields[0], request_id)
        self._stale += 1
        return True

    def due(self, now: float) -> list[ParkedAcquire]:
        """Take out every acquire whose deadline has come, soonest first."""
        deadlines, due = self._deadlines, []
        while deadlines and deadlines[0][0] <= now:
            _, _, request_id = heapq.heappop(deadlines)
            if request_id not in self._by_id:
                self._stale -= 1
            else:
                request = self._request(request_id)
                self._unlist(request.op.peer_id, request_id)
                del self._by_id[request_id]
                due.append(request)
        return due

    def next_deadline(self) -> float:
        deadlines = self._deadlines
        if self._stale > len(deadlines) // 2:
            self._deadlines = deadlines = [entry for entry in deadlines if entry[2] in self._by_id]
            heapq.heapify(deadlines)
            self._stale = 0
        while deadlines and deadlines[0][2] not in self._by_id:
            heapq.heappop(deadlines)
            self._stale -= 1
        return deadlines[0][0] if deadlines else math.inf

    def _request(self, request_id: int) -> ParkedAcquire:
        peer_id, semaphore, count, expires_in, block_for, op, deadline, undecided = self._by_id[
            request_id
        ]
        acquire = Acquire(peer_id, semaphore, count, expires_in, block_for, op)
        return ParkedAcquire(request_id, acquire, deadline, undecided)

    def _unlist(self, peer_id: int, request_id: int) -> None:
        waiting = tuple(i for i in self._by_peer[peer_id] if i != request_id)
        if waiting:
            self._by_peer[peer_id] = waiting
        else:
            del self._by_peer[peer_id]
