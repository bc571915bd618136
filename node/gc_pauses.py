"""How long the garbage collector holds the node up: `sluicegate_gc_pause_seconds{generation}`
on `/metrics` (README, "Metrics"). A collection stops every task, and a full one (generation 2)
walks every object the collector tracks, so its pause grows with what the node keeps as
objects; the peer table keeps its peers out of the collector's sight for this reason
(cluster/peers.py).

`gc.callbacks` belong to the process, so the pauses are the process's, watched from the node's
command line (`watch`): in-process test nodes share one histogram, and watch nothing.
"""

from __future__ import annotations

import gc
import time

from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector

from .latencies import Histogram


class GcPauses(Collector):
    def __init__(self) -> None:
        self.generations = [Histogram() for _ in range(3)]
        self._started = 0.0

    def watch(self) -> None:
        if self._timed not in gc.callbacks:
            gc.callbacks.append(self._timed)

    def unwatch(self) -> None:
        if self._timed in gc.callbacks:
            gc.callbacks.remove(self._timed)

    def _timed(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.generations[info["generation"]].observe(time.perf_counter() - self._started)

    def collect(self):
        pauses = HistogramMetricFamily(
            "sluicegate_gc_pause_seconds",
            "Seconds the garbage collector held the node up, by generation (2: a full collection).",
            labels=["generation"],
        )
        for generation, histogram in enumerate(self.generations):
            pauses.add_metric([str(generation)], histogram.buckets(), histogram.total)
        yield pauses


GC_PAUSES = GcPauses()
