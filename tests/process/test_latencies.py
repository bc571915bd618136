"""Latency histograms: bucket arithmetic, and the families a real node serves on `/metrics` per
HTTP route and per `/ws` op, and its garbage collector's pauses (none on a node configured as
Throttle would be)."""

from __future__ import annotations

import gc
import re
import urllib.request

import msgpack
import pytest
import trio
from trio_websocket import open_websocket_url

from sluicegate.node.gc_pauses import GcPauses
from sluicegate.node.latencies import BOUNDS, Histogram, Latencies, LatencyCollector
from tests.nodes import NodeProcess

WITH_RATE_LIMITS = """
[semaphores]
A = 2

[rate_limits]
api = { algorithm = "fixed_window", limit = 100, window = "1s" }
"""
THROTTLE_ONLY = "[semaphores]\nA = 2\n"


def test_a_value_on_a_bound_counts_in_that_bucket_and_buckets_are_cumulative():
    histogram = Histogram()
    for seconds in (0.0001, BOUNDS[0], 0.003, 0.003, 99.0):
        histogram.observe(seconds)
    buckets = dict(histogram.buckets())
    assert buckets["0.0005"] == 2
    assert buckets["0.0025"] == 2
    assert buckets["0.005"] == 4
    assert buckets[repr(BOUNDS[-1])] == 4
    assert buckets["+Inf"] == 5
    assert histogram.total == pytest.approx(0.0001 + BOUNDS[0] + 0.006 + 99.0)


def test_the_collector_names_each_route_and_op_it_saw():
    latencies = Latencies()
    latencies.http_answered("PUT", "/peers/{id}/{semaphore}", 0.002)
    latencies.ws_answered("acquire", 0.0003)
    families = {family.name: family for family in LatencyCollector(latencies).collect()}
    http = families["sluicegate_http_request_duration_seconds"]
    assert {
        (sample.name, sample.labels.get("route"), sample.value)
        for sample in http.samples
        if sample.name.endswith("_count")
    } == {("sluicegate_http_request_duration_seconds_count", "/peers/{id}/{semaphore}", 1)}
    ws = families["sluicegate_ws_request_duration_seconds"]
    assert [s.value for s in ws.samples if s.name.endswith("_count")] == [1]


def test_every_collection_is_timed_by_its_generation():
    pauses = GcPauses()
    pauses.watch()
    pauses.watch()  # once only
    try:
        gc.collect()
    finally:
        pauses.unwatch()
    gc.collect()
    full = [family for family in pauses.collect()][0]
    counts = {s.labels["generation"]: s.value for s in full.samples if s.name.endswith("_count")}
    assert set(counts) == {"0", "1", "2"} and counts["2"] == 1
    assert pauses.generations[2].total > 0


def metrics(node: NodeProcess) -> str:
    with urllib.request.urlopen(f"{node.url}/metrics", timeout=5) as response:
        return response.read().decode()


def count(text: str, family: str, **labels: str) -> float:
    """The `_count` sample of a histogram with exactly these labels (0 if absent)."""
    wanted = ",".join(f'{key}="{value}"' for key, value in sorted(labels.items()))
    for match in re.finditer(rf"^{family}_count\{{(.*)\}} (\S+)$", text, re.MULTILINE):
        if ",".join(sorted(match.group(1).split(","))) == wanted:
            return float(match.group(2))
    return 0.0


@pytest.mark.process
async def test_a_node_times_every_route_and_ws_op_with_fixed_labels(tmp_path):
    with NodeProcess(WITH_RATE_LIMITS, workdir=tmp_path) as node:
        for path in ("/health", "/peers/1/A?x", "/no/such/route"):
            try:
                urllib.request.urlopen(f"{node.url}{path}", timeout=5).close()
            except urllib.error.HTTPError:
                pass
        body = b'{"expires_in": "60s"}'
        request = urllib.request.Request(f"{node.url}/new_peer", data=body, method="POST")
        request.add_header("content-type", "application/json")
        urllib.request.urlopen(request, timeout=5).close()
        with trio.fail_after(10):
            async with open_websocket_url(f"ws://127.0.0.1:{node.port}/ws") as ws:
                await ws.send_message(msgpack.packb({"hello": 1}))
                await ws.get_message()
                frame = [
                    {"id": 1, "op": "new_peer", "expires_in": 60},
                    {"id": 2, "op": "check", "limiter": "api", "key": "k"},
                    {"id": 3, "op": "check", "limiter": "api", "key": "k"},
                    {"id": 4, "op": "no_such_op"},
                ]
                await ws.send_message(msgpack.packb(frame))
                answered = 0
                while answered < len(frame):
                    answered += len(msgpack.unpackb(await ws.get_message()))
        text = metrics(node)
    http = "sluicegate_http_request_duration_seconds"
    assert count(text, http, method="GET", route="/health") == 1
    assert count(text, http, method="POST", route="/new_peer") == 1
    # A path's parameters and a method the route lacks never become labels of their own.
    assert count(text, http, method="other", route="/peers/{id}/{semaphore}") == 1
    assert count(text, http, method="other", route="other") == 1
    assert "/peers/1" not in text and "/no/such" not in text
    ws = "sluicegate_ws_request_duration_seconds"
    assert count(text, ws, op="new_peer") == 1
    assert count(text, ws, op="check") == 2
    assert count(text, ws, op="rejected") == 1
    assert re.search(rf'^{ws}_bucket\{{le="\+Inf",op="check"\}} 2\.0$', text, re.MULTILINE)
    # Answering allocates: the young generation has been collected, and timed.
    assert count(text, "sluicegate_gc_pause_seconds", generation="0") >= 1


@pytest.mark.process
def test_a_node_configured_as_throttle_keeps_throttles_metrics_alone(tmp_path):
    with NodeProcess(THROTTLE_ONLY, workdir=tmp_path) as node:
        urllib.request.urlopen(f"{node.url}/health", timeout=5).close()
        text = metrics(node)
    assert "throttle_max" in text
    assert "sluicegate_" not in text
