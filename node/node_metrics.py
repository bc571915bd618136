"""sluicegate's own metrics of a node, beside Throttle's families on `/metrics`.

A registry of this node's own (never prometheus-client's process-global one, which would mix
nodes running in one process, as in the simulations), filled at scrape time from the actors' state.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from sluicegate.cluster.quota_leases import LeaseStats
from sluicegate.cluster.rate_limits import MAX_REMEMBERED_GOES, REMEMBER_GOES_FOR

from .links import Links
from .membership_actor import MembershipActor
from .rate_limit_service import RateLimitService
from .semaphore_service import ClusterSemaphores


class RateLimitCollector(Collector):
    """Per limiter, what this node decided and saw."""

    def __init__(self, service: RateLimitService) -> None:
        self._service = service

    @staticmethod
    def _leases(stats: dict[str, LeaseStats]):
        """Lease mode: the slices this node handed out, as the keys' owner."""
        if not stats:
            return
        families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {
            "open": GaugeMetricFamily(
                "sluicegate_rate_lease_slices_open",
                "Slices of the limiter's keys that holders may spend now.",
                labels=["limiter"],
            ),
            "granted": CounterMetricFamily(
                "sluicegate_rate_lease_slices_granted", "Slices handed out.", labels=["limiter"]
            ),
            "renewals": CounterMetricFamily(
                "sluicegate_rate_lease_renewals",
                "Slices handed to a holder that held one of the key already.",
                labels=["limiter"],
            ),
            "spent_reported": CounterMetricFamily(
                "sluicegate_rate_lease_spent",
                "Tokens holders reported spent: the checks they decided themselves (weight).",
                labels=["limiter"],
            ),
            "returned_unspent": CounterMetricFamily(
                "sluicegate_rate_lease_returned",
                "Tokens closed slices gave back unspent (weight).",
                labels=["limiter"],
            ),
            "lost": CounterMetricFamily(
                "sluicegate_rate_lease_slices_lost",
                "Slices that ended unclosed: their holder went, or asked again too late.",
                labels=["limiter"],
            ),
        }
        for name, counts in stats.items():
            for field, family in families.items():
                family.add_metric([name], getattr(counts, field))
        yield from families.values()

    def collect(self):
        core = self._service.core
        decisions = CounterMetricFamily(
            "sluicegate_rate_limit_decisions",
            "Checks and waits this node decided, by limiter and decision (go or sorry).",
            labels=["limiter", "decision"],
        )
        waiting = GaugeMetricFamily(
            "sluicegate_rate_limit_waiting",
            "Callers queued at this node for a key of the limiter.",
            labels=["limiter"],
        )
        lag = GaugeMetricFamily(
            "sluicegate_rate_limit_gossip_lag_seconds",
            "Age of the newest gossiped go event when it arrived (gossip mode; two clocks).",
            labels=["limiter"],
        )
        gossiped = CounterMetricFamily(
            "sluicegate_rate_limit_gossiped",
            "Other nodes' go events this node merged into its keys (gossip mode), each once.",
            labels=["limiter"],
        )
        overshoot = CounterMetricFamily(
            "sluicegate_rate_limit_overshoot",
            "Admissions beyond the limiter's rule this node found when merging gossip (weight).",
            labels=["limiter"],
        )
        repeated = CounterMetricFamily(
            "sluicegate_rate_limit_repeated",
            "Retries answered with the go their first try got, not admitted again.",
            labels=["limiter"],
        )
        for name in core.names:
            stats = core.stats[name]
            repeated.add_metric([name], stats.repeated)
            decisions.add_metric([name, "go"], stats.go)
            decisions.add_metric([name, "sorry"], stats.sorry)
            waiting.add_metric([name], self._service.waiting[name])
            lag.add_metric([name], stats.gossip_lag)
            gossiped.add_metric([name], stats.gossiped)
            overshoot.add_metric([name], stats.overshoot)
        yield decisions
        yield waiting
        yield lag
        yield gossiped
        yield overshoot
        yield repeated
        yield GaugeMetricFamily(
            "sluicegate_rate_limit_keys", "Keys whose state this node keeps.", value=core.keys()
        )
        yield from self._leases(core.lease_stats())
        yield GaugeMetricFamily(
            "sluicegate_rate_limit_spent_slots",
            "Slots gained without their previous owner's hand-over, whose exact-mode keys start "
            "spent here (until a key spent then would be as good as new).",
            value=core.spent_slots(),
        )
        yield GaugeMetricFamily(
            "sluicegate_rate_limit_remembered_goes",
            f"Goes remembered by their retry id for retries ({REMEMBER_GOES_FOR:g} s or more).",
            value=len(core.goes),
        )
        yield CounterMetricFamily(
            "sluicegate_rate_limit_goes_forgotten_early",
            f"Remembered goes forgotten before {REMEMBER_GOES_FOR:g} s, to keep at most "
            f"{MAX_REMEMBERED_GOES:,}.",
            value=core.goes.forgotten_early,
        )


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
        yield GaugeMetricFamily(
            "sluicegate_members_down",
            "Members this node counts for the quorum but believes down (silent, not left): they "
            "count until they come back.",
            value=len(self._membership.down_members()),
        )
        yield GaugeMetricFamily(
            "sluicegate_members_drifted",
            "Live members whose semaphore and rate-limit definitions differ from this node's.",
            value=len(self._membership.drifted_members()),
        )
        shard = self._service.shard_actor.shard
        ownership = shard.ownership
        yield GaugeMetricFamily(
            "sluicegate_slots_acting",
            "Slots this node acts for now (it holds their lease), of 256.",
            value=len(ownership.acting_slots(self._service.now())),
        )
        yield GaugeMetricFamily(
            "sluicegate_members_slow",
            "Members (this node included) whose lease rounds reach a quorum too slowly for them "
            "to act for slots: the ring names them for none (docs/cluster.md).",
            value=len(ownership.placement.slow),
        )
        yield GaugeMetricFamily(
            "sluicegate_peers_homed",
            "Peers whose home is this node.",
            value=len(shard.home.peers),
        )
        yield GaugeMetricFamily(
            "sluicegate_acquires_waiting",
            "Acquires waiting at this node for their peer's locks (block_for, or wait over /ws); "
            "a client that goes away withdraws its own.",
            value=shard.waiting_acquires,
        )
        yield GaugeMetricFamily(
            "sluicegate_semaphores_in_grace",
            "Semaphores granting nothing new yet after a cold start (cold_start_grace).",
            value=len(shard.owner.leases.in_grace()),
        )
        yield GaugeMetricFamily(
            "sluicegate_answers_waiting_for_quorum",
            "Answers and messages held back until the writes they follow are committed.",
            value=ownership.gate.waiting,
        )
        yield GaugeMetricFamily(
            "sluicegate_ready",
            "1 once this node acts for every slot its ring names it for.",
            value=int(self._service.ready),
        )
        yield CounterMetricFamily(
            "sluicegate_requests_forwarded",
            "Semaphore requests this node forwarded to the peer's home or the semaphore's owner.",
            value=self._service.forwarded,
        )
        slots = CounterMetricFamily(
            "sluicegate_slots_changed",
            "Slots this node gained, and lost (its lease ran out, or a larger ballot won) or "
            "resigned (handed on to the member its ring names).",
            labels=["change"],
        )
        slots.add_metric(["gained"], ownership.gained)
        slots.add_metric(["lost"], ownership.lost - ownership.resigned)
        slots.add_metric(["resigned"], ownership.resigned)
        yield slots
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
