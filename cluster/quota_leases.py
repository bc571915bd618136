"""Quota leases, pure: slices of one key's budget, handed to clients that decide from them
locally (a limiter's `lease` mode). `now` comes in, from the owner's clock (which never steps:
node/clock.py's `SteadyWall`); nothing here knows about the network. No instant crosses between
nodes: a grant says how long its slice lasts (`Grant.term`), not until when.

Theory of operation. The key's owner keeps a *pool*, the key's budget as its algorithm counts
it, and the *open slices*: tokens it handed to a holder (a client), to spend until the slice's
end. A holder reports, when it asks for its next slice, how much of each open slice it spent
so far, and closes the slices it will spend no more.

* **Token bucket and GCRA** (capacity or burst C, rate r; GCRA decides as a bucket does, so its
  pool is one). The owner keeps `level + reserved <= C`, where `reserved` is what the open
  slices may still spend: their tokens, less what their holders reported spent. A grant moves
  tokens from the level to a slice; a report that more went moves nothing (what went is gone
  from both); a close gives the unspent part back to the level; a slice that ends unclosed
  gives nothing back (what its holder spent is unknown); the level refills at r only into the
  room `C - reserved` leaves. So the level plus what the slices truly have left never exceeds
  C, grows at most r a second, and loses one for every admission: over any t seconds, at most
  C + r x t go, across every holder, as on one node.
* **Fixed window** (limit per window, aligned on the owner's clock): a slice ends with the
  window it was granted in.
  The window's count takes each grant and gives back what a close left unspent: at most
  `limit` per window.
* **Sliding window and sliding log** are not sliced: their promises are about when each
  admission happened, and a slice tells the owner only how many went, not when.

A holder spends a slice only until its own end, which it counts from when it first *asked*
(the first try, if it asked again), before the owner granted it: earlier than the owner's end,
by the time the answer took, as long as the two clocks run at rates within `CLOCK_RATE_BOUND`.
An ask repeated is answered with the slice's term left from then.

**A new owner** (the old one failed) knows nothing of the slices out: it starts the key spent,
and holds its whole capacity reserved until every slice the old owner could have granted has
ended (`spent`). What a failover costs is the refill of that time, never a token beyond. The
hold counts on the new owner's clock, which never steps, so no step of a wall clock can end
it early.

**Sizing.** Each holder says how many tokens it wants for a term (from what it spent in the
last one). The owner shares the budget (what it could give now plus what the open slices may
still spend, or a term's production if that is more) among the holders with open slices and
the asker, max-min fair: nobody gets more than it wants, and what one does not want goes to
the others. A newcomer's want counts like any other: it gets its share of what is left at
once, and the rest of its share as the others renew, within a term.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import ClassVar, Protocol

from .rate_algorithms import Decision
from .slots import DRIFT_RATIO

# The algorithms a limiter in lease mode may use, and how long a slice lasts unless configured.
LEASE_ALGORITHMS = ("token_bucket", "gcra", "fixed_window")
DEFAULT_TERM = 1.0
# Clocks of a holder and an owner run at rates within this of each other: a holder's end of a
# slice comes before the owner's.
CLOCK_RATE_BOUND = 0.01
# A holder holds at most this many open slices of one key (its current one and the next).
MAX_OPEN_PER_HOLDER = 2
# A limiter has at most this many slices open at a node (about 250 bytes each); past it, an ask
# is a sorry until some end or close (holder ids are the client's to choose, so a client could
# otherwise make the owner keep a slice of one token for each).
MAX_OPEN_SLICES = 100_000
# The holder of the reserve a new owner keeps for the slices its predecessor granted.
PREDECESSOR = -1


@dataclass(frozen=True, slots=True)
class SliceReport:
    """What a holder spent of slice `slice_id` so far; `closed`: and it spends no more of it."""

    slice_id: int
    spent: int
    closed: bool = False


@dataclass(frozen=True, slots=True)
class Grant:
    """`tokens` to spend locally for `term` seconds from when the holder asked (it stops a little
    earlier: `holder_term`); `tokens` 0 is a sorry, to ask again in `retry_after` seconds."""

    slice_id: int
    tokens: int
    term: float
    retry_after: float = 0.0


def holder_term(term: float, rate_bound: float = CLOCK_RATE_BOUND) -> float:
    """How long a holder spends a slice of `term`, counted from when it asked: it ends before the
    owner's end even if its clock runs slower by `rate_bound`."""
    return term * (1.0 - rate_bound) / (1.0 + rate_bound)


class Pool(Protocol):
    """A key's budget at its owner, as its algorithm counts it."""

    def available(self, now: float, reserved: float) -> float:
        """What could be granted now (the open slices may still spend `reserved`)."""
        ...

    def take(self, tokens: int) -> None: ...

    def give_back(self, tokens: int) -> None:
        """A slice was closed, `tokens` unspent, before its end."""
        ...

    def end_of_slice(self, now: float, term: float) -> float: ...

    def production(self, term: float) -> float:
        """What the budget produces over `term` seconds (for sizing slices)."""
        ...

    def wait_for(self, tokens: float, now: float, reserved: float) -> float:
        """Seconds until `tokens` could be granted, if nothing else changes."""
        ...

    def full_at(self) -> float:
        """When the budget is whole again, with no slice open."""
        ...

    def empty(self, now: float) -> int:
        """Spend the whole budget as of `now` (a key taken from an owner that failed); what of
        it slices granted before may still hold, to keep reserved until they end."""
        ...


class BucketPool:
    """A token bucket's budget (GCRA's too): it refills into the room open slices leave."""

    __slots__ = ("capacity", "rate", "level", "stamp")

    def __init__(self, capacity: int, rate: float, level: float, stamp: float) -> None:
        self.capacity = capacity
        self.rate = rate
        self.level = level
        self.stamp = stamp

    def available(self, now: float, reserved: float) -> float:
        if now > self.stamp:
            room = self.capacity - reserved
            if self.level < room:
                self.level = min(room, self.level + (now - self.stamp) * self.rate)
            self.stamp = now
        return self.level

    def take(self, tokens: int) -> None:
        self.level -= tokens

    def give_back(self, tokens: int) -> None:
        self.level += tokens

    def end_of_slice(self, now: float, term: float) -> float:
        return now + term

    def production(self, term: float) -> float:
        return self.rate * term

    def wait_for(self, tokens: float, now: float, reserved: float) -> float:
        if tokens > self.capacity - reserved:
            return math.inf  # not before open slices end
        return max(0.0, (tokens - self.level) / self.rate)

    def full_at(self) -> float:
        return self.stamp + (self.capacity - self.level) / self.rate

    def empty(self, now: float) -> int:
        self.level, self.stamp = 0.0, now
        return self.capacity


class WindowPool:
    """A fixed window's budget: a count per window aligned to multiples of `window` on the
    owner's clock."""

    __slots__ = ("limit", "window", "start", "count")

    def __init__(self, limit: int, window: float, start: float, count: int) -> None:
        self.limit = limit
        self.window = window
        self.start = start
        self.count = count

    def available(self, now: float, reserved: float) -> float:
        if now >= self.start + self.window:
            self.start = math.floor(now / self.window) * self.window
            self.count = 0
        return self.limit - self.count

    def take(self, tokens: int) -> None:
        self.count += tokens

    def give_back(self, tokens: int) -> None:
        self.count -= tokens  # a slice ends with its window: this one's

    def end_of_slice(self, now: float, term: float) -> float:
        return min(now + term, self.start + self.window)

    def production(self, term: float) -> float:
        return self.limit * min(1.0, term / self.window)

    def wait_for(self, tokens: float, now: float, reserved: float) -> float:
        return self.start + self.window - now

    def full_at(self) -> float:
        return self.start + self.window if self.count else self.start

    def empty(self, now: float) -> int:
        self.available(now, 0.0)
        self.count = self.limit
        return 0  # the slices granted before end with their window, which is this one


@dataclass
class _Open:
    holder: int
    tokens: int
    spent: int
    until: float
    # The holder's want when it asked, for sizing the others' slices.
    want: int
    # The ask this slice answered: a repeated ask (its answer lost) gets the same slice.
    ask_id: int | None = None


@dataclass
class LeaseStats:
    """A limiter's slices at this node, for metrics."""

    open: int = 0
    granted: int = 0
    # Grants to a holder that held a slice of the key already.
    renewals: int = 0
    # Tokens: what closes gave back unspent, and what holders reported they spent (the checks
    # they decided themselves).
    returned_unspent: int = 0
    spent_reported: int = 0
    # Slices that ended unclosed (their holder went, or did not ask again in time).
    lost: int = 0


@dataclass(eq=False)
class KeyLeases:
    """One key's pool and open slices, at its owner."""

    pool: Pool
    term: float
    open: dict[int, _Open] = field(default_factory=dict)
    reserved: float = 0.0
    stats: LeaseStats = field(default_factory=LeaseStats)

    def ask(
        self,
        slice_id: int,
        holder: int,
        reports: Iterable[SliceReport],
        want: int,
        now: float,
        ask_id: int | None = None,
    ) -> Grant:
        """A holder's reports, then its ask for a slice of up to `want` tokens; a new slice
        gets `slice_id`. An ask repeated with the same `ask_id` gets the slice it got."""
        self.expire(now)
        for report in reports:
            self._report(holder, report)
        if ask_id is not None:
            for opened_id, opened in self.open.items():
                if opened.holder == holder and opened.ask_id == ask_id:
                    return Grant(opened_id, opened.tokens, opened.until - now)
        available = math.floor(self.pool.available(now, self.reserved))
        held = [o for o in self.open.values() if o.holder == holder]
        if len(held) >= MAX_OPEN_PER_HOLDER:
            retry = min(o.until for o in held) - now
            return Grant(0, 0, 0.0, retry_after=max(retry, 0.0))
        if self.stats.open >= MAX_OPEN_SLICES:
            return Grant(0, 0, 0.0, retry_after=self.term / 2)
        tokens = min(want, available, self._share(holder, want, available))
        if tokens < 1:
            wait = self.pool.wait_for(1.0, now, self.reserved)
            ends = [o.until for o in self.open.values()]
            if math.isinf(wait):
                wait = min(ends) - now if ends else self.term
            return Grant(0, 0, 0.0, retry_after=max(wait, 0.0))
        until = self.pool.end_of_slice(now, self.term)
        self.pool.take(tokens)
        self.reserved += tokens
        self.open[slice_id] = _Open(holder, tokens, 0, until, want, ask_id)
        self.stats.granted += 1
        self.stats.open += 1
        self.stats.renewals += bool(held)
        return Grant(slice_id, tokens, until - now)

    def expire(self, now: float) -> None:
        """Slices whose end passed, unclosed: what their holders had left is gone with them."""
        ended = sorted((o.until, s) for s, o in self.open.items() if o.until <= now)
        for until, slice_id in ended:
            self.pool.available(until, self.reserved)  # the refill under its reserve, until then
            opened = self.open.pop(slice_id)
            self.reserved -= opened.tokens - opened.spent
            if opened.holder != PREDECESSOR:
                self.stats.lost += 1
                self.stats.open -= 1
        self.pool.available(now, self.reserved)
        if not self.open:
            self.reserved = 0.0  # no float dust left behind

    def take_now(self, n: int, now: float) -> Decision:
        """A check decided here (a client that holds no slice, or another API): `n` taken from
        the pool and spent at once, or sorry."""
        self.expire(now)
        available = self.pool.available(now, self.reserved)
        if available >= n:
            self.pool.take(n)
            return Decision(True, math.floor(available - n), 0.0)
        wait = self.pool.wait_for(n, now, self.reserved)
        if math.isinf(wait):
            wait = self.next_end() - now
        return Decision(False, math.floor(available), max(wait, 0.0))

    def idle_at(self) -> float:
        """When the key is as good as new: no slice open, and the pool full again."""
        if self.open:
            return math.inf
        return self.pool.full_at()

    def drop(self) -> None:
        """The key goes from this node (its slot did): its slices are no longer counted here."""
        self.stats.open -= sum(o.holder != PREDECESSOR for o in self.open.values())
        self.open.clear()

    def next_end(self) -> float:
        return min((o.until for o in self.open.values()), default=math.inf)

    def _report(self, holder: int, report: SliceReport) -> None:
        opened = self.open.get(report.slice_id)
        if opened is None or opened.holder != holder:
            return  # ended already, or another owner's (before a failover): nothing to learn
        spent = min(opened.tokens, max(opened.spent, report.spent))
        self.reserved -= spent - opened.spent
        self.stats.spent_reported += spent - opened.spent
        opened.spent = spent
        if report.closed:
            unspent = opened.tokens - spent
            self.reserved -= unspent
            self.pool.give_back(unspent)
            self.stats.returned_unspent += unspent
            self.stats.open -= 1
            del self.open[report.slice_id]

    def _share(self, holder: int, want: int, available: int) -> int:
        """The asker's max-min fair share of what can be given this term."""
        budget = max(available + self.reserved, self.pool.production(self.term))
        wants = {o.holder: o.want for o in self.open.values() if o.holder != PREDECESSOR}
        wants[holder] = want
        left, waiting = budget, sorted(wants.values())
        for number, other in enumerate(waiting):
            fair = left / (len(waiting) - number)
            if other >= fair:
                return max(1, math.floor(fair))
            left -= other
        return want


def predecessor_hold(term: float, rate_bound: float = CLOCK_RATE_BOUND) -> float:
    """How long a new owner holds a key's capacity back, by its clock, from when it took the
    key: the old owner granted its last slice before then, for at most `term` of its clock."""
    return term * (1.0 + rate_bound) / (1.0 - rate_bound)


def spent(
    pool: Pool, term: float, now: float, hold: float, stats: LeaseStats | None = None
) -> KeyLeases:
    """A key taken from an owner that failed: its budget spent as of `now`, and refilling into
    nothing until `hold` seconds on, when every slice the old owner granted has ended."""
    held = pool.empty(now)
    leases = KeyLeases(pool, term, stats=stats or LeaseStats())
    leases.open[PREDECESSOR] = _Open(PREDECESSOR, held, 0, now + hold, 0)
    leases.reserved = float(held)
    return leases


class LeaseAlgorithm:
    """A limiter in lease mode, as the rate limits see its algorithm (`rate_algorithms`): each
    key's state is its `KeyLeases`. A plain check takes from the pool at once. Keys are not
    handed over when their slot changes hands: a new owner starts them spent (`spent`), for a
    resigned slot too, since its holders keep their slices through the change. A new era (the
    whole cluster started cold) starts them whole, as exact mode does."""

    name: ClassVar[str] = "lease"

    def __init__(
        self, algorithm: str, limit: int, rate: float | None, window: float | None, term: float
    ) -> None:
        if algorithm not in LEASE_ALGORITHMS:
            raise ValueError(f"lease mode takes {', '.join(LEASE_ALGORITHMS)}, not {algorithm}")
        self.algorithm = algorithm
        self.limit = limit
        self.rate = rate
        self.window = window
        self.term = term
        self.max_weight = limit
        self.stats = LeaseStats()

    def pool(self, now: float) -> Pool:
        """A whole budget, as of `now`."""
        if self.window is not None:
            return WindowPool(
                self.limit, self.window, math.floor(now / self.window) * self.window, 0
            )
        assert self.rate is not None
        return BucketPool(self.limit, self.rate, float(self.limit), now)

    def new_state(self, now: float) -> KeyLeases:
        return KeyLeases(self.pool(now), self.term, stats=self.stats)

    def spent(self, at: float) -> KeyLeases:
        return spent(self.pool(at), self.term, at, predecessor_hold(self.term), self.stats)

    def check(self, state: KeyLeases, n: int, now: float) -> Decision:
        return state.take_now(n, now)

    def idle_at(self, state: KeyLeases) -> float:
        return state.idle_at()

    def values(self, state: KeyLeases, now: float) -> tuple[float, ...]:
        raise TypeError("lease-mode keys are not handed over")

    def from_values(
        self, values: tuple[float, ...], now: float, ratio: float = DRIFT_RATIO
    ) -> KeyLeases:
        raise TypeError("lease-mode keys are not handed over")

    def merge(self, a: KeyLeases, b: KeyLeases) -> KeyLeases:
        raise TypeError("lease-mode keys are not merged")

    def consume(self, state: KeyLeases, n: int, at: float) -> float:
        raise TypeError("lease-mode keys are decided by their owner alone")
