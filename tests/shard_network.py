"""Several `ShardCore`s joined by an in-memory network, for tests of the home/owner protocol.

Every ordered pair of nodes has a FIFO queue, as a node link does: it outlives a node's restart,
and a message meant for an earlier life of its destination is dropped on delivery, as a link
does. Tests deliver messages one at a time, all of them, or drop them, and move a shared virtual
clock.
"""

from __future__ import annotations

import random
from collections import deque

from sluicegate.cluster.semaphores import SemaphoreConfig
from sluicegate.cluster.shard import ShardCore

SETTLE = 1.0
TAKEOVER_GRACE = 3.0
PULL_RETRY = 1.0


class ShardNetwork:
    def __init__(self, config: dict[str, SemaphoreConfig], node_ids: list[str], seed: int = 0):
        self.config = config
        self.rng = random.Random(seed)
        self.now = 0.0
        self.epoch = 1000
        self.nodes: dict[str, ShardCore] = {}
        self.generations: dict[str, int] = {}
        self.generation_count = 0
        self.queues: dict[tuple[str, str], deque] = {}
        self.events: dict[str, list] = {}
        # The sides of a partition (`partition`); empty while every link is up.
        self.cut: list[list[str]] = []
        for node_id in node_ids:
            self.start(node_id)
        self.change_members(cold=True)
        self.deliver_all()

    def start(self, node_id: str) -> ShardCore:
        """A node (re)starts empty, with a new generation."""
        self.generation_count += 1  # like the wall clock a real node uses: never repeats
        self.generations[node_id] = self.generation_count
        self.epoch += 1
        self.nodes[node_id] = ShardCore(
            node_id,
            self.config,
            rng=random.Random(self.rng.getrandbits(32)),
            epoch=self.epoch,
            settle=SETTLE,
            takeover_grace=TAKEOVER_GRACE,
            cold_start_grace=0.0,
            pull_retry=PULL_RETRY,
        )
        self.events[node_id] = []
        self._drop_unsent(node_id)
        return self.nodes[node_id]

    def kill(self, node_id: str) -> None:
        """The node dies; what others queued for it waits, as on a link that is down."""
        del self.nodes[node_id]
        del self.generations[node_id]
        self._drop_unsent(node_id)

    def _drop_unsent(self, node_id: str) -> None:
        """What a node's life had not sent yet is gone with it."""
        for pair in [pair for pair in self.queues if pair[0] == node_id]:
            del self.queues[pair]

    def change_members(
        self,
        cold: bool = False,
        only: list[str] | None = None,
        sees: list[str] | None = None,
        majority: bool = True,
        left: tuple[str, ...] = (),
    ) -> None:
        """Every live node (or those in `only`) learns the current members (or that only
        those in `sees` are alive; that those in `left` said goodbye)."""
        self.epoch += 1
        members = {n: g for n, g in self.generations.items() if sees is None or n in sees}
        for node_id in only or list(self.nodes):
            self.nodes[node_id].change_members(members, self.now, self.epoch, cold, majority, left)
            self.collect(node_id)

    def partition(self, *sides: list[str]) -> None:
        """Cut every link between the sides; each side sees only itself, and knows whether it
        is a majority of all the nodes."""
        for pair in list(self.queues):
            if not any(pair[0] in side and pair[1] in side for side in sides):
                self.queues[pair].clear()
        for side in sides:
            majority = 2 * len(side) > len(self.nodes)
            self.change_members(only=side, sees=side, majority=majority)
        self.cut = [list(side) for side in sides]

    def collect(self, node_id: str) -> None:
        node = self.nodes[node_id]
        for destination, generation, message in node.outbox():
            if not self._cut_between(node_id, destination):
                self.queues.setdefault((node_id, destination), deque()).append(
                    (generation, message)
                )
        self.events[node_id].extend(node.events())

    def _cut_between(self, a: str, b: str) -> bool:
        return bool(self.cut) and not any(a in side and b in side for side in self.cut)

    def heal(self) -> None:
        self.cut = []
        self.change_members()

    def send_replicas(self) -> None:
        """Every node streams its replica to the others (the messages queue like any)."""
        for node_id, node in self.nodes.items():
            node.replicate(self.now)
            self.collect(node_id)

    def deliver_one(self, source: str, destination: str) -> bool:
        queue = self.queues.get((source, destination))
        if not queue or destination not in self.nodes:
            return False
        generation, message = queue.popleft()
        if generation is not None and generation != self.generations[destination]:
            return True  # meant for an earlier life of the destination: the link drops it
        self.nodes[destination].on_message(source, message, self.now)
        self.collect(destination)
        return True

    def deliver_all(self, limit: int = 100_000) -> int:
        delivered = 0
        while True:
            busy = [pair for pair, queue in self.queues.items() if queue and pair[1] in self.nodes]
            if not busy:
                return delivered
            for source, destination in busy:
                self.deliver_one(source, destination)
                delivered += 1
            if delivered > limit:
                raise AssertionError("messages keep flowing: a loop between nodes")

    def advance(self, seconds: float) -> None:
        """Move the clock, waking every node at each of its deadlines on the way."""
        end = self.now + seconds
        for _ in range(100_000):
            deadlines = [
                d for n in self.nodes.values() if (d := n.next_deadline()) is not None and d <= end
            ]
            self.now = max(self.now, min(deadlines)) if deadlines else end
            for node_id, node in self.nodes.items():
                node.expire(self.now)
                self.collect(node_id)
            self.deliver_all()
            if not deadlines:
                return
        stuck = {node_id: node.next_deadline() for node_id, node in self.nodes.items()}
        raise AssertionError(f"a deadline that does not move (a busy actor): {stuck} at {self.now}")

    def _viewer(self) -> ShardCore:
        """A node that serves: its view of the members is the majority's."""
        return next(node for node in self.nodes.values() if node.serving)

    def home(self, peer_id: int) -> ShardCore:
        return self.nodes[self._viewer().home_of(peer_id)]

    def owner(self, semaphore: str) -> ShardCore:
        return self.nodes[self._viewer().owner_of(semaphore)]

    def new_peer(self, node_id: str, expires_in: float = 60.0) -> int:
        peer_id = self.nodes[node_id].new_peer(self.now + expires_in, self.rng)
        self.collect(node_id)
        return peer_id

    def acquire(self, peer_id: int, semaphore: str, count: int = 1) -> bool:
        """Acquire at the peer's home and deliver everything: does the peer hold all its locks?"""
        home = self.home(peer_id)
        result = home.acquire(peer_id, semaphore, count, self.now)
        self.collect(home.node_id)
        self.deliver_all()
        return home.is_acquired(peer_id) if result is None else result

    def release(self, peer_id: int, semaphore: str) -> None:
        home = self.home(peer_id)
        home.release_lock(peer_id, semaphore)
        self.collect(home.node_id)
        self.deliver_all()

    def acquired(self, semaphore: str) -> int:
        """The count held on `semaphore`, as its owner sees it."""
        owner = self.owner(semaphore)
        return self.config[semaphore].max - owner.remainder(semaphore)

    def token(self, peer_id: int, semaphore: str) -> int | None:
        return self.home(peer_id).fencing_token(peer_id, semaphore)
