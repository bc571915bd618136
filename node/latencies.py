"""How long this node takes to answer, per HTTP route and per `/ws` operation: two histogram
families on `/metrics` (README, "Metrics").

Every request is observed, so a histogram here is a list of bucket counts and a sum, without the
lock prometheus-client's own `Histogram` takes on each observation (the node is one trio thread);
the collector turns them into Prometheus histograms at scrape time. Labels come from fixed sets
(route templates, methods the route serves, operation names), never from what a client sent.
"""

from __future__ import annotations

from bisect import bisect_left

from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector

# Upper bounds in seconds: a local answer takes well under a millisecond, a forwarded one a
# round trip between nodes, a waiting acquire or rate-limit wait up to its timeout.
BOUNDS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# The label of a path no route serves, and of a method the route does not serve.
OTHER = "other"


class Histogram:
    __slots__ = ("counts", "total")

    def __init__(self) -> None:
        self.counts = [0] * (len(BOUNDS) + 1)
        self.total = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(BOUNDS, seconds)] += 1
        self.total += seconds

    def buckets(self) -> list[tuple[str, int]]:
        """Cumulative counts by upper bound, `+Inf` last, as the exposition format has them."""
        cumulative, running = [], 0
        for bound, count in zip((*map(repr, BOUNDS), "+Inf"), self.counts, strict=True):
            running += count
            cumulative.append((bound, running))
        return cumulative


class Latencies:
    def __init__(self) -> None:
        self.http: dict[tuple[str, str], Histogram] = {}
        self.ws: dict[str, Histogram] = {}

    def http_answered(self, method: str, route: str, seconds: float) -> None:
        key = (method, route)
        histogram = self.http.get(key)
        if histogram is None:
            histogram = self.http[key] = Histogram()
        histogram.observe(seconds)

    def ws_answered(self, op: str, seconds: float) -> None:
        histogram = self.ws.get(op)
        if histogram is None:
            histogram = self.ws[op] = Histogram()
        histogram.observe(seconds)


class LatencyCollector(Collector):
    def __init__(self, latencies: Latencies) -> None:
        self._latencies = latencies

    def collect(self):
        http = HistogramMetricFamily(
            "sluicegate_http_request_duration_seconds",
            "Seconds from a request's arrival to its answer, by method and route template.",
            labels=["method", "route"],
        )
        for (method, route), histogram in sorted(self._latencies.http.items()):
            http.add_metric([method, route], histogram.buckets(), histogram.total)
        yield http
        ws = HistogramMetricFamily(
            "sluicegate_ws_request_duration_seconds",
            "Seconds from the arrival of a /ws frame to the answer of each request in it, by op.",
            labels=["op"],
        )
        for op, histogram in sorted(self._latencies.ws.items()):
            ws.add_metric([op], histogram.buckets(), histogram.total)
        yield ws
