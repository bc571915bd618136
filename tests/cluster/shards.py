"""Several `Shard`s (cluster/shard.py) joined by an in-memory network, for tests of the home and
owner rules over slot ownership, without trio or sockets.

Every ordered pair of nodes has a FIFO queue, as a node link does. Tests deliver everything that
is queued (`settle`), or hold a pair's messages (`hold`) and let them go later (`release`), and
move the shared virtual clock. Client operations go to a node, and their answers come back
as `Answer`s by request id.
"""

from __future__ import annotations

import itertools
import random
from collections import deque

from sluicegate.cluster.ownership import Ownership
from sluicegate.cluster.peers import raise_tickets
from sluicegate.cluster.semaphore_leases import SemaphoreConfig
from sluicegate.cluster.semaphore_ops import Operation
from sluicegate.cluster.shard import Answer, Shard

LEASE = 1.0


class Shards:
    def __init__(
        self,
        config: dict[str, SemaphoreConfig],
        ids: list[str],
        seed: int = 0,
        configs: dict[str, dict[str, SemaphoreConfig]] | None = None,
    ):
        """`configs`: the semaphores of the nodes configured otherwise than with `config`."""
        self.config = config
        self.configs = dict(configs or {})
        self.ids = list(ids)
        self.rng = random.Random(seed)
        self.now = 0.0
        self.nodes: dict[str, Shard] = {}
        self.queues: dict[tuple[str, str], deque] = {}
        self.held: set[tuple[str, str]] = set()
        self.answers: dict[int, Answer] = {}
        self._ids = itertools.count(1)
        self._lives = itertools.count(1)
        self.lives: dict[str, int] = {}
        for node_id in ids:
            self.start(node_id)
        self.run(4.0)

    # -- the cluster ------------------------------------------------------------------------

    def start(self, node_id: str) -> Shard:
        life = self.lives[node_id] = next(self._lives)
        ownership = Ownership(
            node_id,
            life=life,
            lease=LEASE,
            settle=LEASE,
            era_floor=1000,
            rng=random.Random(self.rng.getrandbits(32)),
            now=self.now,
            adopted=raise_tickets,
        )
        config = self.configs.get(node_id, self.config)
        shard = Shard(node_id, config, ownership, random.Random(self.rng.getrandbits(32)))
        self.nodes[node_id] = shard
        for pair in [p for p in self.queues if node_id in p]:
            del self.queues[pair]  # a new life: nothing was said to it, nor by it
        self._members()
        return shard

    def kill(self, node_id: str) -> None:
        del self.nodes[node_id]
        for pair in [p for p in self.queues if node_id in p]:
            del self.queues[pair]
        self._members()

    def _members(self) -> None:
        live = {n: self.lives[n] for n in self.nodes}
        for node_id, shard in self.nodes.items():
            shard.members_changed(live, self.ids, self.now)
            self._collect(node_id)

    def hold(self, a: str, b: str) -> None:
        """Messages between `a` and `b` wait (both ways), as on a clogged link."""
        self.held.update({(a, b), (b, a)})

    def release(self, a: str, b: str) -> None:
        self.held -= {(a, b), (b, a)}

    # -- running ----------------------------------------------------------------------------

    def settle(self) -> None:
        """Deliver everything deliverable, until nothing moves."""
        for _ in range(10_000):
            moved = False
            for pair, queue in list(self.queues.items()):
                if pair in self.held or not queue:
                    continue
                sender, receiver = pair
                message = queue.popleft()
                moved = True
                shard = self.nodes.get(receiver)
                if shard is not None:
                    shard.receive(sender, message, self.now)
                    shard.flush(self.now)
                    self._collect(receiver)
            if not moved:
                return
        raise AssertionError("the messages never settle")

    def run(self, seconds: float, step: float = 0.05) -> None:
        """Let `seconds` pass, ticking every node whose deadline comes, delivering as it goes."""
        end = self.now + seconds
        while self.now < end:
            self.now = min(end, self.now + step)
            for node_id, shard in list(self.nodes.items()):
                if self.now >= shard.next_deadline():
                    shard.tick(self.now)
                    self._collect(node_id)
            self.settle()

    def _collect(self, node_id: str) -> None:
        shard = self.nodes[node_id]
        for member, message in shard.outbox():
            self.queues.setdefault((node_id, member), deque()).append(message)
        for answer in shard.answers():
            self.answers[answer.request_id] = answer
        shard.slot_changes()

    # -- clients ----------------------------------------------------------------------------

    def submit(self, node_id: str, op: Operation) -> int:
        """Send `op` to `node_id` (the node that acts for its slot); its request id."""
        request_id = next(self._ids)
        shard = self.nodes[node_id]
        shard.submit(request_id, op, self.now)
        self._collect(node_id)
        return request_id

    def call(self, op: Operation, node_id: str | None = None) -> Answer:
        """Run `op` at the node that acts for it (or `node_id`), and settle; its answer."""
        target = node_id or self.target(op)
        request_id = self.submit(target, op)
        self.settle()
        return self.answers.pop(request_id, None)

    def target(self, op: Operation) -> str:
        shard = next(iter(self.nodes.values()))
        if hasattr(op, "peer_id"):
            return shard.home_of(op.peer_id, self.now)
        if hasattr(op, "semaphore"):
            return shard.owner_of(op.semaphore, self.now)
        return shard.me
