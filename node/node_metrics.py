"""sluicegate's own metrics of a node, beside Throttle's families on `/metrics`.

A registry of this node's own (never prometheus-client's process-global one, which would mix
nodes running in one process, as in the simulations), filled at scrape time from the actors' state.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from .links import Links
from .membership_actor import MembershipActor
from .semaphore_service import ClusterSemaphores


class ClusterCollector(Collector):
    def __init__(
        self,
        membership: MembershipActor,
        links: Links,
        service: ClusterSemaphores,
    ) -> None:
        self._membership = membership
        self._links = links
        self._service = service

    def collect(self):
        yield GaugeMetricFamily(
            "sluicegate_members_up",
            "Members this node believes alive, itself included.",
            value=len(self._membership.live_members()),
        )
        core = self._service.core
        yield GaugeMetricFamily(
            "sluicegate_semaphores_owned",
            "Configured semaphores whose ring owner this node is, by its view of the members.",
            value=len(core.owned_semaphores()),
        )
        yield GaugeMetricFamily(
            "sluicegate_peers_homed",
            "Peers whose home is this node.",
            value=len(core.peer_ids()),
        )
        yield GaugeMetricFamily(
            "sluicegate_handoffs_awaited",
            "Members whose handoff this joining node still waits for before it serves.",
            value=len(core.waiting_for_handoff()),
        )
        yield GaugeMetricFamily(
            "sluicegate_ready", "1 once this node serves requests.", value=int(self._service.ready)
        )
        yield CounterMetricFamily(
            "sluicegate_requests_forwarded",
            "Semaphore requests this node forwarded to the peer's home or the semaphore's owner.",
            value=self._service.forwarded,
        )
        yield CounterMetricFamily(
            "sluicegate_takeovers",
            "Times this node took over part of a departed member's share from its replica.",
            value=self._service.takeovers,
        )
        yield CounterMetricFamily(
            "sluicegate_restores_beyond_max",
            "Restores that left a semaphore above its max (allowed, and worth watching).",
            value=self._service.restores_beyond_max,
        )
        lag = GaugeMetricFamily(
            "sluicegate_gossip_lag_seconds",
            "Seconds since that member's gossip last brought news of it (a fresh heartbeat).",
            labels=["node"],
        )
        for node_id, seconds in sorted(self._membership.gossip_lag().items()):
            lag.add_metric([node_id], seconds)
        yield lag
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
