"""Where a semaphore operation is served: here, or on the node that holds its state.

* `LocalSemaphores`: a single node serves everything from its own actor.
* `ClusterSemaphores`: the semaphores are sharded over the members in slots (docs/cluster.md).
  An operation on a peer goes to the peer's home, `GET /remainder` to the semaphore's owner,
  `POST /new_peer` stays here (this node draws an id homed here), and `GET /peers/` asks every
  member. The home asks the owners itself (`cluster/shard.py`), so a request crosses at most one
  link before its home, and long polls wait at the home and answer through the node the client
  talks to. While a node cannot serve something (it does not act for its slot now), the answer
  is 503, which the stock client retries.

This module also tells the shard of every change of the members (`follow_members`, which the
membership actor calls after each gossip and tick).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import trio

from sluicegate.cluster.errors import LimitError, NotServing, NotServingCutOff
from sluicegate.cluster.limits import DEFAULT_LIMITS, Limits
from sluicegate.cluster.semaphore_ops import (
    LAST_PEER_ID,
    Acquire,
    Heartbeat,
    IsAcquired,
    ListPeers,
    NewPeer,
    Operation,
    ReleaseLock,
    ReleasePeer,
    Remainder,
    Restore,
)
from sluicegate.cluster.semaphores import SemaphoreStats

from .clock import TRIO_CLOCK, Clock
from .membership_actor import MembershipActor
from .rpc import Rpc, Unavailable, Unreachable
from .semaphore_actor import Answers, SemaphoreActor
from .shard_actor import ShardActor

log = logging.getLogger("sluicegate.semaphores")

# A forwarded call that gets no answer this long (plus its own block_for) answers 503.
FORWARD_TIMEOUT = 10.0


def admitted(
    limits: Limits, requests: list[tuple[Operation, int]], answers: Answers
) -> list[tuple[Operation, int]]:
    """The requests as `limits` lets them in; those it refuses are answered with the error."""
    result = []
    for op, key in requests:
        try:
            result.append((limits.admit(op), key))
        except LimitError as error:
            answers.answered(key, None, error)
    return result


# This node's own peers, in one step: a list of 100,000 ids takes a millisecond or two, and no
# frame limits it.
EVERY_PEER = ListPeers(most=LAST_PEER_ID)


async def listed_peers(
    ask: Callable[[ListPeers], Awaitable[list[int] | None]], limit: int | None
) -> list[int]:
    """The peer ids another member answers for (at most `limit`), a page at a time: a range of
    ids with more than a page in it is split in two and asked again. No answer is larger than
    half a link's frame, whatever ids the peers have (a restore may choose them)."""
    found: list[int] = []
    ranges = [(0, LAST_PEER_ID)]
    while ranges and (limit is None or len(found) < limit):
        low, high = ranges.pop()
        page = await ask(ListPeers(low, high))
        if page is None:
            middle = (low + high) // 2
            ranges += [(middle + 1, high), (low, middle)]
        else:
            found.extend(page)
    return found if limit is None else found[:limit]


def epoch_now() -> int:
    """Fencing epoch: wall-clock milliseconds, which grow from one owner to the next."""
    return time.time_ns() // 1_000_000


class Semaphores(Protocol):
    """What the shells ask of the semaphores, wherever they are served: here, by a single
    node's actor (`LocalSemaphores`), or by the members of a cluster (`ClusterSemaphores`)."""

    @property
    def ready(self) -> bool: ...

    async def call(self, op: Operation) -> Any:
        """Apply `op` wherever it is served: its answer, or its domain error raised."""

    def serves_here(self, op: Operation) -> bool:
        """May `op` go to `submit` (this node serves it)?"""

    def submit(self, requests: list[tuple[Operation, int]], answers: Answers) -> None:
        """Apply operations served here now; `answers` hears of each by its key."""

    def withdraw(self, answers: Answers) -> None:
        """Forget what `answers` submitted and still waits."""

    async def stats(self) -> list[SemaphoreStats]: ...
    def status(self) -> dict: ...
    async def list_peers(self, limit: int | None = None) -> list[int]: ...

    def retry_here_for(self) -> float:
        """How long a client told "unavailable" should keep asking this node (0: go on)."""


class LocalSemaphores:
    """A single node: everything is served here."""

    ready = True

    def __init__(self, actor: SemaphoreActor, limits: Limits = DEFAULT_LIMITS) -> None:
        self._actor = actor
        self._limits = limits

    async def call(self, op: Operation) -> Any:
        return await self._actor.call(self._limits.admit(op))

    def serves_here(self, op: Operation) -> bool:
        return True

    def submit(self, requests: list[tuple[Operation, int]], answers: Answers) -> None:
        """Apply operations now; `answers` hears of each by its key (`SemaphoreActor.submit`)."""
        self._actor.submit(admitted(self._limits, requests, answers), answers)

    def withdraw(self, answers: Answers) -> None:
        """Forget what `answers` submitted and still waits."""
        self._actor.withdraw(answers)

    async def stats(self) -> list[SemaphoreStats]:
        return await self._actor.stats()

    def status(self) -> dict:
        """What `GET /status.json` says of this node beyond its semaphores: one node alone."""
        return {"cluster": False, "ready": True, "members": []}

    async def list_peers(self, limit: int | None = None) -> list[int]:
        return (await self._actor.call(EVERY_PEER))[:limit]

    def retry_here_for(self) -> float:
        """One node: no other member takes anything over."""
        return 0.0


class ClusterSemaphores:
    def __init__(
        self,
        actor: ShardActor,
        membership: MembershipActor,
        rpc: Rpc,
        *,
        takeover: float,
        limits: Limits = DEFAULT_LIMITS,
        clock: Clock = TRIO_CLOCK,
    ) -> None:
        """`takeover`: how long a slot can go without an acting owner, seen from a member that
        reaches a quorum (`cluster.slots.takeover_bound`)."""
        self._actor = actor
        self._shard = actor.shard
        self._membership = membership
        self._rpc = rpc
        self._clock = clock
        self._takeover = takeover
        self._limits = limits
        self._members: tuple | None = None
        self._knows_the_cluster = False
        self._unknown_seeds = 0
        self._departures: tuple = (frozenset(), frozenset())
        self.forwarded = 0

    @property
    def node_id(self) -> str:
        return self._membership.node_id

    @property
    def ready(self) -> bool:
        """Does this node act for every slot its ring names it for (and so serve its share)?"""
        return self._shard.ownership.serves_share(self._clock.now())

    def now(self) -> float:
        return self._clock.now()

    @property
    def restores_beyond_max(self) -> int:
        return self._shard.restores_beyond_max

    @property
    def shard_actor(self) -> ShardActor:
        return self._actor

    async def call(self, op: Operation) -> Any:
        """Serve `op` wherever its state lives; `Unavailable` (503) while that cannot be done."""
        try:
            op = self._limits.admit(op)
            target = self._target(op)
            if target is None or target == self.node_id:
                return await self._actor.call(op)
            if target not in self._membership.live_members():
                raise Unavailable(f"{target} is down; its slots move on")
            timeout = FORWARD_TIMEOUT
            if isinstance(op, Acquire) and op.block_for:
                timeout += op.block_for
            self.forwarded += 1
            return await self._rpc.call(target, op, timeout)
        except NotServing as error:
            cut_off = isinstance(error, NotServingCutOff)
            raise (Unreachable if cut_off else Unavailable)(error.reason) from None

    def retry_here_for(self) -> float:
        """How long a client should go on asking this node through its 503s: while its own
        links reach a quorum, whatever it cannot serve gets an acting owner within the takeover
        bound; cut off from most, 0 (its clients had better move on)."""
        return self._takeover if self._shard.ownership.reaches_quorum(self._clock.now()) else 0.0

    def serves_here(self, op: Operation) -> bool:
        """Is `op` served by this node's own actor (else `call` forwards it)?"""
        target = self._target(op)
        return target is None or target == self.node_id

    def submit(self, requests: list[tuple[Operation, int]], answers: Answers) -> None:
        """Apply operations this node serves now; `answers` hears of each by its key. A
        `NotServing` error means 503."""
        self._actor.submit(admitted(self._limits, requests, answers), answers)

    def withdraw(self, answers: Answers) -> None:
        """Forget what `answers` submitted here and still waits (forwarded calls withdraw when
        cancelled, but only at this node: the home elsewhere answers when it answers)."""
        self._actor.withdraw(answers)

    async def serve(self, op: Operation) -> Any:
        """Run `op` here, for another node (the shard refuses what this node does not serve)."""
        return await self._actor.call(op)

    async def stats(self) -> list[SemaphoreStats]:
        """Throttle's gauges of the semaphores this node owns (each node reports its own)."""
        return self._shard.stats(self._clock.now())

    def status(self) -> dict:
        """What `GET /status.json` says of this node beyond its semaphores: its members and
        its share of the slots."""
        now = self._clock.now()
        ownership = self._shard.ownership
        return {
            "cluster": True,
            "node": self.node_id,
            "ready": ownership.serves_share(now),
            "members": self._membership.report(),
            "slots_acting": len(ownership.acting_slots(now)),
            "peers_homed": len(self._shard.home.peers),
            "waiting_for_quorum": ownership.gate.waiting,
            "semaphores_in_grace": sorted(self._shard.owner.leases.in_grace()),
        }

    def _target(self, op: Operation) -> str | None:
        match op:
            case NewPeer():
                return None
            case Remainder(semaphore):
                if semaphore not in self._shard.semaphore_names:
                    return None  # answered here: unknown semaphore
                return self._shard.owner_of(semaphore, self._clock.now())
            case Acquire() | ReleaseLock() | Heartbeat() | ReleasePeer() | IsAcquired() | Restore():
                return self._shard.home_of(op.peer_id, self._clock.now())
        raise TypeError(f"not a semaphore operation: {op!r}")

    async def list_peers(self, limit: int | None = None) -> list[int]:
        """Every live member's peers (at most `limit`), member by member."""
        peer_ids: list[int] = []
        for node_id in sorted(self._membership.live_members()):
            left = None if limit is None else limit - len(peer_ids)
            if left == 0:
                break
            if node_id == self.node_id:
                peer_ids.extend((await self._actor.call(EVERY_PEER))[:left])
                continue

            async def ask(op: ListPeers, node_id: str = node_id) -> list[int] | None:
                return await self._rpc.call(node_id, op, FORWARD_TIMEOUT)

            peer_ids.extend(await listed_peers(ask, left))
        return peer_ids

    # -- keeping the shard informed ----------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Tell the shard of the members as they are now; the membership actor calls
        `follow_members` after each change from then on."""
        self.follow_members()
        task_status.started()

    def follow_members(self) -> None:
        """Tell the shard of the members, if they changed since it was last told, and once that
        the membership knows the cluster (`Ownership.knows_the_voters`)."""
        members = (self._membership.generations(), self._membership.known_members())
        if members != self._members:
            if self._members is not None:
                log.info("Members now: %s.", ", ".join(sorted(members[0])))
            self._members = members
            self._actor.members_changed(*members)
        departures = self._membership.departures()
        if departures != self._departures:
            self._departures = departures
            self._actor.departures_changed(*departures)
        # After the members: a seed that became a known member counts once, as a voter.
        unknown_seeds = self._membership.unknown_seeds()
        if unknown_seeds != self._unknown_seeds:
            self._unknown_seeds = unknown_seeds
            self._actor.unknown_seeds(unknown_seeds)
        if not self._knows_the_cluster and self._membership.knows_the_cluster():
            self._knows_the_cluster = True
            self._actor.knows_the_voters()

    async def leave(self, timeout: float) -> None:
        """Stopping: hand every slot on before the goodbye, waiting at most `timeout`."""
        await self._actor.leave(timeout)
