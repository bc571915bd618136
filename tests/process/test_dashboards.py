"""deploy/grafana/ and deploy/prometheus/: well formed, and every metric they name is one a
running three-node cluster serves (with semaphores, rate limits and traffic on every surface)."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

import msgpack
import pytest
import trio
import yaml
from trio_websocket import open_websocket_url

from tests.nodes import NodeProcess, cluster_of

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "sluicegate.json"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yaml"
OURS = re.compile(r"\b((?:sluicegate|throttle)_[a-z0-9_]+)")
CONFIG = """
[semaphores]
A = 2
B = 1

[rate_limits]
exact = { algorithm = "token_bucket", capacity = 5, rate = 1 }
gossip = { algorithm = "fixed_window", limit = 100, window = "1s", mode = "gossip" }

[cluster]
down_after = "1s"
gossip_interval = "200ms"
"""
SECRET = {"SLUICEGATE_CLUSTER_SECRET": "dashboards-test-secret-0123456789"}


def dashboard_expressions() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    expressions = [
        target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])
    ]
    expressions += [v["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    return expressions


def alert_rules() -> list[dict]:
    return [
        rule for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]
    ]


def test_the_dashboard_is_well_formed():
    dashboard = json.loads(DASHBOARD.read_text())
    panels = dashboard["panels"]
    assert len({panel["id"] for panel in panels}) == len(panels)
    variables = {variable["name"] for variable in dashboard["templating"]["list"]}
    assert variables == {"datasource", "job"}
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        for target in panel.get("targets", []):
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]
            assert 'job="$job"' in target["expr"], panel["title"]


def test_every_alert_has_an_expression_a_severity_and_words_for_a_person():
    rules = alert_rules()
    assert len({rule["alert"] for rule in rules}) == len(rules)
    for rule in rules:
        assert rule["expr"].strip(), rule["alert"]
        assert rule["labels"]["severity"] in ("info", "warning", "critical"), rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
    named = {name for rule in rules for name in OURS.findall(rule["expr"])}
    # What the issue asks to alert on: readiness, the majority, members down, restores beyond
    # max, gossip lag, links.
    assert {
        "sluicegate_ready",
        "sluicegate_members_up",
        "sluicegate_members_down",
        "sluicegate_restores_beyond_max_total",
        "sluicegate_gossip_lag_seconds",
        "sluicegate_link_up",
    } <= named


def served_names(url: str) -> set[str]:
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as response:
        text = response.read().decode()
    return set(re.findall(r"^([a-z_][a-z0-9_]*)[{ ]", text, re.MULTILINE))


def post(url: str, body: bytes = b"") -> None:
    request = urllib.request.Request(url, data=body, method="POST")
    request.add_header("content-type", "application/json")
    urllib.request.urlopen(request, timeout=5).close()


async def traffic(node: NodeProcess) -> None:
    """Something on every surface: HTTP routes, /ws ops, both limiters, both semaphores."""
    post(f"{node.url}/rate_limits/exact/check?key=k")
    with trio.fail_after(10):
        async with open_websocket_url(f"ws://127.0.0.1:{node.port}/ws") as ws:
            await ws.send_message(msgpack.packb({"hello": 1}))
            await ws.get_message()
            frame = [
                {"id": 1, "op": "check", "limiter": "gossip", "key": "k"},
                {"id": 2, "op": "new_peer", "expires_in": 60},
            ]
            await ws.send_message(msgpack.packb(frame))
            answers: dict[int, dict] = {}
            while len(answers) < len(frame):
                for answer in msgpack.unpackb(await ws.get_message()):
                    answers[answer["id"]] = answer
            peer = answers[2]["ok"]
            requests = [
                {"id": 3 + i, "op": "acquire", "peer": peer, "semaphore": name, "count": 1}
                for i, name in enumerate("AB")
            ]
            await ws.send_message(msgpack.packb(requests))
            answered = 0
            while answered < len(requests):
                answered += len(msgpack.unpackb(await ws.get_message()))


@pytest.mark.process
async def test_every_metric_the_dashboard_and_alerts_name_is_served(tmp_path):
    named = {name for expr in dashboard_expressions() for name in OURS.findall(expr)}
    named |= {name for rule in alert_rules() for name in OURS.findall(rule["expr"])}
    with cluster_of(tmp_path, CONFIG, SECRET) as nodes:
        await traffic(nodes[0])
        served = set().union(*(served_names(node.url) for node in nodes))
    assert named - served == set()
