"""Keys with a deadline each, for a home's timers: a lock to tell its owner about again, an
acquire waiting for its owner's first answer, a release waiting for its confirmation.

A home keeps one per waiting lock, so tens of thousands of them. Looking at every one at every
step (to find those due, and the earliest) cost a node 17 ms a step with 20,000 acquires waiting.
Here a lazy heap finds the due ones, and the keys of a peer are grouped to drop them with it.
Those due come back in the order their keys were first set, as a dict iterates: what a home
sends for them goes out in the same order as when it went through a dict.

Pure: `now` comes in.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Hashable, Set
from typing import Generic, TypeVar, overload

from .graveyard import FREED_AT_ONCE, Graveyard

K = TypeVar("K", bound=Hashable)

# Stale heap entries thrown out in one call at most. Keys set again all at once (20,000 acquires
# queued within a second, each first due a retry later) leave as many stale entries, which
# surface together: thrown out in one step, they stalled a node 29 ms.
STALE_CHUNK = 1000


class Deadlines(Generic[K]):
    def __init__(self, peer_of: Callable[[K], int], graveyard: Graveyard = FREED_AT_ONCE) -> None:
        """`peer_of(key)`: the peer a key belongs to; `graveyard`: where what is dropped in bulk
        waits to be freed (by default, freed at once)."""
        self._graveyard = graveyard
        self._at: dict[K, float] = {}
        # When each key was first set (kept while it is set again): the order `due` gives.
        self._order: dict[K, int] = {}
        self._sequence = itertools.count()
        # (deadline, order, key); an entry is stale once its key is gone or has another deadline.
        self._heap: list[tuple[float, int, K]] = []
        self._peer_of = peer_of
        # A peer's keys, in the order they were first set: a tuple (a peer has a handful), so
        # that the garbage collector stops walking the table once it has seen it.
        self._by_peer: dict[int, tuple[K, ...]] = {}

    def __len__(self) -> int:
        return len(self._at)

    def __contains__(self, key: K) -> bool:
        return key in self._at

    @overload
    def get(self, key: K) -> float | None: ...
    @overload
    def get(self, key: K, default: float) -> float: ...
    def get(self, key: K, default: float | None = None) -> float | None:
        return self._at.get(key, default)

    def at(self, key: K) -> float:
        """The deadline of `key`, which is set (KeyError otherwise)."""
        return self._at[key]

    def set(self, key: K, at: float) -> None:
        order = self._order.get(key)
        if order is None:
            order = self._order[key] = next(self._sequence)
            peer = self._peer_of(key)
            self._by_peer[peer] = self._by_peer.get(peer, ()) + (key,)
        self._at[key] = at
        heapq.heappush(self._heap, (at, order, key))
        self._compact()

    def pop(self, key: K) -> float | None:
        """Forget `key`; its deadline, or None if it had none."""
        at = self._at.pop(key, None)
        if at is None:
            return None
        del self._order[key]
        peer = self._peer_of(key)
        keys = tuple(other for other in self._by_peer[peer] if other != key)
        if keys:
            self._by_peer[peer] = keys
        else:
            del self._by_peer[peer]
        return at

    def drop_peers(self, peer_ids: Set[int]) -> None:
        """Forget every key of these peers (their home no longer serves them), in one pass
        over their own keys: popped one by one, 20,000 waiting locks of a slot lost at once
        took a step of tens of milliseconds. All of them (a stop): the tables start afresh."""
        at, order, by_peer = self._at, self._order, self._by_peer
        if len(peer_ids) >= len(by_peer) and all(peer in peer_ids for peer in by_peer):
            self._graveyard.bury(at, order, by_peer, self._heap)
            self._at, self._order, self._by_peer, self._heap = {}, {}, {}, []
            return
        dropped = []
        for peer in peer_ids:
            keys = by_peer.pop(peer, ())
            for key in keys:
                del at[key]
                del order[key]
            dropped.append(keys)
        self._graveyard.bury(dropped)
        self._compact()

    def has_peer(self, peer_id: int) -> bool:
        return peer_id in self._by_peer

    def order(self, key: K) -> int:
        """Where `key` stands among the keys set (an earlier key, a smaller number)."""
        return self._order[key]

    def due(self, now: float, most: int | None = None) -> list[K]:
        """The keys whose deadline is at or before `now`, in the order they were first set;
        `most` of them at most, those with the earliest deadlines. They stay set: the caller
        sets them again or pops them. At most `STALE_CHUNK` stale entries are thrown out on the
        way: `next_deadline` says when to look again."""
        heap, stale = self._heap, 0
        found: dict[K, tuple[float, int, K]] = {}
        while heap and heap[0][0] <= now and (most is None or len(found) < most):
            entry = heapq.heappop(heap)
            at, order, key = entry
            if self._at.get(key) == at and self._order[key] == order:
                found[key] = entry
            else:
                stale += 1
                if stale == STALE_CHUNK:
                    break
        for entry in found.values():
            heapq.heappush(heap, entry)
        return sorted(found, key=self._order.__getitem__)

    def next_deadline(self) -> float:
        """The earliest deadline; or, once `STALE_CHUNK` stale entries were thrown out, the
        next entry's, which is no later (the caller looks again then, and throws out more)."""
        heap = self._heap
        for _ in range(STALE_CHUNK):
            if not heap:
                return math.inf
            at, order, key = heap[0]
            if self._at.get(key) == at and self._order[key] == order:
                return at
            heapq.heappop(heap)
        return heap[0][0] if heap else math.inf

    def _compact(self) -> None:
        """Throw the stale entries out of the heap once they outnumber the keys."""
        if len(self._heap) > 2 * len(self._at) + 64:
            self._graveyard.bury(self._heap)
            self._heap = [(at, self._order[key], key) for key, at in self._at.items()]
            heapq.heapify(self._heap)
