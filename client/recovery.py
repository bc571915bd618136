"""What the client does when a call fails, without any I/O: restore, wait and retry, move to
the next node, or give up. `now` comes in; the waits come out; `client/client.py` does them.

* A node that forgot the peer (`UnknownPeer`) gets it restored once, then the call is retried.
* A broken connection or an unavailable cluster is retried after a wait that doubles from
  `BACKOFF_FIRST` to `BACKOFF_MAX`, jittered (0.5 to 1.5 times) so that many clients do not
  come back in step, until `patience` seconds after the first try; then `Unavailable`.
* A node that answers `unavailable` for `MOVE_AFTER` seconds is left for the next node: it may be
  cut off from the others (who serve), or not act for the slot the call needs yet. A node that
  reaches a quorum says so: its 503 carries `retry_here_for`, the longest a lost slot takes to
  get a new owner, and the call stays that long. Leaving it for a node of a minority, and then
  passing it over for `AVOID_FOR`, could outlast a lease the call is renewing.
* Connecting tries the node URLs in turn, staying with one that works, and passing over those
  left in the last `AVOID_FOR` seconds while others are not; after a whole round with none
  answering it waits (the same backoff), and gives up at the same deadline.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from .session import Unavailable, UnknownPeer

BACKOFF_FIRST = 0.05
BACKOFF_MAX = 1.0
# How long a call keeps trying before it gives up with `Unavailable`.
CALL_PATIENCE = 30.0
# How long a call keeps asking a node that answers `unavailable` before it tries the next one.
MOVE_AFTER = 0.5
# A node left (it stalled, or answered `unavailable`) is passed over this long, if others are
# not.
AVOID_FOR = 3.0


class ConnectionLost(Exception):
    """The connection broke before the answer came; the request may or may not have run."""


@dataclass(frozen=True)
class Retry:
    """Try the call again after `wait` seconds (`elsewhere`: on the next node)."""

    wait: float
    elsewhere: bool = False


@dataclass(frozen=True)
class RestorePeer:
    """Restore the call's peer (exactly its held locks), then try the call again."""


@dataclass(frozen=True)
class GiveUp:
    error: Exception


Decision = Retry | RestorePeer | GiveUp


class Backoff:
    """Jittered waits, doubling from `first` up to `most`."""

    def __init__(
        self, rng: random.Random, first: float = BACKOFF_FIRST, most: float = BACKOFF_MAX
    ) -> None:
        self._rng = rng
        self._next = first
        self._most = most

    def wait(self) -> float:
        wait = self._next * (0.5 + self._rng.random())
        self._next = min(self._next * 2, self._most)
        return wait


class CallRecovery:
    """The decisions of one call, from its first failure on."""

    def __init__(
        self,
        now: float,
        rng: random.Random,
        *,
        has_peer: bool,
        patience: float = CALL_PATIENCE,
    ) -> None:
        self._give_up_at = now + patience
        self._backoff = Backoff(rng)
        self._can_restore = has_peer
        self._unavailable_since: float | None = None
        # Where the `unavailable` answers counted since then came from.
        self._unavailable_from: object = None

    @property
    def give_up_at(self) -> float:
        return self._give_up_at

    def after(self, failure: Exception, now: float, node: object = None) -> Decision:
        """`node`: whom the failed try asked (the client passes its connection); `unavailable`
        answers count towards `MOVE_AFTER` only while they come from the same one."""
        if isinstance(failure, UnknownPeer):
            if not self._can_restore:
                return GiveUp(failure)
            self._can_restore = False  # once: a node that forgets it again has a reason
            return RestorePeer()
        if not isinstance(failure, ConnectionLost | Unavailable):
            return GiveUp(failure)
        if now >= self._give_up_at:
            return GiveUp(Unavailable(f"no node could serve the request: {failure}"))
        if not isinstance(failure, Unavailable):
            self._unavailable_since = None  # a new connection: maybe to another node
        elif self._unavailable_since is None or node is not self._unavailable_from:
            self._unavailable_since = now
            self._unavailable_from = node
        elif now >= self._unavailable_since + max(MOVE_AFTER, failure.retry_here_for):
            self._unavailable_since = None
            return Retry(self._backoff.wait(), elsewhere=True)
        return Retry(self._backoff.wait())


class NodeChoice:
    """Which node URL to connect to: the one that worked last, else the next in turn that was
    not left lately."""

    def __init__(self, urls: list[str], rng: random.Random) -> None:
        if not urls:
            raise ValueError("at least one node URL")
        self._urls = urls
        self._rng = rng
        self._current = 0
        self._failed_in_round = 0
        self._backoff = Backoff(rng)
        # URL index -> when it was last left.
        self._left: dict[int, float] = {}

    @property
    def url(self) -> str:
        return self._urls[self._current]

    def skip(self, now: float) -> None:
        """Leave the current node for the next one (it works, but cannot serve now)."""
        self._left[self._current] = now
        count = len(self._urls)
        for step in range(1, count + 1):
            candidate = (self._current + step) % count
            if now >= self._left.get(candidate, -AVOID_FOR) + AVOID_FOR:
                self._current = candidate
                return
        self._current = (self._current + 1) % count

    def connected(self) -> None:
        self._failed_in_round = 0
        self._backoff = Backoff(self._rng)

    def failed(self, now: float, give_up_at: float) -> Retry | GiveUp:
        """`url` did not answer: the next one, at once or (after a whole round) after a wait."""
        self.skip(now)
        self._failed_in_round += 1
        if self._failed_in_round < len(self._urls):
            return Retry(0.0)
        self._failed_in_round = 0
        if now >= give_up_at:
            return GiveUp(Unavailable(f"no node answers at {', '.join(self._urls)}"))
        return Retry(self._backoff.wait())
