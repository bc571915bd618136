"""Where a rate-limit check is decided, and the callers that wait for a key.

* `exact` mode: the owner of (limiter, key) on the ring decides; other nodes forward the check
  there (it crosses one link), and decides only the keys its own ring gives it. On a single
  node, this node owns every key. When the members change, keys a node no longer owns go to
  their new owner; a node that leaves hands all of them over before its goodbye. A node that
  joins (or gets its majority back) asks every member for the keys it owns now (`RatePull`,
  again every interval) and decides no exact key before each answered (`RateHandoff`, sent once
  that member counts it in and stops deciding them): so two nodes never decide one key at once,
  and no decision of the old owner is lost.
* A member that fails (counted down without a goodbye, or back as a new life) took its
  decisions with it: every node records a `Takeover`, so that its keys start spent wherever
  they are decided next, and hands its takeovers to joiners. So does a majority that forms
  after an outage for a member it does not hear of. An owner stops deciding once it has not
  heard of a majority for `down_after` less a gossip interval, before the others can count it
  down and take its keys over.
* `gossip` mode: the node asked decides at once; every `gossip_interval` its "go" events go to
  every other member, which apply them to their copies (`cluster/rate_limits.py`).
* `wait`: queue for the key, first come first served, at the node that decides, until go or
  the timeout. The first in the queue tries again when its `retry_after` says, the rest sleep
  until it is their turn; while anyone waits, plain checks of that key are sorry, so that a
  flood of checks cannot starve the queue.
* Retries: a check or wait that carries a retry id gets, on a retry, the go its first try got
  (remembered where it was decided, and handed over with the key), not a second one.

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
    Takeover,
)
from sluicegate.cluster.ring import Ring, rate_key

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
        # An owner decides exact keys only while it heard of a majority this recently.
        self._heard_within = 0.0
        # The members (and their generations) as of the last look, None out of the majority.
        self._members: dict[str, int] | None = None
        self._ring_seen = None
        self._leaving = False
        # Members awaited but not heard of until then count as failed (see `_look`).
        self._unseen_until = 0.0
        # When the run loop last looked in: a longer gap than `_heard_within` means this node
        # was frozen (see `_step_down_if_frozen`).
        self._watched_at: float | None = None
        self._settle = 0.0

    def join_cluster(
        self,
        membership: MembershipActor,
        rpc: Rpc,
        links: Links,
        settle: float,
        heard_within: float,
    ) -> None:
        """From now on, exact-mode keys are decided by their owners (after `settle` seconds to
        learn who they are, and while they heard of a majority within `heard_within`), and
        gossip is shared."""
        self._membership, self._rpc, self._links = membership, rpc, links
        self._known_at = trio.current_time() + settle
        self._settle = settle
        self._heard_within = heard_within

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

    def _check(self, limiter: str, key: str, n: int, retry_id: int | None) -> Decision:
        if self._queues and self._queues.get((limiter, key)):
            repeated = self.core.repeat(limiter, key, retry_id)
            if repeated is not None:
                return repeated
            retry_after = max(SOON, self._queues[limiter, key][0].retry_at - trio.current_time())
            return self.core.refuse_behind_waiters(limiter, n, retry_after)
        return self.core.check(limiter, key, n, self._clock(), retry_id=retry_id)

    async def call(self, op: RateOperation) -> Decision | list[Decision]:
        """Decide `op` wherever it is decided; `Unavailable` while that cannot be done."""
        owner = self._owner(op)
        if owner is None:
            return await self._decide(op)
        timeout = FORWARD_TIMEOUT + (op.timeout if isinstance(op, RateWait) else 0.0)
        return await self._rpc.call(owner, op, timeout)

    async def serve(self, op: RateOperation) -> Decision | list[Decision]:
        """Decide `op` for another node that forwarded it, if this node's own ring gives it
        the key (the two may see other members for a moment)."""
        self._refuse_unless_decided_here(op)
        return await self._decide(op)

    async def _decide(self, op: RateOperation) -> Decision | list[Decision]:
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
        while True:
            await trio.sleep(self._gossip_interval)
            if self._membership is not None:
                self._step_down_if_frozen()
                self._watched_at = trio.current_time()
                if self._watched_at >= self._known_at:
                    self._members_known = True
                    self._look()
                    for node_id in sorted(self._awaiting):
                        self._links.send(node_id, RatePull())
            self._share_events()
            if trio.current_time() >= next_eviction:
                self.core.evict(self._clock())
                next_eviction = trio.current_time() + EVICT_INTERVAL

    def _look(self) -> None:
        """Take in what changed among the members since the last look: the keys of members
        that failed start spent, and keys go to the members that own them now. A node back in
        a majority (or joining) pulls its keys from every member before it decides any."""
        membership, me, now = self._membership, self._membership.node_id, self._clock()
        self._ring_seen = membership.ring
        if not membership.in_majority():
            # It keeps its states: whoever decided its keys meanwhile hands them back to it,
            # at least as spent, and the two accounts merge.
            self._majority = False
            self._members = None
            return
        self._majority = True
        generations = membership.generations()
        before = self._members
        if before is None:
            self._awaiting = membership.known_members() - {me}
            self._unseen_until = trio.current_time() + self._settle
        else:
            members = tuple(sorted(before))
            left = membership.left_members()
            for node_id, generation in before.items():
                if node_id != me and node_id not in left and generations.get(node_id) != generation:
                    # Failed, or a new life: it answers no pull from now on.
                    self.core.take_over(Takeover(node_id, members, now))
                    self._awaiting.discard(node_id)
        unseen = self._awaiting - set(generations)
        if unseen and trio.current_time() >= self._unseen_until:
            # Members not heard of since this majority formed (after an outage, or a partition
            # while another failed) have stopped deciding by now, having heard of no majority
            # for as long; they may have been deciding their keys until then, on the ring of
            # any majority they were in.
            known = tuple(sorted(membership.known_members()))
            depth = len(known) - (len(known) // 2 + 1) + 1
            for node_id in sorted(unseen):
                self.core.take_over(Takeover(node_id, known, now, depth))
            self._awaiting -= unseen
        self._members = generations
        if before is None or set(before) != set(generations):
            self._hand_over()

    async def leave(self, timeout: float) -> None:
        """This node is about to say goodbye: it decides no exact key from now on, and hands
        each over to the member that owns it without this node. The goodbye must not overtake
        the keys (their new owners would start them afresh), so this waits, at most `timeout`,
        until the owners acknowledged them."""
        self._leaving = True
        if self._membership is None:
            return
        me = self._membership.node_id
        ring = Ring([node_id for node_id in self._membership.live_members() if node_id != me])
        owners = self._send_to_owners(self.core.held_keys(), ring)
        if not await self._links.acknowledged(owners, timeout):
            log.warning("Leaving before every key handed over was acknowledged.")

    def store(self, message: RateStates) -> None:
        """Key states handed over by another node (the members changed, or it leaves)."""
        self.core.store(message.states)

    def pulled(self, node_id: str) -> None:
        """`node_id` joined and asks for the keys it owns now: once this node counts it as a
        member (so forwards those keys to it from now on), they go, and are decided here no
        more. Until then it asks again."""
        if self._membership is None or node_id not in self._membership.live_members():
            return
        if self._members is not None and self._membership.ring is not self._ring_seen:
            self._look()  # a new life of `node_id` makes its old one's keys start spent
        ring = self._membership.ring
        keys = [key for key in self.core.held_keys() if ring.owner(rate_key(*key)) == node_id]
        states = self.core.export(keys, drop=True).states
        takeovers = self.core.takeovers(self._clock())
        live = set(self._membership.generations())
        accounted = ()
        if self._members is not None and not self._awaiting - live:
            accounted = tuple(sorted(self._membership.known_members() - live))
        self._links.send(node_id, RateHandoff(states, takeovers, accounted))

    def handed_over(self, node_id: str, message: RateHandoff) -> None:
        for takeover in message.takeovers:
            self.core.take_over(takeover)
        self.core.store(message.states)
        self._awaiting.discard(node_id)
        # Members this node has not heard of, whose failure a member sure of it accounted for.
        self._awaiting -= set(message.accounted) - set(self._membership.live_members())

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

    def _refuse_unless_decided_here(self, op: RateOperation) -> None:
        """Raise `Unavailable` unless this node decides `op` now."""
        if self._owner(op) is not None:
            raise Unavailable("this key is decided by another node now; ask again")

    def _step_down_if_frozen(self) -> None:
        """On waking from a freeze (SIGSTOP, a stalled VM) longer than `heard_within`, before
        deciding anything: the others may have counted this node down meanwhile, and decided
        its keys from spent. It decides them again only once it has pulled them back, as a node
        back in a majority does (chaos seed 11: a node woken from 3.5 s decided a key from its
        own state before the new owner's state reached it, and the key admitted 5 of 3)."""
        now = trio.current_time()
        if self._watched_at is None or now - self._watched_at <= self._heard_within:
            return
        self._watched_at = now
        if self._members is not None:
            log.warning("Frozen: deciding no exact key until the others have handed them back.")
            self._members = None

    def _refuse_until_handed_over(self) -> None:
        self._step_down_if_frozen()
        if self._leaving:
            raise Unavailable("this node is leaving the cluster")
        if not self._members_known:
            raise Unavailable("this node is still joining the cluster")
        if self._membership.ring is not self._ring_seen:
            # The members changed since the last look: a failed member's keys start spent,
            # and a node back in a majority pulls its keys, before anything is decided here.
            self._look()
        if self._members is None:
            raise Unavailable("this node sees no majority of the members")
        if not self._membership.heard_of_majority(self._heard_within):
            # Soon the others may count this node down and take its keys over (spent from
            # then on): it stops first, or both would decide them.
            raise Unavailable("this node has not heard from most members lately")
        if self._awaiting:
            raise Unavailable("this node joined moments ago: its keys are on their way to it")

    async def _wait_here(self, op: RateWait) -> Decision:
        self.core.validate(op.limiter, op.n)
        repeated = self.core.repeat(op.limiter, op.key, op.retry_id)
        if repeated is not None:
            return repeated
        key = (op.limiter, op.key)
        queue = self._queues.get(key)
        if not queue:
            decision = self._try(op)
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
                    self._refuse_unless_decided_here(op)  # the members may have changed
                    repeated = self.core.repeat(op.limiter, op.key, op.retry_id)
                    if repeated is not None:
                        return repeated  # it waited behind its first try, which went
                    decision = self._try(op)
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

    def _try(self, op: RateWait) -> Decision:
        """One try of a waiting caller (its outcome is tallied once, at the end)."""
        return self.core.check(
            op.limiter, op.key, op.n, self._clock(), tally=False, retry_id=op.retry_id
        )

    def _hand_over(self) -> None:
        """Keys this node kept that another member decides now go to it."""
        self._send_to_owners(self.core.held_keys(), self._membership.ring)

    def _send_to_owners(self, keys: list[tuple[str, str]], ring: Ring) -> list[str]:
        """The states of the `keys` that `ring` gives another member go to it, and are decided
        here no more; the members they went to."""
        me = self._membership.node_id
        leaving: dict[str, list] = {}
        for key in keys:
            owner = ring.owner(rate_key(*key))
            if owner is not None and owner != me:
                leaving.setdefault(owner, []).append(key)
        for owner, keys in leaving.items():
            self._links.send(owner, self.core.export(keys, drop=True))
        return list(leaving)

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
