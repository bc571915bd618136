"""Where a rate-limit check is decided, and the callers that wait for a key.

* `exact` mode: the node that acts for the key's slot decides (`cluster/ownership.py`, the same
  slots and leases as semaphores); other nodes forward the check there (it crosses one link), and
  a node that does not act for the slot now answers 503. When a slot changes hands, its keys'
  states go with it if the old owner resigned (`RateHandover`), else they start spent at the new
  owner (`RateLimits.gain_slot`, docs/cluster.md).
* `gossip` mode: the node asked decides at once; its "go" events go to every other member
  `gossip_interval` after the first of them, and the members apply them to their copies
  (`cluster/rate_limits.py`).
* `wait`: queue for the key, first come first served, at the node that decides, until go or
  the timeout. The first in the queue tries again when its `retry_after` says, the rest sleep
  until it is their turn; while anyone waits, plain checks of that key are sorry, so that a
  flood of checks cannot starve the queue.
* Retries: a check or wait that carries a retry id gets, on a retry, the go its first try got
  (remembered where it was decided, and handed over with the key), not a second one.

Decisions are made synchronously in the asking task (as the semaphores' are), on the time of day
without its steps (`node/clock.py`'s `SteadyWall`): it never steps or runs backward, so a step
of the wall clock refills nothing and ends no hold. A hand-over carries ages and remaining
durations, which the receiver counts on its own clock (`cluster/rate_limits.py`); only gossip
mode's events say when they went, which is how the nodes place one another's admissions. The
service reads the time of day at least every `READ_INTERVAL`, so that a step is seen however
quiet the keys are. Keys idle long enough to be as good as new are forgotten every
`EVICT_INTERVAL`.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, overload

import trio

from sluicegate.cluster.ownership import Ownership
from sluicegate.cluster.quota_leases import Grant
from sluicegate.cluster.rate_algorithms import SOON, Decision
from sluicegate.cluster.rate_limits import (
    RateCheck,
    RateChecks,
    RateEvents,
    RateHandover,
    RateLease,
    RateLimits,
    RateOperation,
    RateWait,
)
from sluicegate.cluster.ring import rate_key
from sluicegate.cluster.shard import SlotChange, SlotGained, SlotLost
from sluicegate.cluster.slots import slot_of

from .clock import TRIO_CLOCK, Clock, SteadyWall
from .membership_actor import MembershipActor
from .rpc import Rpc, Unavailable

log = logging.getLogger("sluicegate.rate_limits")

EVICT_INTERVAL = 10.0
# What `SteadyWall` takes for a step is what runs beyond its slew (4%) between two readings: read
# this often, at most 10 ms of a step gets through; each reading is a wake-up of an idle node,
# which is what an idle member's CPU is made of (docs/benchmarks.md).
READ_INTERVAL = 0.25
# A forwarded check that gets no answer this long (plus a wait's own timeout) answers 503.
FORWARD_TIMEOUT = 10.0


class _Waiter:
    __slots__ = ("n", "turn", "retry_at")

    def __init__(self, n: int) -> None:
        self.n = n
        self.turn: trio.Event | None = None
        # When the first in the queue tries again (trio time).
        self.retry_at = 0.0


class HandOverLinks(Protocol):
    """What the rate limits need of the node's links (node/links.py): a resigned slot's keys
    sent to a member, and a wait until the members have them."""

    def send(self, remote_id: str, message: object) -> object: ...

    async def acknowledged(self, remote_ids: list[str], timeout: float) -> bool: ...


@dataclass(frozen=True)
class MemberReach:
    """What a cluster node's rate limits reach the other members through."""

    ownership: Ownership
    membership: MembershipActor
    rpc: Rpc
    links: HandOverLinks


class RateLimitService:
    def __init__(
        self,
        core: RateLimits,
        *,
        gossip_interval: float = 0.05,
        node_clock: Clock = TRIO_CLOCK,
        wall: Callable[[], float] = time.time,
        members: MemberReach | None = None,
    ) -> None:
        """`node_clock`: the node's own, for leases, waits and retries; decisions read it too,
        at the rate of the time of day, `wall`, and never its steps (`SteadyWall`); `members`:
        in a cluster, the other members (exact-mode keys are decided by the node that acts for
        their slot, and gossip is shared)."""
        self.core = core
        self._node_clock = node_clock
        # What every decision reads: the time of day without its steps.
        self._now = SteadyWall(node_clock, wall).now
        self._gossip_interval = gossip_interval
        # Set by the first "go" event that is not shared yet: `run` shares it within the interval.
        self._events_waiting = trio.Event()
        self._queues: dict[tuple[str, str], deque[_Waiter]] = {}
        self.waiting = dict.fromkeys(core.names, 0)
        self._members = members
        # The members this node handed keys to (a leaving node waits for them to have them).
        self._handed_to: set[str] = set()

    # -- the API -----------------------------------------------------------------------------

    def serves_here(self, op: RateOperation) -> bool:
        """Is `op` decided by this node (else `call` forwards it)?"""
        return self._owner(op) is None

    def check_here(self, op: RateCheck) -> Decision:
        """Decide a check here, now (a retry gets the go its first try got)."""
        return self._check(op.limiter, op.key, op.n, op.retry_id)

    def checks_here(self, op: RateChecks) -> list[Decision]:
        """Decide `op.times` checks here, now, one after another."""
        retry_ids = op.retry_ids or (None,) * op.times
        return [self._check(op.limiter, op.key, op.n, retry_id) for retry_id in retry_ids]

    def lease_terms(self) -> dict[str, float]:
        """The term of each limiter in lease mode."""
        return self.core.lease_terms()

    def ask_here(self, op: RateLease) -> Grant:
        """A holder's ask for a slice of a lease-mode key, answered here, now."""
        return self.core.ask(op, self._now())

    def _check(self, limiter: str, key: str, n: int, retry_id: int | None) -> Decision:
        if self._queues and self._queues.get((limiter, key)):
            repeated = self.core.earlier_go(limiter, key, retry_id)
            if repeated is not None:
                return repeated
            retry_after = max(SOON, self._queues[limiter, key][0].retry_at - self._node_clock.now())
            return self.core.refuse_behind_waiters(limiter, n, retry_after)
        decision = self.core.check(limiter, key, n, self._now(), retry_id=retry_id)
        self._note_events()
        return decision

    @overload
    async def call(self, op: RateCheck | RateWait) -> Decision: ...
    @overload
    async def call(self, op: RateChecks) -> list[Decision]: ...
    @overload
    async def call(self, op: RateLease) -> Grant: ...
    async def call(self, op: RateOperation) -> Decision | list[Decision] | Grant:
        """Decide `op` wherever it is decided; `Unavailable` while that cannot be done."""
        owner = self._owner(op)
        if owner is None:
            return await self._decide(op)
        assert self._members is not None  # only a cluster has other owners
        timeout = FORWARD_TIMEOUT + (op.timeout if isinstance(op, RateWait) else 0.0)
        return await self._members.rpc.call(owner, op, timeout)

    async def serve(self, op: RateOperation) -> Decision | list[Decision] | Grant:
        """Decide `op` for another node that forwarded it, if this node acts for its key."""
        self._refuse_unless_decided_here(op)
        return await self._decide(op)

    async def _decide(self, op: RateOperation) -> Decision | list[Decision] | Grant:
        if isinstance(op, RateCheck):
            return self.check_here(op)
        if isinstance(op, RateChecks):
            return self.checks_here(op)
        if isinstance(op, RateLease):
            return self.ask_here(op)
        return await self._wait_here(op)

    def status(self) -> list[dict]:
        """What `GET /status.json` says of each limiter: its mode, the checks and waits this node
        decided (go or sorry, since it started) and the callers queued here now."""
        return [
            {
                "name": name,
                "mode": self.core.mode(name),
                "go": self.core.stats[name].go,
                "sorry": self.core.stats[name].sorry,
                "waiting": self.waiting[name],
            }
            for name in self.core.names
        ]

    def receive(self, message: RateEvents) -> None:
        """Another node's "go" events (gossip mode)."""
        self.core.receive(message, self._now())

    # -- slots changing hands ----------------------------------------------------------------

    def slots_changed(self, changes: list[SlotChange]) -> None:
        """The shard gained or lost slots: keys go with them (`RateLimits.gain_slot`)."""
        for change in changes:
            if isinstance(change, SlotLost):
                handover = self.core.lose_slot(
                    change.slot, change.ballot, change.resigned, self._now()
                )
                members = self._members
                if handover is not None and members is not None:
                    for member in members.membership.live_members():
                        if member != members.ownership.me:
                            members.links.send(member, handover)
                            self._handed_to.add(member)
            elif isinstance(change, SlotGained):
                self.core.gain_slot(
                    change.slot, self._now(), change.ballot, change.previous, change.cold
                )

    def handed_over(self, message: RateHandover) -> None:
        """A resigning owner's states of a slot this node may take next."""
        self.core.handed_over(message, self._now())

    async def leave(self, timeout: float) -> None:
        """Stopping: wait, at most `timeout`, until the keys handed over have arrived (the
        goodbye must not overtake them: their new owners would start them spent)."""
        if self._members is not None and self._handed_to:
            if not await self._members.links.acknowledged(sorted(self._handed_to), timeout):
                log.warning("Leaving before every key handed over was acknowledged.")

    # -- the service's own task --------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Read the time of day, share this node's "go" events, forget idle keys: each when it is
        due, and no wake-up in between."""
        task_status.started()
        clock = self._node_clock
        evict_at = clock.now() + EVICT_INTERVAL
        share_at = math.inf
        while True:
            self._now()
            wake = min(clock.now() + READ_INTERVAL, share_at, evict_at)
            if share_at == math.inf:
                with clock.move_on_at(wake):
                    await self._events_waiting.wait()
                if self._events_waiting.is_set():
                    share_at = clock.now() + self._gossip_interval
                    continue
            else:
                await clock.sleep_until(wake)
            now = clock.now()
            if now >= share_at:
                self._events_waiting = trio.Event()
                self._share_events()
                share_at = math.inf
            if now >= evict_at:
                self.core.evict(self._now())
                evict_at = now + EVICT_INTERVAL

    # -- internals ---------------------------------------------------------------------------

    def _owner(self, op: RateOperation) -> str | None:
        """The node that decides `op`, or None when it is this one."""
        members = self._members
        if members is None or op.limiter not in self.waiting:
            return None  # a single node, or a limiter this node does not know: decided here
        if self.core.mode(op.limiter) == "gossip":
            return None  # every node decides: available as long as it runs
        slot, now = slot_of(rate_key(op.limiter, op.key)), self._node_clock.now()
        ownership = members.ownership
        ballot = ownership.acting_ballot(slot, now)
        if ballot is not None:
            if self.core.adopted(slot) == ballot:
                return None
            raise Unavailable("this node is taking this key's slot; ask again")
        owner = ownership.actor_of(slot, now)
        if owner is None or owner == ownership.me:
            raise Unavailable("this node does not act for this key's slot now; ask again")
        if owner not in members.membership.live_members():
            raise Unavailable(f"{owner} is down; its slots move on")
        return owner

    def _refuse_unless_decided_here(self, op: RateOperation) -> None:
        """Raise `Unavailable` unless this node decides `op` now."""
        if self._owner(op) is not None:
            raise Unavailable("this key is decided by another node now; ask again")

    async def _wait_here(self, op: RateWait) -> Decision:
        self.core.validate(op.limiter, op.n)
        repeated = self.core.earlier_go(op.limiter, op.key, op.retry_id)
        if repeated is not None:
            return repeated
        key = (op.limiter, op.key)
        queue = self._queues.get(key)
        if not queue:
            decision = self._try(op)
            if decision.go or op.timeout <= 0:
                self.core.count_decision(op.limiter, decision.go)
                return decision
            queue = self._queues[key] = deque()
        me = _Waiter(op.n)
        queue.append(me)
        self.waiting[op.limiter] += 1
        decision = Decision(False, 0, SOON)
        try:
            with self._node_clock.move_on_after(op.timeout):
                while True:
                    if queue[0] is not me:
                        me.turn = trio.Event()
                        await me.turn.wait()
                        continue
                    self._refuse_unless_decided_here(op)  # the slot may have moved
                    repeated = self.core.earlier_go(op.limiter, op.key, op.retry_id)
                    if repeated is not None:
                        return repeated  # it waited behind its first try, which went
                    decision = self._try(op)
                    if decision.go:
                        break
                    me.retry_at = self._node_clock.now() + decision.retry_after
                    await self._node_clock.sleep(decision.retry_after)
        finally:
            queue.remove(me)
            self.waiting[op.limiter] -= 1
            if not queue:
                del self._queues[key]
            elif queue[0].turn is not None:
                queue[0].turn.set()
        self.core.count_decision(op.limiter, decision.go)
        return decision

    def _try(self, op: RateWait) -> Decision:
        """One try of a waiting caller (its outcome is tallied once, at the end)."""
        decision = self.core.check(
            op.limiter, op.key, op.n, self._now(), counted=False, retry_id=op.retry_id
        )
        self._note_events()
        return decision

    def _note_events(self) -> None:
        if self.core.events_waiting:
            self._events_waiting.set()

    def _share_events(self) -> None:
        members = self._members
        if members is None:
            self.core.take_events()  # a single node has nobody to tell
            return
        message = self.core.take_events()
        if message is None:
            return
        for node_id in members.membership.live_members():
            if node_id != members.membership.node_id:
                members.links.send(node_id, message)
