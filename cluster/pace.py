"""Whether this node's lease rounds reach a quorum too slowly for it to act for slots
(docs/cluster.md, "A slow member acts for no slot").

A takeover is two round trips from the member the ring names to a quorum (a prepare and a
write), and the takeover bound keeps half a lease for them. A member whose quorum round trips
take more than a quarter lease says so in its renewals, and the rings leave it out until its
rounds are fast again. Rounds that reach a quorum in a burst are a backlog delivered at once
(a clog released, a pause ended), not a slow path: they do not count towards slow.

Pure: the times come in.
"""

from __future__ import annotations

import math

# Rounds in a row on the other side of the threshold that change the verdict.
ROUNDS_IN_A_ROW = 2


class Pace:
    """The verdict on this node's quorum round trips, from its lease rounds."""

    def __init__(self, lease: float) -> None:
        self.slow = False
        self._slow_over = lease / 4
        self._fast_under = lease / 8
        self._last_round_at = -math.inf
        self._streak = 0

    def round_trip(self, sent: float, now: float) -> bool:
        """A lease round sent at `sent` was answered by a quorum at `now`: did `slow`
        change?"""
        took = now - sent
        spaced = now - self._last_round_at >= self._fast_under
        self._last_round_at = now
        if self.slow:
            against = took < self._fast_under
        else:
            against = took > self._slow_over and spaced
        self._streak = self._streak + 1 if against else 0
        if self._streak < ROUNDS_IN_A_ROW:
            return False
        self.slow, self._streak = not self.slow, 0
        return True
