"""Named rate limiters and the keys this node decides for, pure: `now` comes in.

A check names a limiter and a key (a user, a tenant; "" when the limiter is global) and a weight
n. In `exact` mode the node that acts for the key's slot decides alone (`cluster/ownership.py`),
so nothing is admitted beyond the algorithm's rule. Key states are not written to a quorum (a
round trip per check); instead, when a node gains a slot (`gain_slot`), its keys continue from
what its previous owner handed over as it resigned (`lose_slot` exports it: the states, and
whether the keys without one start spent), or, when nothing came, they **start spent** as of
that moment: the old owner admitted nothing after its lease ended, which was before, and no
copy kept elsewhere could say what it admitted until then (docs/cluster.md, "Rate limits in
exact mode").

`now` is the node's `SteadyWall` (node/clock.py): it never steps, and reads the time of day
as long as that runs without a step. No instant of it crosses between nodes, but for gossip
(below): a hand-over carries each key's state as offsets from its sending
(`Algorithm.values`), and the time since its slot's keys started spent as an age
(`SlotRates.spent_for`); the receiver places them on its clock from the moment the hand-over
arrived, later rather than earlier (`rate_algorithms.received`), however far apart the two
clocks read.

A check (or wait) may carry a `retry_id`, the same on every try of one request: the node that
admitted it remembers the go (`RememberedGoes`), and answers a retry (the client asking again
after a lost connection, or a repeated frame) with it instead of admitting it again. The
remembered goes of a key travel with its state when it is handed over. Only goes are
remembered: a retried sorry had no effect, and may be decided again.

In `gossip` mode the node a client talks to decides at once, from its own admissions plus those
its peers gossip: each "go" becomes a `RateEvent` that goes to every other member, and a node
applies the events it receives to its copy of the key (late and out of order is fine; a
duplicate is recognised by its origin's sequence number and dropped). Gossip is the one place
an instant crosses: a node places another's admissions where they went by its own clock, which
reads the time of day, so clocks s seconds apart move them by s (an event's age at sending
would leave out its time in flight, which a stalled link makes as long as the stall). What
gossip lets through beyond the rule is measured here (`overshoot`).
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass

from .errors import BeyondLimit, InvalidWeight, NotLeased, QuotaFull, UnknownLimiter
from .limits import DEFAULT_LIMITS, Limits
from .quota_leases import (
    DEFAULT_TERM,
    Grant,
    KeyLeases,
    LeaseAlgorithm,
    LeaseStats,
    SliceReport,
    predecessor_hold,
)
from .rate_algorithms import ALGORITHMS, AnyAlgorithm, Decision, received
from .ring import rate_key
from .slots import NO_BALLOT, Ballot, slot_of

MODES = ("exact", "gossip", "lease")
# A go is remembered by its retry id for at least this long (and at most twice): longer than a
# client keeps asking again (`CALL_PATIENCE`, 30 s from its first failure; a check fails within
# `FORWARD_TIMEOUT`, 10 s, of its sending).
REMEMBER_GOES_FOR = 45.0
# Unless a node admits more than half this many requests with a retry id in that time: then
# the older half is forgotten sooner. (About 170 bytes each: 85 MB at most.)
MAX_REMEMBERED_GOES = 500_000
# A resigned slot's hand-over is kept this long by the members that may take the slot next
# (one per slot at most).
HANDOVER_KEPT = 10.0


@dataclass(frozen=True)
class RateLimiterConfig:
    """One `[rate_limits]` entry. `limit` is the capacity of a token bucket, the burst of GCRA,
    and the limit of the windows and the log; `rate` is per second; `window` in seconds."""

    algorithm: str
    limit: int
    rate: float | None = None
    window: float | None = None
    mode: str = "exact"
    # Lease mode: how long a slice lasts.
    term: float = DEFAULT_TERM

    def build(self) -> AnyAlgorithm:
        if self.mode == "lease":
            return LeaseAlgorithm(self.algorithm, self.limit, self.rate, self.window, self.term)
        match self.algorithm:
            case "token_bucket":
                return ALGORITHMS["token_bucket"](self.limit, self.rate)
            case "gcra":
                return ALGORITHMS["gcra"](self.rate, self.limit)
            case _:
                return ALGORITHMS[self.algorithm](self.limit, self.window)


@dataclass(frozen=True, slots=True)
class RateCheck:
    """Go or sorry, now. `retry_id`: the same on every try of one request (see the module)."""

    limiter: str
    key: str
    n: int
    retry_id: int | None = None


@dataclass(frozen=True, slots=True)
class RateChecks:
    """`times` checks of the same `n` of `key`, one after another: what many callers of one
    client asked at once, sent as one request (a list of decisions in order). `retry_ids`, if
    any: one per check."""

    limiter: str
    key: str
    n: int
    times: int
    retry_ids: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class RateWait:
    """Queue for the key (FIFO) until go, or sorry after `timeout` seconds."""

    limiter: str
    key: str
    n: int
    timeout: float
    retry_id: int | None = None


@dataclass(frozen=True, slots=True)
class RateLease:
    """A holder's ask for a slice of `key` (lease mode): what it spent of the slices it holds
    (`reports`), and up to `want` tokens for the next term. `ask_id`: the same on every try."""

    limiter: str
    key: str
    holder: int
    reports: tuple[SliceReport, ...]
    want: int
    ask_id: int


RateOperation = RateCheck | RateChecks | RateWait | RateLease


@dataclass(frozen=True, slots=True)
class RateEvent:
    """A "go" of one node in gossip mode: `n` admitted for `key` of `limiter` at `at`, by the
    clock its node decides on (`node/clock.py`'s `SteadyWall`: the time of day, without its
    steps)."""

    seq: int
    limiter: str
    key: str
    n: int
    at: float


@dataclass(frozen=True, slots=True)
class RateEvents:
    """Gossip: the "go" events of `origin` (in this incarnation) since its last message."""

    origin: str
    incarnation: int
    events: tuple[RateEvent, ...]


@dataclass(frozen=True, slots=True)
class RememberedGo:
    """A go remembered by its request's retry id, which left `remaining`."""

    retry_id: int
    remaining: int


@dataclass(frozen=True, slots=True)
class RateState:
    """One key's state, on its way to its new owner (the algorithm's `values`: its instants as
    offsets from the sending), with the goes remembered for retries."""

    limiter: str
    key: str
    values: tuple[float, ...]
    goes: tuple[RememberedGo, ...] = ()


@dataclass(frozen=True, slots=True)
class RateStates:
    states: tuple[RateState, ...]


@dataclass(frozen=True, slots=True)
class SlotRates:
    """What an owner knew of one slot's exact keys when it sent them: their states, and, for a
    slot it gained spent, how long before the sending every key it holds no state of started
    spent (None: they start new)."""

    states: tuple[RateState, ...] = ()
    spent_for: float | None = None


@dataclass(frozen=True, slots=True)
class RateHandover:
    """A resigning owner's `rates` of `slot`, for the member that takes the slot next from
    `ballot` (the resigned owner's term)."""

    slot: int
    ballot: Ballot
    rates: SlotRates


@dataclass
class LimiterStats:
    go: int = 0
    sorry: int = 0
    # Retries answered with the go their first try got.
    repeated: int = 0
    # Other nodes' go events merged into this node's keys (gossip mode), each once.
    gossiped: int = 0
    # Admissions beyond the rule found when merging gossip (weight units).
    overshoot: float = 0.0
    # How old the newest gossiped event was when it arrived (seconds; clocks of two nodes).
    gossip_lag: float = 0.0


class RateLimits:
    def __init__(
        self,
        configs: Mapping[str, RateLimiterConfig],
        origin: str = "",
        rng: random.Random | None = None,
        limits: Limits = DEFAULT_LIMITS,
    ) -> None:
        self._algorithms = {name: config.build() for name, config in configs.items()}
        self._modes = {name: config.mode for name, config in configs.items()}
        self._states: dict[tuple[str, str], object] = {}
        # Keys in `_states` per limiter: a check of a new key past `limits.rate_limit_keys` is
        # refused (keys handed over or gossiped by other nodes are kept regardless).
        self._key_counts = dict.fromkeys(configs, 0)
        self._limits = limits
        # A key's state is kept while it remembers a go (see `evict`): both are handed over.
        self.goes = RememberedGoes()
        self.origin = origin
        self.incarnation = (rng or random.Random()).getrandbits(63)
        self._seq = 0
        self._outbox: list[RateEvent] = []
        # (origin, incarnation) -> the sequence numbers applied from it.
        self._seen: dict[tuple[str, int], _Seen] = {}
        self.stats = {name: LimiterStats() for name in configs}
        # Exact mode: the slots whose keys start spent, and since when; kept until a key spent
        # then would be as good as new.
        self._spent_since: dict[int, float] = {}
        # Exact mode in a cluster: the slots this node decides the keys of, by the ballot it
        # adopted their state under (`gain_slot` until `lose_slot`).
        self._adopted: dict[int, Ballot] = {}
        # Hand-overs received, by slot, and when (`handed_over`).
        self._handovers: dict[int, tuple[RateHandover, float]] = {}
        self._horizon = max(
            (
                algorithm.idle_at(algorithm.spent(0.0))
                for name, algorithm in self._algorithms.items()
                if self._modes[name] == "exact"
            ),
            default=0.0,
        )
        # Lease mode: the slots this node gained, and when: their keys start spent then, with
        # the capacity held back while the slices of the previous owner may last.
        self._leased_since: dict[int, float] = {}
        configs_leased = [c for c in configs.values() if c.mode == "lease"]
        self._lease_horizon = (
            max(
                (predecessor_hold(c.term) + (c.window or c.limit / (c.rate or 1.0)))
                for c in configs_leased
            )
            if configs_leased
            else 0.0
        )
        self._slice_ids = itertools.count((rng or random.Random()).getrandbits(40) << 20)
        # Where a key of each mode finds since when its slot's keys start spent (gossip mode's
        # never do: every node decides them).
        self._spent_since_by_mode = {"exact": self._spent_since, "lease": self._leased_since}

    @property
    def names(self) -> list[str]:
        return list(self._algorithms)

    def validate(self, limiter: str, n: int) -> AnyAlgorithm:
        """The limiter's algorithm; raises what a check of `n` would raise before deciding
        anything."""
        algorithm = self._algorithms.get(limiter)
        if algorithm is None:
            raise UnknownLimiter(limiter)
        if not 1 <= n <= algorithm.max_weight:
            raise InvalidWeight(n, algorithm.max_weight)
        return algorithm

    def lease_stats(self) -> dict[str, LeaseStats]:
        """The slices of each limiter in lease mode, at this node."""
        return {
            name: algorithm.stats
            for name, algorithm in self._algorithms.items()
            if isinstance(algorithm, LeaseAlgorithm)
        }

    def lease_terms(self) -> dict[str, float]:
        """The term of each limiter in lease mode."""
        return {
            name: algorithm.term
            for name, algorithm in self._algorithms.items()
            if isinstance(algorithm, LeaseAlgorithm)
        }

    def mode(self, limiter: str) -> str:
        if limiter not in self._modes:
            raise UnknownLimiter(limiter)
        return self._modes[limiter]

    def check(
        self,
        limiter: str,
        key: str,
        n: int,
        now: float,
        counted: bool = True,
        retry_id: int | None = None,
    ) -> Decision:
        """Go or sorry for `n` of `key` now; a go is recorded (and, in gossip mode, queued as
        an event for the other members), and remembered by its `retry_id` if it has one; a
        retry of a go gets that go (not tallied again). `counted=False` leaves the go and sorry
        counts alone (a waiting caller's tries: its outcome is counted once, `count_decision`)."""
        algorithm = self._algorithms.get(limiter)
        if algorithm is None or not 1 <= n <= algorithm.max_weight:
            algorithm = self.validate(limiter, n)  # raises what is wrong
        if len(key) > self._limits.key_length:
            raise BeyondLimit("key_length", f"a key of {len(key)} characters")
        which = (limiter, key)
        if retry_id is not None:
            repeated = self.goes.find(which, retry_id)
            if repeated is not None:
                self.stats[limiter].repeated += 1
                return repeated
        state = self._states.get(which)
        if state is None:
            if self._key_counts[limiter] >= self._limits.rate_limit_keys:
                raise QuotaFull(
                    "rate_limit_keys",
                    f"rate limiter {limiter!r} keeps {self._key_counts[limiter]} keys here",
                )
            state = self._state(limiter, algorithm, key, now)
        decision = algorithm.check(state, n, now)
        if decision.go:
            if retry_id is not None:
                self.goes.remember(which, retry_id, decision, now)
            if self._modes[limiter] == "gossip":
                self._seq += 1
                self._outbox.append(RateEvent(self._seq, limiter, key, n, now))
        if counted:
            stats = self.stats[limiter]
            if decision.go:
                stats.go += 1
            else:
                stats.sorry += 1
        return decision

    def ask(self, op: RateLease, now: float) -> Grant:
        """A holder's ask for a slice of a lease-mode key (`cluster/quota_leases.py`)."""
        algorithm = self.validate(op.limiter, 1)
        if self._modes[op.limiter] != "lease":
            raise NotLeased(op.limiter)
        if len(op.key) > self._limits.key_length:
            raise BeyondLimit("key_length", f"a key of {len(op.key)} characters")
        which = (op.limiter, op.key)
        state = self._states.get(which)
        if state is None:
            if self._key_counts[op.limiter] >= self._limits.rate_limit_keys:
                raise QuotaFull(
                    "rate_limit_keys",
                    f"rate limiter {op.limiter!r} keeps {self._key_counts[op.limiter]} keys here",
                )
            state = self._state(op.limiter, algorithm, op.key, now)
        assert isinstance(state, KeyLeases)
        want = min(op.want, algorithm.max_weight)  # 0: reports only
        return state.ask(next(self._slice_ids), op.holder, op.reports, want, now, op.ask_id)

    def earlier_go(self, limiter: str, key: str, retry_id: int | None) -> Decision | None:
        """The go a request of `retry_id` got already, if this node remembers one: the answer
        to its retry, which is not admitted again."""
        if retry_id is None:
            return None
        repeated = self.goes.find((limiter, key), retry_id)
        if repeated is not None:
            self.stats[limiter].repeated += 1
        return repeated

    def count_decision(self, limiter: str, go: bool) -> None:
        stats = self.stats[limiter]
        if go:
            stats.go += 1
        else:
            stats.sorry += 1

    def refuse_behind_waiters(self, limiter: str, n: int, retry_after: float) -> Decision:
        """The answer to a check while callers wait for the key: they go first (FIFO), so the
        check is sorry, to come back when the first of them is due to try again."""
        self.validate(limiter, n)
        self.count_decision(limiter, False)
        return Decision(False, 0, retry_after)

    # -- exact mode: slots changing hands -----------------------------------------------------

    def held_keys(self) -> list[tuple[str, str]]:
        """Every exact-mode key whose state this node keeps."""
        return [key for key in self._states if self._modes[key[0]] == "exact"]

    def _forget_leased(self, slot: int) -> None:
        for key in [k for k in self._states if self._modes[k[0]] == "lease"]:
            if slot_of(rate_key(*key)) == slot:
                leases = self._states[key]
                assert isinstance(leases, KeyLeases)
                leases.drop()
                self._forget(key)

    def lose_slot(
        self, slot: int, ballot: Ballot, resigned: bool, now: float
    ) -> RateHandover | None:
        """This node decides the exact keys of `slot` no more (it acted under `ballot`): what
        it knew of them is dropped here, and handed over if it `resigned` (for every live
        member: the ring names who should take the slot next, but ballots settle who does),
        as of `now`, when it is sent. This node keeps the hand-over too, as a member that may
        take the slot next: one that resigned because it was slow takes it back when it is
        fast again, if the ring names it and nobody wrote the slot in between."""
        self._adopted.pop(slot, None)
        if self._lease_horizon:
            self._forget_leased(slot)
            self._leased_since.pop(slot, None)
        keys = [key for key in self.held_keys() if slot_of(rate_key(*key)) == slot]
        since = self._spent_since.pop(slot, None)
        spent_for = None if since is None else max(0.0, now - since)
        rates = SlotRates(self.export(keys, now, drop=True).states, spent_for)
        if not resigned:
            return None
        handover = RateHandover(slot, ballot, rates)
        self.handed_over(handover, now)
        return handover

    def adopted(self, slot: int) -> Ballot | None:
        """The ballot this node adopted `slot`'s keys under, until it lost the slot: it decides
        them only while it acts for the slot under that same ballot."""
        return self._adopted.get(slot)

    def handed_over(self, handover: RateHandover, now: float) -> None:
        """A resigning owner's hand-over, arrived `now`, kept `HANDOVER_KEPT` in case this node
        takes the slot next (its offsets count from `now`)."""
        known = self._handovers.get(handover.slot)
        if known is None or known[0].ballot < handover.ballot:
            self._handovers[handover.slot] = (handover, now)

    def gain_slot(
        self, slot: int, now: float, ballot: Ballot, previous: Ballot, cold: bool = False
    ) -> None:
        """This node decides the exact keys of `slot` under `ballot` from now on, having
        adopted the state of ballot `previous` (`cold`: of none, a new era): nothing was
        decided before a new era; a hand-over from `previous` says how the keys stand; else
        each starts spent as of `now` (docs/cluster.md, "Rate limits in exact mode")."""
        self._adopted[slot] = ballot
        if self._lease_horizon:
            # Lease-mode keys are never handed over: their holders may spend slices of the
            # previous owner still, unless there was none (a new era).
            self._forget_leased(slot)
            self._leased_since.pop(slot, None)
            if not (cold or previous == NO_BALLOT):
                self._leased_since[slot] = now
        for key in self.held_keys():
            if slot_of(rate_key(*key)) == slot:
                self._forget(key)
        for kept, (_, at) in list(self._handovers.items()):
            if at < now - HANDOVER_KEPT:
                del self._handovers[kept]  # another member took that slot
        handover, arrived = self._handovers.pop(slot, (None, 0.0))
        self._spent_since.pop(slot, None)
        if cold or previous == NO_BALLOT:
            return
        if handover is None or handover.ballot != previous:
            self._spent_since[slot] = now
            return
        rates = handover.rates
        if rates.spent_for is not None:
            # Later, not earlier: the keys stay spent at least as long as at the sender.
            self._spent_since[slot] = arrived + received(-rates.spent_for)
        self.store(rates.states, arrived)

    def export(self, keys: list[tuple[str, str]], now: float, drop: bool = False) -> RateStates:
        """The states of `keys`, to send `now`; `drop` forgets them here."""
        states = []
        for key in keys:
            state = self._states.get(key)
            if state is not None:
                if drop:
                    self._forget(key)
                algorithm = self._algorithms[key[0]]
                goes = self.goes.export(key, drop)
                states.append(RateState(key[0], key[1], algorithm.values(state, now), goes))
        return RateStates(tuple(states))

    def store(self, states: tuple[RateState, ...], arrived: float) -> None:
        """States handed over by another node, arrived at `arrived`, merged into what this node
        knows of each key."""
        for item in states:
            algorithm = self._algorithms.get(item.limiter)
            if algorithm is None or self._modes[item.limiter] != "exact":
                continue  # configured differently there: nothing to merge
            key = (item.limiter, item.key)
            state = algorithm.from_values(item.values, arrived)
            known = self._states.get(key)
            self._keep(key, algorithm.merge(known, state) if known is not None else state)
            self.goes.store(key, item.goes)

    def spent_slots(self) -> int:
        """Slots whose keys start spent, for a while yet."""
        return len(self._spent_since)

    @property
    def events_waiting(self) -> bool:
        """Are there "go" events that `take_events` has not taken?"""
        return bool(self._outbox)

    def take_events(self) -> RateEvents | None:
        """The gossip message of this node's "go" events since the last call, if any."""
        if not self._outbox:
            return None
        events, self._outbox = tuple(self._outbox), []
        return RateEvents(self.origin, self.incarnation, events)

    def receive(self, message: RateEvents, now: float) -> None:
        """Apply another node's "go" events to this node's copies of the keys."""
        seen = self._seen.setdefault((message.origin, message.incarnation), _Seen())
        for event in message.events:
            if not seen.first_time(event.seq):
                continue
            algorithm = self._algorithms.get(event.limiter)
            if algorithm is None or self._modes[event.limiter] != "gossip":
                continue  # configured differently there: nothing to merge
            # A go stamped after its arrival was stamped by a clock ahead of this one: it went
            # by now. At its stamp it would move the key's window (or bucket) on, and with it
            # what this node admitted itself until then.
            at = min(event.at, now)
            state = self._state(event.limiter, algorithm, event.key, at)
            stats = self.stats[event.limiter]
            stats.gossiped += 1
            stats.overshoot += algorithm.consume(state, event.n, at)
            stats.gossip_lag = max(0.0, now - event.at)

    def evict(self, now: float) -> int:
        """Forget goes remembered long enough, and the keys whose state is as good as new (and
        that remember no go); how many keys went."""
        self.goes.age(now)
        idle = [
            key
            for key, state in self._states.items()
            if self._algorithms[key[0]].idle_at(state) <= now and not self.goes.has(key)
        ]
        for key in idle:
            self._forget(key)
        for slot, since in list(self._spent_since.items()):
            if since + self._horizon <= now:
                del self._spent_since[slot]
        for slot, since in list(self._leased_since.items()):
            if since + self._lease_horizon <= now:
                del self._leased_since[slot]
        return len(idle)

    def keys(self) -> int:
        return len(self._states)

    def _state(self, limiter: str, algorithm: AnyAlgorithm, key: str, now: float) -> object:
        state = self._states.get((limiter, key))
        if state is None:
            since = self._spent_since_by_mode.get(self._modes[limiter])
            spent_at = since.get(slot_of(rate_key(limiter, key))) if since else None
            state = algorithm.new_state(now) if spent_at is None else algorithm.spent(spent_at)
            self._keep((limiter, key), state)
        return state

    def _keep(self, key: tuple[str, str], state: object) -> None:
        if key not in self._states:
            self._key_counts[key[0]] += 1
        self._states[key] = state

    def _forget(self, key: tuple[str, str]) -> None:
        if self._states.pop(key, None) is not None:
            self._key_counts[key[0]] -= 1


class RememberedGoes:
    """Goes by the retry id of their request, per key, in two generations: a go is remembered
    from its admission until the generation after its own ends. A generation ends after
    `REMEMBER_GOES_FOR` seconds, or sooner once it holds half of `MAX_REMEMBERED_GOES` (its
    predecessor's goes are then forgotten early, and counted)."""

    __slots__ = ("_now", "_before", "_count", "_since", "forgotten_early")

    def __init__(self) -> None:
        self._now: dict[tuple[str, str], dict[int, Decision]] = {}
        self._before: dict[tuple[str, str], dict[int, Decision]] = {}
        self._count = 0  # in `_now`
        self._since: float | None = None  # when `_now` began
        self.forgotten_early = 0

    def find(self, key: tuple[str, str], retry_id: int) -> Decision | None:
        goes = self._now.get(key)
        if goes is not None and retry_id in goes:
            return goes[retry_id]
        goes = self._before.get(key)
        return None if goes is None else goes.get(retry_id)

    def remember(self, key: tuple[str, str], retry_id: int, decision: Decision, now: float) -> None:
        goes = self._now.get(key)
        if goes is None:
            goes = self._now[key] = {}
        goes[retry_id] = decision
        self._count += 1
        if self._since is None:
            self._since = now
        elif self._count >= MAX_REMEMBERED_GOES // 2:
            self.forgotten_early += sum(len(goes) for goes in self._before.values())
            self._next(now)

    def age(self, now: float) -> None:
        """End the generation if it is old enough."""
        if self._since is None:
            self._since = now
        elif now >= self._since + REMEMBER_GOES_FOR:
            self._next(now)

    def has(self, key: tuple[str, str]) -> bool:
        return key in self._now or key in self._before

    def export(self, key: tuple[str, str], drop: bool) -> tuple[RememberedGo, ...]:
        """The goes of `key`, to hand over with its state; `drop` forgets them here."""
        generations = [self._before.get(key), self._now.get(key)]
        if drop:
            self._before.pop(key, None)
            self._count -= len(self._now.pop(key, {}))
        return tuple(
            RememberedGo(retry_id, decision.remaining)
            for goes in generations
            if goes
            for retry_id, decision in goes.items()
        )

    def store(self, key: tuple[str, str], goes: tuple[RememberedGo, ...]) -> None:
        """Goes handed over with `key`: remembered here from now on (a generation at least)."""
        for go in goes:
            if self.find(key, go.retry_id) is None:
                self._now.setdefault(key, {})[go.retry_id] = Decision(True, go.remaining, 0.0)
                self._count += 1

    def __len__(self) -> int:
        return sum(len(goes) for goes in self._now.values()) + sum(
            len(goes) for goes in self._before.values()
        )

    def _next(self, now: float) -> None:
        self._before, self._now, self._count, self._since = self._now, {}, 0, now


class _Seen:
    """The sequence numbers seen from one origin: all up to `through`, and some beyond."""

    __slots__ = ("through", "beyond")

    # Beyond this many out of order, the gaps below them count as lost, not late.
    MAX_BEYOND = 10_000

    def __init__(self) -> None:
        self.through = 0
        self.beyond: set[int] = set()

    def first_time(self, seq: int) -> bool:
        if seq <= self.through or seq in self.beyond:
            return False
        self.beyond.add(seq)
        while self.through + 1 in self.beyond:
            self.through += 1
            self.beyond.remove(self.through)
        if len(self.beyond) > self.MAX_BEYOND:
            self.through = min(self.beyond)
            self.beyond = {s for s in self.beyond if s > self.through}
        return True


def retry_after_header(seconds: float) -> str:
    """HTTP's Retry-After: whole seconds, rounded up (so that waiting that long is enough)."""
    return str(max(0, math.ceil(seconds)))
