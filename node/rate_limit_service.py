"""Where a rate-limit check is decided, and the callers that wait for a key.

* `exact` mode: the owner of (limiter, key) on the ring decides; other nodes forward the check
  there (it crosses one link). On a single node, this node owns every key. Every
  `gossip_interval`, the keys that changed go to their successors on the ring (replicas), which
  start from them when they come to decide those keys; when the members change, keys a node no
  longer owns go to their new owner. A node that joins (or gets its majority back, having
  dropped its exact keys when it lost it) asks every member for the keys it owns now
  (`RatePull`, again every interval) and decides no exact key before each answered
  (`RateHandoff`, sent once that member counts it in and stops deciding them): so two nodes
  never decide one key at once, and no decision of the old owner is lost.
* `gossip` mode: the node asked decides at once; every `gossip_interval` its "go" events go to
  every other member, which apply them to their copies (`cluster/rate_limits.py`).
* `wait`: queue for the key, first come first served, at the node that decides, until go or
  the timeout. The first in the queue tries again when its `retry_after` says, the rest sleep
  until it is their turn; while anyone waits, plain checks of that key are sorry, so that a
  flood of checks cannot starve the queue.

Decisions are made synchronously in the asking task (as the semaphore actor's are), with the
wall clock: gossiped events carry the time they were admitted at, which other nodes compare with
theirs. Keys idle long enough to be as good as new are forgotten every `EVICT_INTERVAL`.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable

import trio

from sluicegate.cluster.rate_algorithms import SOON, Decision
from sluicegate.cluster.rate_limits import (
    RateCheck,
    RateChecks,
    RateEvents,
    RateHandoff,
    RateLimits,
    RateOperation,
    RatePull,
    RateStates,
    RateWait,
)
from sluicegate.cluster.ring import rate_key

from .links import Links
from .membership_actor import MembershipActor
from .rpc import Rpc, Unavailable

log = logging.getLogger("sluicegate.rate_limits")

EVICT_INTERVAL = 10.0
# A forwarded check that gets no answer this long (plus a wait's own timeout) answers 503.
FORWARD_TIMEOUT = 10.0


class _Waiter:
    __slots__ = ("n", "turn", "retry_at")

    def __init__(self, n: int) -> None:
        self.n = n
        self.turn: trio.Event | None = None
        # When the first in the queue tries again (trio time).
        self.retry_at = 0.0


class RateLimitService:
    def __init__(
        self,
        core: RateLimits,
        *,
        gossip_interval: float = 0.05,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.core = core
        self._clock = clock
        self._gossip_interval = gossip_interval
        self._queues: dict[tuple[str, str], deque[_Waiter]] = {}
        self.waiting = dict.fromkeys(core.names, 0)
        self._membership: MembershipActor | None = None
        self._rpc: Rpc | None = None
        self._links: Links | None = None
        # Does this node see a majority of the members? Looked at every `gossip_interval`, as
        # the semaphores look at the members, rather than on every check.
        self._majority = True
        # The members whose `RateHandoff` this node waits for before it decides exact keys.
        self._awaiting: set[str] = set()
        # A node that joins learns the members for `settle` seconds (as its semaphores do)
        # before it takes any exact key as its own.
        self._members_known = False
        self._known_at = 0.0

    def join_cluster(
        self, membership: MembershipActor, rpc: Rpc, links: Links, settle: float
    ) -> None:
        """From now on, exact-mode keys are decided by their owners (after `settle` seconds to
        learn who they are), and gossip is shared."""
        self._membership, self._rpc, self._links = membership, rpc, links
        self._known_at = trio.current_time() + settle

    # -- the API -----------------------------------------------------------------------------

    def serves_here(self, op: RateOperation) -> bool:
        """Is `op` decided by this node (else `call` forwards it)?"""
        return self._owner(op) is None

    def check_here(self, op: RateCheck | RateChecks) -> Decision:
        """Decide a check here, now."""
        queue = self._queues.get((op.limiter, op.key))
        if queue:
            retry_after = max(SOON, queue[0].retry_at - trio.current_time())
            return self.core.refuse_behind_waiters(op.limiter, op.n, retry_after)
        return self.core.check(op.limiter, op.key, op.n, self._clock())

    def checks_here(self, op: RateChecks) -> list[Decision]:
        """Decide `op.times` checks here, now, one after another."""
        return [self.check_here(op) for _ in range(op.times)]

    async def call(self, op: RateOperation) -> Decision | list[Decision]:
        """Decide `op` wherever it is decided; `Unavailable` while that cannot be done."""
        owner = self._owner(op)
        if owner is None:
            return await self.serve(op)
        timeout = FORWARD_TIMEOUT + (op.timeout if isinstance(op, RateWait) else 0.0)
        return await self._rpc.call(owner, op, timeout)

    async def serve(self, op: RateOperation) -> Decision | list[Decision]:
        """Decide `op` here (also for another node that forwarded it)."""
        if self._membership is not None and self.core.mode(op.limiter) == "exact":
            self._refuse_until_handed_over()
        if isinstance(op, RateCheck):
            return self.check_here(op)
        if isinstance(op, RateChecks):
            return self.checks_here(op)
        return await self._wait_here(op)

    def receive(self, message: RateEvents) -> None:
        """Another node's "go" events (gossip mode)."""
        self.core.receive(message, self._clock())

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Forget idle keys now and then; in a cluster, share this node's "go" events."""
        task_status.started()
        next_eviction = trio.current_time() + EVICT_INTERVAL
        members: frozenset[str] | None = None
        while True:
            await trio.sleep(self._gossip_interval)
            if self._membership is not None and trio.current_time() >= self._known_at:
                self._members_known = True
                majority = self._membership.in_majority()
                if self._majority and not majority:
                    self.core.drop_exact()
                    members = None  # rejoin when the majority is back
                self._majority = majority
                now_members = frozenset(self._membership.live_members())
                if majority and now_members != members:  # joined, or a member came or went
                    if members is None:
                        self._awaiting = set(now_members) - {self._membership.node_id}
                    self._awaiting &= now_members  # one that died answers no more
                    members = now_members
                    self._hand_over()
                for node_id in sorted(self._awaiting):
                    self._links.send(node_id, RatePull())
                self._replicate()
            self._share_events()
            if trio.current_time() >= next_eviction:
                self.core.evict(self._clock())
                next_eviction = trio.current_time() + EVICT_INTERVAL

    def store(self, message: RateStates) -> None:
        """Key states from another node: handed over to this one, or replicas."""
        self.core.store(message, self._owned)

    def pulled(self, node_id: str) -> None:
        """`node_id` joined and asks for the keys it owns now: once this node counts it as a
        member (so forwards those keys to it from now on), they go, and are decided here no
        more. Until then it asks again."""
        if self._membership is None or node_id not in self._membership.live_members():
            return
        ring = self._membership.ring
        keys = [
            key
            for key in self.core.held_keys() + self.core.replica_keys()
            if ring.owner(rate_key(*key)) == node_id
        ]
        self._links.send(node_id, RateHandoff(self.core.export(keys, drop=True).states))

    def handed_over(self, node_id: str, message: RateHandoff) -> None:
        self.core.store(message, self._owned)
        self._awaiting.discard(node_id)

    # -- internals ---------------------------------------------------------------------------

    def _owner(self, op: RateOperation) -> str | None:
        """The node that decides `op`, or None when it is this one."""
        if self._membership is None or op.limiter not in self.waiting:
            return None  # a single node, or a limiter this node does not know: decided here
        if self.core.mode(op.limiter) == "gossip":
            return None  # every node decides: available as long as it runs
        if not (self._majority and self._membership.in_majority()):
            # As semaphores do: a node cut off from most members decides nothing exact, since
            # the majority side may have given its keys to another owner. (Asked now, not as of
            # the last look: the ring changes at once, and one of itself alone owns every key.)
            raise Unavailable("this node sees no majority of the members")
        owner = self._membership.ring.owner(rate_key(op.limiter, op.key))
        if owner is None:
            raise Unavailable("no member owns this key yet")
        if owner != self._membership.node_id:
            return owner
        self._refuse_until_handed_over()
        return None

    def _refuse_until_handed_over(self) -> None:
        if not self._members_known:
            raise Unavailable("this node is still joining the cluster")
        if self._awaiting:
            raise Unavailable("this node joined moments ago: its keys are on their way to it")

    async def _wait_here(self, op: RateWait) -> Decision:
        self.core.validate(op.limiter, op.n)
        key = (op.limiter, op.key)
        queue = self._queues.get(key)
        if not queue:
            decision = self.core.check(op.limiter, op.key, op.n, self._clock(), tally=False)
            if decision.go or op.timeout <= 0:
                self.core.tally(op.limiter, decision.go)
                return decision
            queue = self._queues[key] = deque()
        me = _Waiter(op.n)
        queue.append(me)
        self.waiting[op.limiter] += 1
        decision = Decision(False, 0, SOON)
        try:
            with trio.move_on_after(op.timeout):
                while True:
                    if queue[0] is not me:
                        me.turn = trio.Event()
                        await me.turn.wait()
                        continue
                    decision = self.core.check(op.limiter, op.key, op.n, self._clock(), tally=False)
                    if decision.go:
                        break
                    me.retry_at = trio.current_time() + decision.retry_after
                    await trio.sleep(decision.retry_after)
        finally:
            queue.remove(me)
            self.waiting[op.limiter] -= 1
            if not queue:
                del self._queues[key]
            elif queue[0].turn is not None:
                queue[0].turn.set()
        self.core.tally(op.limiter, decision.go)
        return decision

    def _owned(self, limiter: str, key: str) -> bool:
        return self._membership.ring.owner(rate_key(limiter, key)) == self._membership.node_id

    def _hand_over(self) -> None:
        """Keys this node kept that another member decides now go to it."""
        ring, me = self._membership.ring, self._membership.node_id
        leaving: dict[str, list] = {}
        for key in self.core.held_keys():
            owner = ring.owner(rate_key(*key))
            if owner is not None and owner != me:
                leaving.setdefault(owner, []).append(key)
        for owner, keys in leaving.items():
            self._links.send(owner, self.core.export(keys, drop=True))

    def _replicate(self) -> None:
        """The keys that changed here go to their successors, who take over if this node dies."""
        ring, me = self._membership.ring, self._membership.node_id
        by_successor: dict[str, list] = {}
        for key in self.core.changed_keys():
            owners = ring.preference_list(rate_key(*key), 2)
            if len(owners) == 2 and owners[0] == me:
                by_successor.setdefault(owners[1], []).append(key)
        for successor, keys in by_successor.items():
            self._links.send(successor, self.core.export(keys))

    def _share_events(self) -> None:
        if self._membership is None:
            self.core.take_events()  # a single node has nobody to tell
            return
        message = self.core.take_events()
        if message is None:
            return
        for node_id in self._membership.live_members():
            if node_id != self._membership.node_id:
                self._links.send(node_id, message)
