"""What each node decided of its exact-mode rate limits, where it decided it: for the checker
that judges every decision on the deciding node's own clock (simulations/checkers.py,
`rate_exact_by_node_clocks`), not on a clock the nodes share.

A tap on each life's `RateLimits` (cluster/rate_limits.py) records, without changing what it
does, in trio time (the run's true time):

* every go of an exact-mode key the life decided anew (not the repeat of a remembered go that
  a retry gets): when, which key, how many;
* every hand-over it took a slot's keys from (`store`): when, from whom, and which keys;
* every gossip message it merged (`receive`) that it counted more go events of than it had not
  counted before (an event said twice, or again later, counts once): when, and how many more.

Nothing goes into the history's events, so a run's trace (and its hash) stays as it was.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import trio

from .servers import Life


@dataclass(frozen=True)
class Go:
    at: float
    life: Life
    limiter: str
    key: str
    n: int


@dataclass(frozen=True)
class Taken:
    """`life` took the state of `keys` at `at` from a hand-over by member `sender`."""

    at: float
    life: Life
    sender: str
    keys: frozenset[tuple[str, str]]


@dataclass(frozen=True)
class Recounted:
    """`life` merged a gossip message from `origin` at `at` and counted `extra` go events more
    than it had not counted before."""

    at: float
    life: Life
    origin: str
    extra: int


@dataclass
class RateLog:
    goes: list[Go] = field(default_factory=list)
    taken: list[Taken] = field(default_factory=list)
    recounted: list[Recounted] = field(default_factory=list)
    # When each life began, for the checker's model of its clock.
    began: dict[Life, float] = field(default_factory=dict)

    def tap(self, node_id: str, generation: int, limits) -> None:
        """Record what `limits` (one life's `RateLimits`) decides and takes, from now on."""
        life = (node_id, generation)
        self.began[life] = trio.current_time()
        check, store, gain_slot = limits.check, limits.store, limits.gain_slot
        receive = limits.receive
        # The member whose ballot the slot being gained follows: a hand-over's sender.
        previous = [""]
        # The gossiped go events this life counted: (origin, its life, sequence number).
        counted: set[tuple[str, int, int]] = set()

        def tapped_check(limiter, key, n, now, counted=True, retry_id=None):
            repeat = retry_id is not None and limits.goes.find((limiter, key), retry_id)
            decision = check(limiter, key, n, now, counted, retry_id)
            if decision.go and not repeat and limits.mode(limiter) == "exact":
                self.goes.append(Go(trio.current_time(), life, limiter, key, n))
            return decision

        def tapped_gain_slot(slot, now, ballot, follows, cold=False):
            previous[0] = follows.member
            gain_slot(slot, now, ballot, follows, cold)

        def tapped_store(states, arrived):
            store(states, arrived)
            keys = frozenset((state.limiter, state.key) for state in states)
            self.taken.append(Taken(trio.current_time(), life, previous[0], keys))

        def tapped_receive(message, now):
            fresh = {
                (message.origin, message.incarnation, event.seq)
                for event in message.events
                if event.limiter in limits.stats and limits.mode(event.limiter) == "gossip"
            } - counted
            before = sum(stats.gossiped for stats in limits.stats.values())
            receive(message, now)
            merged = sum(stats.gossiped for stats in limits.stats.values()) - before
            counted.update(fresh)
            if merged > len(fresh):
                extra = merged - len(fresh)
                self.recounted.append(Recounted(trio.current_time(), life, message.origin, extra))

        limits.check, limits.store, limits.gain_slot = tapped_check, tapped_store, tapped_gain_slot
        limits.receive = tapped_receive
