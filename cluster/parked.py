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


@dataclass(eq=False)
class ParkedAcquire:
    request_id: int
    op: Acquire
    deadline: float
    # Parked only until the owner decides (no `block_for`): "queued" answers it.
    undecided: bool


class ParkedAcquires:
    def __init__(self) -> None:
        # Peer -> the ids of its waiting acquires, oldest first: plain values again.
        self._by_peer: dict[int, dict[int, None]] = {}
        self._by_id: dict[int, ParkedAcquire] = {}
        # (deadline, sequence, request id): plain values the garbage collector does not walk,
        # however many wait. Request ids are never parked twice.
        self._deadlines: list[tuple[float, int, int]] = []
        # Entries of `_deadlines` taken out before their deadline.
        self._stale = 0
        self._sequence = itertools.count()

    def __len__(self) -> int:
        return len(self._by_id)

    def park(self, request_id: int, op: Acquire, deadline: float, undecided: bool) -> None:
        request = ParkedAcquire(request_id, op, deadline, undecided)
        self._by_peer.setdefault(op.peer_id, {})[request_id] = None
        self._by_id[request_id] = request
        heapq.heappush(self._deadlines, (deadline, next(self._sequence), request_id))

    def of_peer(self, peer_id: int) -> list[ParkedAcquire]:
        """A peer's waiting acquires, oldest first (a copy)."""
        return [self._by_id[request_id] for request_id in self._by_peer.get(peer_id, ())]

    def peers(self) -> KeysView[int]:
        """The peers with an acquire waiting."""
        return self._by_peer.keys()

    def count_of(self, peer_id: int) -> int:
        return len(self._by_peer.get(peer_id, ()))

    def take(self, request: ParkedAcquire) -> None:
        """Take one waiting acquire out, to be answered now."""
        self._unlist(request)
        self._forget(request)
        self._stale += 1  # its entry stays in `_deadlines` until it comes up

    def take_peer(self, peer_id: int) -> list[ParkedAcquire]:
        """Take all of a peer's waiting acquires out, oldest first."""
        requests = [self._by_id[request_id] for request_id in self._by_peer.pop(peer_id, ())]
        for request in requests:
            self._forget(request)
        self._stale += len(requests)
        return requests

    def take_all(self) -> list[ParkedAcquire]:
        requests = [self._by_id[i] for waiting in self._by_peer.values() for i in waiting]
        self._by_peer, self._by_id, self._deadlines, self._stale = {}, {}, [], 0
        return requests

    def withdraw(self, request_id: int) -> bool:
        """Drop a waiting acquire unanswered (whoever asked has gone); False if none waits."""
        request = self._by_id.get(request_id)
        if request is None:
            return False
        self.take(request)
        return True

    def due(self, now: float) -> list[ParkedAcquire]:
        """Take out every acquire whose deadline has come, soonest first."""
        deadlines, due = self._deadlines, []
        while deadlines and deadlines[0][0] <= now:
            _, _, request_id = heapq.heappop(deadlines)
            request = self._by_id.get(request_id)
            if request is None:
                self._stale -= 1
            else:
                self._unlist(request)
                self._forget(request)
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

    def _unlist(self, request: ParkedAcquire) -> None:
        waiting = self._by_peer[request.op.peer_id]
        del waiting[request.request_id]
        if not waiting:
            del self._by_peer[request.op.peer_id]

    def _forget(self, request: ParkedAcquire) -> None:
        del self._by_id[request.request_id]
