"""sluicegate's own metrics of a node, beside Throttle's families on `/metrics`.

A registry of this node's own (never prometheus-client's process-global one, which would mix
nodes running in one process, as in the simulations), filled at scrape time from the actors' state.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from .links import Links
from .membership_actor import MembershipActor


class ClusterCollector(Collector):
    def __init__(self, membership: MembershipActor, links: Links) -> None:
        self._membership = membership
        self._links = links

    def collect(self):
        yield GaugeMetricFamily(
            "sluicegate_members_up",
            "Members this node believes alive, itself included.",
            value=len(self._membership.live_members()),
        )
        link_up = GaugeMetricFamily(
            "sluicegate_link_up", "1 while the link to that node is connected.", labels=["node"]
        )
        for node_id, connected in self._links.status().items():
            link_up.add_metric([node_id], 1 if connected else 0)
        yield link_up


class NodeMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)

    def render(self) -> str:
        return generate_latest(self.registry).decode()
