"""The checkers' own model of the clock each node life decides its rate limits on, from what
the run knows and the node does not: the true time (trio's), and the node's time of day with
every step it took (simulations/clocks.py's `TimeOfDay`).

A node decides on the time of day without its steps (node/clock.py's `SteadyWall`): from the
life's start it reads the time of day, and across a step it goes on at its monotonic clock's
rate instead. So a life that began at b reads, at true time t, the time of day it read at b
plus t − b: `TRUE_EPOCH + t + offset at b`, give or take what each step let through (a slew of
at most 4% of the 0.25 s between two readings, 10 ms, and the monotonic clock's drift over
them, 5 ms): `TOLERANCE` per step the node's time of day took in the life. The model is the
checkers', not the node's: a node that decided on the time of day with its steps, or placed a
hand-over by another node's clock, decides off it.

Without times of day of their own (a run without `wall`), every node reads trio time itself.
"""

from __future__ import annotations

import bisect
import math

from .clocks import TRUE_EPOCH, TimeOfDay
from .rate_taps import RateLog
from .servers import Life

# What a step may move a life's clock off the model (see above), and rounding.
TOLERANCE = 0.016


class NodeClocks:
    def __init__(self, deciders: RateLog, times_of_day: dict[str, TimeOfDay]) -> None:
        self._times = times_of_day
        self._began = deciders.began
        self._lives: dict[str, list[tuple[float, Life]]] = {}
        for life, began in sorted(deciders.began.items(), key=lambda item: item[1]):
            self._lives.setdefault(life[0], []).append((began, life))

    def life_at(self, node_id: str, at: float) -> Life | None:
        """The life of `node_id` begun last at or before `at`."""
        lives = self._lives.get(node_id, [])
        index = bisect.bisect_right(lives, at, key=lambda item: item[0])
        return lives[index - 1][1] if index else None

    def reading(self, life: Life, at: float) -> float:
        """What `life`'s clock read at true time `at`, by the model."""
        time_of_day = self._times.get(life[0])
        if time_of_day is None:
            return at
        return TRUE_EPOCH + at + time_of_day.offset_at(self._began[life])

    def tolerance(self, life: Life, until: float) -> float:
        """How far `life`'s clock may be off the model by true time `until`."""
        time_of_day = self._times.get(life[0])
        if time_of_day is None:
            return 0.0
        began = self._began[life]
        steps = sum(1 for when, _ in time_of_day.steps if began < when <= until)
        return TOLERANCE * (1 + steps)

    def window(self, life: Life, at: float, length: float) -> int | None:
        """Which window of `length` on `life`'s clock true time `at` certainly falls in (None:
        within the tolerance of an edge)."""
        reading, off = self.reading(life, at), self.tolerance(life, at)
        index = math.floor((reading - off) / length)
        return index if math.floor((reading + off) / length) == index else None

    def window_end(self, life: Life, index: int, length: float) -> float:
        """The earliest true time the window `index` of `life`'s clock may end at."""
        end = (index + 1) * length - self.reading(life, 0.0)
        return end - self.tolerance(life, end)
