"""Rate-limiting algorithms, pure: state in, decision out, `now` passed in (seconds, on the
deciding node's clock, which never steps: no instant here is compared with another node's).

Each algorithm keeps one small state per key and answers `check(state, n, now)`: go (the state
records the admission) or sorry, with what remains and how long until `n` could go. `consume`
records an admission decided elsewhere (gossip mode: another node's "go", possibly late and out
of order) and returns how much it puts the key beyond the algorithm's rule (the overshoot that
gossip allowed). `idle_at` says when a state is as good as new (its key can be evicted).

`values(state, now)` and `from_values(values, now)` carry a state to another node (a hand-over).
Clocks of two nodes agree on nothing but their rates (within `DRIFT` of real time), so a state
travels without a single timestamp: each instant in it goes as an offset from the moment it is
sent ("admitted 0.31 s ago", "this window ends in 0.42 s"), and the receiver places it on its
own clock from the moment it arrived, always *later* in real time than it was, never earlier
(`received`). Later is the safe side for every algorithm: an admission counts for longer, a
window lasts longer, a bucket starts refilling later, GCRA's bucket is full later. Nothing
refills early, whatever the rates of the two clocks and however long the state was on its way
(the time in flight only makes the offsets of the past too small, which again places them
later).

`spent(at)` is a state whose whole allowance went at `at`: where a key starts when its owner
failed, since whatever the owner admitted until then went with it (docs/rate_limits.md). Before
`at` it admits nothing. `merge(a, b)` is a state at least as spent as either: two accounts of
one key (a hand-over and what a node learnt otherwise) become the stricter one.

* `TokenBucket(capacity, rate)`: over any interval of t seconds, at most capacity + rate x t.
* `FixedWindow(limit, window)`: at most `limit` per window; windows are aligned to multiples of
  `window` on the deciding node's clock. A window handed over ends on the receiver's clock at
  the end of its window that holds the carried end (`received`), so it lasts at least as long
  as it would have at the sender, and at most a window longer.
* `SlidingLog(limit, window)`: any limit + 1 consecutive admissions span more than `window`
  (the sliding log's own guarantee); it keeps at most `limit` timestamps.
* `SlidingWindowCounter(limit, window)`: the previous window's count, weighted by how much of it
  still overlaps the sliding window, plus the current one's: approximate, constant memory.
* `Gcra(rate, burst)`: the generic cell rate algorithm, one timestamp per key; it decides
  exactly as `TokenBucket(burst, rate)` does.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, TypeVar

from .slots import DRIFT_RATIO

# The shortest wait a sorry asks for: "any moment now" (a microsecond).
SOON = 1e-6


def received(offset: float, ratio: float = DRIFT_RATIO) -> float:
    """An instant `offset` seconds after a state was sent (before, if negative), as its receiver
    places it: `offset` seconds after the state arrived, by the receiver's clock, made later.

    Say the sender's clock runs at a (its seconds per real second) and the receiver's at b, with
    b / a and a / b at most `ratio`. An instant o > 0 ahead of the sending is o / a real seconds
    after it; placed o x ratio ahead of the arrival, it is o x ratio / b >= o / a after the
    arrival, which is no earlier than the sending. An instant o < 0 behind the sending is |o| / a
    before it; placed |o| / ratio behind the arrival, it is |o| / (ratio x b) <= |o| / a before
    the arrival, so later again. `ratio` 1: the same clock, as it was."""
    return offset * ratio if offset > 0 else offset / ratio


@dataclass(frozen=True, slots=True)
class Decision:
    go: bool
    # What could still be admitted right after this decision (in units of weight).
    remaining: int
    # Seconds until a request of this weight could go (0 when it went).
    retry_after: float


class _BucketState:
    __slots__ = ("tokens", "stamp")

    def __init__(self, tokens: float, stamp: float) -> None:
        self.tokens = tokens
        self.stamp = stamp


class TokenBucket:
    name = "token_bucket"

    def __init__(self, capacity: int, rate: float) -> None:
        self.capacity = capacity
        self.rate = rate
        self.max_weight = capacity

    def new_state(self, now: float) -> _BucketState:
        return _BucketState(float(self.capacity), now)

    def values(self, state: _BucketState, now: float) -> tuple[float, ...]:
        # The level as of sending, and when it starts to refill (now, unless a spent state's
        # stamp is still ahead).
        return (float(self._tokens_at(state, now)), float(max(0.0, state.stamp - now)))

    def from_values(
        self, values: tuple[float, ...], now: float, ratio: float = DRIFT_RATIO
    ) -> _BucketState:
        return _BucketState(values[0], now + received(values[1], ratio))

    def spent(self, at: float) -> _BucketState:
        return _BucketState(0.0, at)

    def merge(self, a: _BucketState, b: _BucketState) -> _BucketState:
        stamp = max(a.stamp, b.stamp)
        return _BucketState(min(self._tokens_at(a, stamp), self._tokens_at(b, stamp)), stamp)

    def _tokens_at(self, state: _BucketState, at: float) -> float:
        return min(self.capacity, state.tokens + max(0.0, at - state.stamp) * self.rate)

    def _refill(self, state: _BucketState, now: float) -> None:
        if now > state.stamp:
            state.tokens = self._tokens_at(state, now)
            state.stamp = now

    def check(self, state: _BucketState, n: int, now: float) -> Decision:
        self._refill(state, now)
        if state.tokens >= n:
            state.tokens -= n
            return Decision(True, math.floor(state.tokens), 0.0)
        # A spent state stamped later than now refills from its stamp only.
        wait = max(0.0, state.stamp - now) + (n - state.tokens) / self.rate
        return Decision(False, max(0, math.floor(state.tokens)), wait)

    def consume(self, state: _BucketState, n: int, at: float) -> float:
        self._refill(state, at)
        debt = max(0.0, -state.tokens)
        state.tokens -= n  # may go below zero: a debt the refill pays back
        return max(0.0, -state.tokens) - debt

    def idle_at(self, state: _BucketState) -> float:
        return state.stamp + (self.capacity - state.tokens) / self.rate


class _WindowState:
    __slots__ = ("start", "count", "previous")

    def __init__(self, start: float) -> None:
        self.start = start
        self.count = 0
        self.previous = 0


class _Windows:
    """What both window algorithms share: windows aligned to multiples of `window` on the
    deciding node's clock, and a state of (start, count, previous count)."""

    def __init__(self, limit: int, window: float) -> None:
        self.limit = limit
        self.window = window
        self.max_weight = limit

    def _start_of(self, at: float) -> float:
        return math.floor(at / self.window) * self.window

    def new_state(self, now: float) -> _WindowState:
        return _WindowState(self._start_of(now))

    def values(self, state: _WindowState, now: float) -> tuple[float, ...]:
        # The window goes as when it ends: its start means nothing on another clock.
        end = state.start + self.window - now
        return (float(end), float(state.count), float(state.previous))

    def from_values(
        self, values: tuple[float, ...], now: float, ratio: float = DRIFT_RATIO
    ) -> _WindowState:
        end = now + received(values[0], ratio)
        if ratio == 1.0:
            state = _WindowState(end - self.window)  # the same clock: the same window
        else:
            # The window of this clock's that holds the carried end takes the carried counts:
            # the window lasts at least until its end at the sender, and no window here is
            # shorter than `window`.
            state = _WindowState(self._start_of(end))
        state.count, state.previous = int(values[1]), int(values[2])
        return state

    def spent(self, at: float) -> _WindowState:
        state = _WindowState(self._start_of(at))
        state.count = self.limit
        return state

    def merge(self, a: _WindowState, b: _WindowState) -> _WindowState:
        later, earlier = (a, b) if a.start >= b.start else (b, a)
        state = _WindowState(later.start)
        if later.start == earlier.start:
            state.count = max(a.count, b.count)
            state.previous = max(a.previous, b.previous)
        else:
            state.count = later.count
            just_before = later.start - earlier.start < 1.5 * self.window
            state.previous = max(later.previous, earlier.count if just_before else 0)
        return state


class FixedWindow(_Windows):
    name = "fixed_window"

    def _roll(self, state: _WindowState, now: float) -> None:
        start = self._start_of(now)
        if start > state.start:
            state.start, state.count = start, 0

    def check(self, state: _WindowState, n: int, now: float) -> Decision:
        self._roll(state, now)
        if state.count + n <= self.limit:
            state.count += n
            return Decision(True, self.limit - state.count, 0.0)
        return Decision(False, max(0, self.limit - state.count), state.start + self.window - now)

    def consume(self, state: _WindowState, n: int, at: float) -> float:
        self._roll(state, at)
        if self._start_of(at) != state.start:
            return 0.0  # a "go" of a window already over counts no more
        over = max(0, state.count - self.limit)
        state.count += n
        return max(0, state.count - self.limit) - over

    def idle_at(self, state: _WindowState) -> float:
        return state.start + self.window


class _LogState:
    __slots__ = ("times",)

    def __init__(self) -> None:
        self.times: list[float] = []  # ascending, at most `limit`


class SlidingLog:
    name = "sliding_log"

    def __init__(self, limit: int, window: float) -> None:
        self.limit = limit
        self.window = window
        self.max_weight = limit

    def new_state(self, now: float) -> _LogState:
        return _LogState()

    def values(self, state: _LogState, now: float) -> tuple[float, ...]:
        return tuple(float(at - now) for at in state.times)

    def from_values(
        self, values: tuple[float, ...], now: float, ratio: float = DRIFT_RATIO
    ) -> _LogState:
        state = _LogState()
        state.times = sorted(now + received(ago, ratio) for ago in values)[-self.limit :]
        return state

    def spent(self, at: float) -> _LogState:
        state = _LogState()
        state.times = [at] * self.limit
        return state

    def merge(self, a: _LogState, b: _LogState) -> _LogState:
        # The k-th latest admission of the result is the later of the two k-th latest ones.
        longer, shorter = (a.times, b.times) if len(a.times) >= len(b.times) else (b.times, a.times)
        offset = len(longer) - len(shorter)
        state = _LogState()
        latest = [max(x, y) for x, y in zip(longer[offset:], shorter, strict=True)]
        state.times = longer[:offset] + latest
        return state

    def _live(self, state: _LogState, now: float) -> int:
        """Drop the admissions that can no longer matter (more than `window` ago); how many are
        left. One exactly `window` ago still counts: k + 1 must span *more* than the window."""
        times = state.times
        dead = bisect.bisect_left(times, now - self.window)
        if dead:
            del times[:dead]
        return len(times)

    def check(self, state: _LogState, n: int, now: float) -> Decision:
        live = self._live(state, now)
        if live + n <= self.limit:
            state.times.extend([now] * n)
            return Decision(True, self.limit - live - n, 0.0)
        # The oldest admissions must leave the window first: the (live + n - limit)-th of them.
        oldest_to_leave = state.times[live + n - self.limit - 1]
        wait = max(SOON, oldest_to_leave + self.window - now)  # it must be *more* than a window
        return Decision(False, max(0, self.limit - live), wait)

    def consume(self, state: _LogState, n: int, at: float) -> float:
        times = state.times
        position = bisect.bisect_right(times, at)
        times[position:position] = [at] * n
        # Overshoot shows as more than `limit` admissions in a window that holds this one (the
        # fullest such window starts at one of the admissions at most a window before it).
        fullest = max(
            bisect.bisect_right(times, times[i] + self.window) - i
            for i in range(bisect.bisect_left(times, at - self.window), position + 1)
        )
        revealed = min(n, max(0, fullest - self.limit))
        if len(times) > self.limit:
            del times[: len(times) - self.limit]
        return float(revealed)

    def idle_at(self, state: _LogState) -> float:
        return state.times[-1] + self.window if state.times else -math.inf


class SlidingWindowCounter(_Windows):
    name = "sliding_window"

    def _roll(self, state: _WindowState, now: float) -> None:
        start = self._start_of(now)
        if start > state.start:
            # The window just over becomes the previous one (none if more than one passed).
            state.previous = state.count if start - state.start < 1.5 * self.window else 0
            state.start, state.count = start, 0

    def _estimate(self, state: _WindowState, now: float) -> float:
        overlap = 1.0 - (now - state.start) / self.window
        return state.previous * overlap + state.count

    def check(self, state: _WindowState, n: int, now: float) -> Decision:
        self._roll(state, now)
        estimate = self._estimate(state, now)
        if estimate + n <= self.limit:
            state.count += n
            return Decision(True, math.floor(self.limit - estimate - n), 0.0)
        wait = max(SOON, self._wait(state, n, now))
        return Decision(False, max(0, math.floor(self.limit - estimate)), wait)

    def _wait(self, state: _WindowState, n: int, now: float) -> float:
        """Until the weighted previous window has shrunk enough, in this window or the next."""
        end = state.start + self.window
        if state.count + n <= self.limit and state.previous > 0:
            # previous x (1 - (t - start) / window) <= limit - count - n
            at = state.start + self.window * (1.0 - (self.limit - state.count - n) / state.previous)
            return max(0.0, at - now)
        # Next window: count becomes the previous one.
        if state.count > 0:
            at = end + self.window * max(0.0, 1.0 - (self.limit - n) / state.count)
            return max(0.0, at - now)
        return max(0.0, end - now)

    def consume(self, state: _WindowState, n: int, at: float) -> float:
        self._roll(state, at)
        start = self._start_of(at)
        if start == state.start:
            over = max(0.0, self._estimate(state, at) - self.limit)
            state.count += n
            return max(0.0, self._estimate(state, at) - self.limit) - over
        if start == state.start - self.window:
            state.previous += n  # late, but it still weighs on the current window
        return 0.0

    def idle_at(self, state: _WindowState) -> float:
        return state.start + 2 * self.window


class _GcraState:
    __slots__ = ("tat",)

    def __init__(self, tat: float) -> None:
        self.tat = tat  # the theoretical arrival time: when the bucket would be full again


class Gcra:
    name = "gcra"

    def __init__(self, rate: float, burst: int) -> None:
        self.rate = rate
        self.burst = burst
        self.max_weight = burst
        self._interval = 1.0 / rate
        self._tolerance = burst / rate

    def new_state(self, now: float) -> _GcraState:
        return _GcraState(now)

    def values(self, state: _GcraState, now: float) -> tuple[float, ...]:
        return (float(state.tat - now),)

    def from_values(
        self, values: tuple[float, ...], now: float, ratio: float = DRIFT_RATIO
    ) -> _GcraState:
        return _GcraState(now + received(values[0], ratio))

    def spent(self, at: float) -> _GcraState:
        return _GcraState(at + self._tolerance)

    def merge(self, a: _GcraState, b: _GcraState) -> _GcraState:
        return _GcraState(max(a.tat, b.tat))

    def check(self, state: _GcraState, n: int, now: float) -> Decision:
        tat = max(state.tat, now) + n / self.rate
        allowed_at = tat - self._tolerance
        if now >= allowed_at:
            state.tat = tat
            return Decision(True, math.floor((now - allowed_at) * self.rate), 0.0)
        left = (now - (max(state.tat, now) - self._tolerance)) * self.rate
        return Decision(False, max(0, math.floor(left)), allowed_at - now)

    def consume(self, state: _GcraState, n: int, at: float) -> float:
        over = max(0.0, (state.tat - at) * self.rate - self.burst)
        state.tat = max(state.tat, at) + n / self.rate
        return max(0.0, (state.tat - at) * self.rate - self.burst) - over

    def idle_at(self, state: _GcraState) -> float:
        return state.tat


S = TypeVar("S")


class Algorithm(Protocol[S]):
    """What a limiter asks of its algorithm, over the algorithm's own state `S` per key."""

    name: ClassVar[str]
    max_weight: int

    def new_state(self, now: float) -> S: ...
    def spent(self, at: float) -> S: ...
    def values(self, state: S, now: float) -> tuple[float, ...]: ...
    def from_values(self, values: tuple[float, ...], now: float, ratio: float = ...) -> S: ...
    def merge(self, a: S, b: S) -> S: ...
    def check(self, state: S, n: int, now: float) -> Decision: ...
    def consume(self, state: S, n: int, at: float) -> float: ...
    def idle_at(self, state: S) -> float: ...


# A limiter keeps its keys' states without knowing their type: each goes back to its algorithm.
AnyAlgorithm = Algorithm[Any]
ALGORITHMS: dict[str, type] = {
    cls.name: cls for cls in (TokenBucket, FixedWindow, SlidingLog, SlidingWindowCounter, Gcra)
}
