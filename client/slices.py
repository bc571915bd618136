"""A client's slices of lease-mode keys, sans-IO (docs/rate_limits.md, "Lease mode"): what a
check spends, when to ask for the next slice and for how much, and what to report when asking.
`now` comes in; `client.py` sends the asks.

A key has at most one slice in use (`current`). When a new one comes, the current one is done
with: nothing more is spent from it, and the next ask reports it closed, with what it spent, so
the owner takes back the rest at once. A slice is spent only until `ends`, counted from when
its ask was first sent (`holder_term`): before the owner's own end.

The want (tokens for a term) follows demand: the rate the current slice was spent at, over a
term, with half as much again for headroom, at least the check that could not be served, and at
most twice the slice before (so one burst does not ask for the whole budget).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from sluicegate.cluster.quota_leases import holder_term

# A new slice is asked for once the current one is half spent or half over.
RENEW_AT = 0.5
# What a key's first ask wants, before any demand is known.
FIRST_WANT = 16
HEADROOM = 1.5


@dataclass
class _Slice:
    slice_id: int
    tokens: int
    term: float
    ends: float
    got_at: float
    spent: int = 0


@dataclass
class Ask:
    """An ask being made: its reports ([slice, spent, closed]), its want, and when it was first
    sent (the term of what it gets counts from then)."""

    reports: list[list]
    want: int
    sent_at: float
    closing: list[_Slice] = field(default_factory=list)


class KeySlices:
    def __init__(self) -> None:
        self.current: _Slice | None = None
        # Slices done with, to report closed.
        self._closing: list[_Slice] = []
        self.asking: Ask | None = None
        # After a sorry from the owner: no ask (and every check sorry) until then.
        self.not_before = -math.inf
        self._want = FIRST_WANT
        # The current slice is due for renewal once it has this much left, or at this time.
        self.renew_left = 0
        self.renew_at = -math.inf

    def spend(self, n: int, now: float) -> int | None:
        """Take `n` from the current slice: what it has left then, or None if it cannot."""
        current = self.current
        if current is not None and now < current.ends and current.tokens - current.spent >= n:
            current.spent += n
            return current.tokens - current.spent
        return None

    def due(self, now: float) -> bool:
        """Is it time to ask for the next slice (and no ask is on its way)?"""
        if self.asking is not None or now < self.not_before:
            return False
        current = self.current
        return (
            current is None
            or now >= self.renew_at
            or current.tokens - current.spent <= self.renew_left
        )

    def ask(self, now: float, n: int = 1) -> Ask:
        """Start an ask, sent now: what it reports and wants."""
        current = self.current
        if current is not None and now >= current.ends:
            self._closing.append(current)  # over by this client's clock: spent as it went
            self.current = current = None
        closing = list(self._closing)
        reports = [[s.slice_id, s.spent, True] for s in closing]
        if current is not None:
            reports.append([current.slice_id, current.spent, False])
        self.asking = Ask(reports, self._next_want(now, n), now, closing)
        return self.asking

    def granted(
        self, slice_id: int, tokens: int, term: float, retry_after: float, now: float
    ) -> None:
        """The owner's answer to the ask on its way (`tokens` 0: a sorry)."""
        ask = self.asking
        assert ask is not None
        self.asking = None
        self._closing = [s for s in self._closing if s not in ask.closing]
        if tokens == 0:
            self.not_before = now + retry_after
            return
        if self.current is not None:
            self._closing.append(self.current)
        ends = ask.sent_at + holder_term(term)
        self.current = _Slice(slice_id, tokens, term, ends, now)
        self._want = ask.want
        self.renew_left = tokens - math.ceil(tokens * RENEW_AT)
        self.renew_at = now + (ends - now) * RENEW_AT

    def failed(self) -> None:
        """The ask got no answer: what it reported is reported again next time."""
        self.asking = None

    def idle(self, now: float) -> bool:
        """Nothing held or to report: the key's state can go."""
        current = self.current
        return (
            self.asking is None and not self._closing and (current is None or now >= current.ends)
        )

    def closing_reports(self, now: float) -> list[list]:
        """Every slice closed, for a client that goes: what each spent."""
        slices = list(self._closing) + ([self.current] if self.current is not None else [])
        return [[s.slice_id, s.spent, True] for s in slices]

    def _next_want(self, now: float, n: int) -> int:
        current = self.current
        if current is None:
            return max(n, self._want)
        elapsed = max(now - current.got_at, 1e-3)
        wanted = math.ceil(current.spent / elapsed * current.term * HEADROOM)
        return max(n, 1, min(wanted, 2 * current.tokens + n))
