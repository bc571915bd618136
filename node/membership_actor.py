"""The membership actor: one trio task owns the membership core and keeps the node's links.

Every gossip interval it ticks the core and sends the gossip it asks for over the links that are
up (gossip is periodic and idempotent, so nothing is queued for a link that is down). It keeps one
link per member in the direction `Links.dials` says, contacts seeds it has no link to, and rebuilds
the ring (`ring`) whenever the live member set changes.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Callable

import trio

from sluicegate.cluster.departures import Claim, Departed
from sluicegate.cluster.membership import (
    Forgotten,
    Gossip,
    MemberDown,
    Membership,
    MemberUp,
    NotForgotten,
)
from sluicegate.cluster.ring import Ring

from .clock import TRIO_CLOCK, Clock
from .links import Links

log = logging.getLogger("sluicegate.membership")

# How long a seed contact stays open to swap gossip.
INTRODUCTION_HOLD = 2.0
# At most this long for the goodbye to leave before the node stops.
GOODBYE_FLUSH = 0.3
# How often, while members it counts for the quorum are down, a node names them (a member
# replaced under a new id stays counted, and the cluster may have lost its majority for it).
DOWN_REMINDER = 60.0
# How often, while live members are configured otherwise than this node, it names them.
DRIFT_REMINDER = 60.0


class MembershipActor:
    def __init__(
        self,
        membership: Membership,
        links: Links,
        *,
        interval: float,
        rng: random.Random,
        clock: Clock = TRIO_CLOCK,
        on_member_down: Callable[[str], None] = lambda node_id: None,
        on_change: Callable[[], None] = lambda: None,
        on_forgotten: Callable[[], None] = lambda: None,
    ) -> None:
        """`on_member_down(node_id)` is called whenever a member is counted down (silent or
        gone), `on_change()` after anything that may have changed the members (a gossip, a
        tick), `on_forgotten()` once the others forgot this life; `clock` is the node's, which
        times the gossip ticks and stamps what is heard."""
        self._membership = membership
        self._links = links
        self._interval = interval
        self._rng = rng
        self._clock = clock
        self._on_member_down = on_member_down
        self._on_change = on_change
        self._on_forgotten = on_forgotten
        self._dialing: dict[str, tuple[str, trio.CancelScope]] = {}
        self._introducing: set[str] = set()
        self._reminded_at = -math.inf
        self._drifted: set[str] = set()
        self._drift_told_at = -math.inf
        self._nursery: trio.Nursery | None = None
        self.ring = Ring(membership.live_members())

    @property
    def node_id(self) -> str:
        return self._membership.node_id

    def live_members(self) -> dict[str, str]:
        return self._membership.live_members()

    def heartbeat_of(self, node_id: str) -> int:
        state = self._membership.state_of(node_id)
        return state.heartbeat if state is not None else 0

    def oldest_member(self) -> str | None:
        """The live member that started first (smallest generation, then id); every node that
        sees the same members picks the same one."""
        states = [self._membership.state_of(node_id) for node_id in self.live_members()]
        oldest = min(
            (s for s in states if s is not None),
            key=lambda s: (s.generation, s.node_id),
            default=None,
        )
        return oldest.node_id if oldest is not None else None

    def in_majority(self) -> bool:
        """Are the live members more than half of the members known? A node that is not must
        stop serving: across a partition, the other side takes its share over."""
        return 2 * len(self.live_members()) > len(self._membership.known_members())

    def known_members(self) -> set[str]:
        """Every member that has not said goodbye, alive or silent, this node included."""
        return self._membership.known_members()

    def left_members(self) -> set[str]:
        """Members that left gracefully (they replicated everything before they said goodbye),
        or were forgotten."""
        return self._membership.left_members()

    def forget(self, node_id: str) -> NotForgotten | None:
        """Forget a member dead for good (`sluicegate forget`); why not, if refused. Changes of
        the members wait `2 × down_after` for one another (cluster/membership.py)."""
        refused = self._membership.forget(
            node_id, self._clock.now(), 2 * self._membership.down_after
        )
        if refused is None:
            log.warning(
                "Forgot member %s: it no longer counts for the quorum (%d members counted).",
                node_id,
                len(self._membership.known_members()),
            )
            self._stop_dialing(node_id)
            self._on_change()
        return refused

    def departures(self) -> tuple[frozenset[Departed], frozenset[Departed]]:
        """See `Membership.departures`."""
        return self._membership.departures()

    def claim(self, settled: tuple[Claim, ...]) -> None:
        """What this node's writes settled of departed members: gossiped from now on, and
        maybe the last of a departure's slots."""
        self._membership.claim(settled)
        self._on_change()

    def down_members(self) -> set[str]:
        """Members counted for the quorum that this node believes down (silent, not left)."""
        return self._membership.known_members() - set(self._membership.live_members())

    def drifted_members(self) -> set[str]:
        """Live members whose semaphore and rate-limit definitions differ from this node's."""
        return self._membership.drifted_members()

    def unknown_seeds(self) -> int:
        """See `Membership.unknown_seeds`."""
        return self._membership.unknown_seeds()

    def knows_the_cluster(self) -> bool:
        """Heard from each seed and every member they named (`Membership.knows_the_cluster`)."""
        return self._membership.knows_the_cluster()

    def generation_of(self, node_id: str) -> int | None:
        """The life of `node_id` this node knows of, if any (live or not)."""
        state = self._membership.state_of(node_id)
        return state.generation if state is not None else None

    def generations(self) -> dict[str, int]:
        """Each live member's generation: a new one means it restarted and lost its memory."""
        members = {}
        for node_id in self.live_members():
            state = self._membership.state_of(node_id)
            if state is not None:
                members[node_id] = state.generation
        return members

    def report(self) -> list[dict]:
        """Every member this node knows of, itself first: id, address, generation, state (up,
        down or left), seconds since its gossip last advanced, and whether the link to it is up
        (None for itself)."""
        now = self._clock.now()
        live = self._membership.live_members()
        links = self._links.status()
        left = self._membership.left_members()
        forgotten = self._membership.forgotten_members()
        others = sorted((self._membership.known_members() | left) - {self.node_id})
        rows = []
        for node_id in [self.node_id, *others]:
            state = self._membership.state_of(node_id)
            if state is None:
                continue
            advanced = self._membership.last_advanced(node_id)
            rows.append(
                {
                    "id": node_id,
                    "address": state.address,
                    "generation": state.generation,
                    "state": _state(node_id, live, left, forgotten),
                    "gossip_lag": None if advanced is None else round(now - advanced, 3),
                    "definitions": state.definitions,
                    "link": None if node_id == self.node_id else links.get(node_id, False),
                }
            )
        return rows

    def gossip_lag(self) -> dict[str, float]:
        """Seconds since each other live member's entry last advanced (a fresh heartbeat)."""
        now = self._clock.now()
        lags = {}
        for node_id in self.live_members():
            advanced = self._membership.last_advanced(node_id)
            if advanced is not None:
                lags[node_id] = now - advanced
        return lags

    def heartbeats(self) -> dict[str, int]:
        """Gossip heartbeat count of each live member: how many ticks it has lived."""
        return {node_id: self.heartbeat_of(node_id) for node_id in self.live_members()}

    def _running(self) -> trio.Nursery:
        """The actor's nursery (`run`), where its dialers and introductions run."""
        if self._nursery is None:
            raise RuntimeError("the membership actor is not running")
        return self._nursery

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            while True:
                self._tick()
                await self._clock.sleep(self._interval)

    def use_found_seeds(self, seeds: tuple[str, ...]) -> None:
        """Seeds found by DNS (node/dns_discovery.py), in place of those found before."""
        self._membership.use_found_seeds(seeds)
        self._on_change()

    def receive(self, gossip: Gossip) -> None:
        """Gossip that arrived over a link."""
        self._membership.receive(gossip, self._clock.now())
        self._apply_events()
        # With or without an event: a seed heard from for the first time changes what the
        # shard is told (`ClusterSemaphores.follow_members`), and nothing else would tell it.
        self._on_change()

    async def leave(self) -> None:
        """Say goodbye over every link that is up, and wait (briefly) until it has left."""
        node_at = {address: node_id for node_id, address in self._known_addresses().items()}
        for target, gossip in self._membership.leave():
            node_id = node_at.get(target)
            if node_id is not None:
                self._links.send(node_id, gossip)
        await self._links.flush(GOODBYE_FLUSH)

    # -- internals ---------------------------------------------------------------------------

    def _tick(self) -> None:
        now = self._clock.now()
        targets = self._membership.tick(now, self._rng)
        self._apply_events()
        self._on_change()
        self._remind_of_down_members(now)
        self._tell_of_drift(now)
        linked = self._links.status()
        node_at = {address: node_id for node_id, address in self._known_addresses().items()}
        for address, gossip in targets:
            node_id = node_at.get(address)
            if node_id is not None and linked.get(node_id):
                self._links.send_together([(node_id, gossip)])
            elif address not in self._introducing:
                # A seed, or a member with no link up: links only form in one direction (the
                # smaller id dials), so a restarted node that knows nobody would never hear from
                # the others; an introduction reaches it from either side.
                self._introducing.add(address)
                self._running().start_soon(self._introduce, address, gossip)

    def _remind_of_down_members(self, now: float) -> None:
        down = self.down_members()
        if down and now >= self._reminded_at + DOWN_REMINDER:
            self._reminded_at = now
            log.warning(
                "%d of %d members are down and still counted for the quorum: %s. A member that "
                "will not come back keeps counting; replace it under the same id.",
                len(down),
                len(self._membership.known_members()),
                ", ".join(sorted(down)),
            )

    def _definitions_of(self, node_id: str) -> str:
        state = self._membership.state_of(node_id)
        return "unknown" if state is None else state.definitions

    def _tell_of_drift(self, now: float) -> None:
        drifted = self.drifted_members()
        changed = drifted != self._drifted
        self._drifted = drifted
        if drifted and (changed or now >= self._drift_told_at + DRIFT_REMINDER):
            self._drift_told_at = now
            mine = self._definitions_of(self.node_id)
            theirs = ", ".join(
                f"{node_id} ({self._definitions_of(node_id)})" for node_id in sorted(drifted)
            )
            log.warning(
                "Members configured with other semaphores or rate limiters than this node "
                "(definitions %s here): %s. Each node decides by its own; finish the change on "
                "every node.",
                mine,
                theirs,
            )
        elif changed:
            log.info("Every live member has this node's definitions again.")

    async def _introduce(self, address: str, gossip: Gossip) -> None:
        try:
            # Queued under the id found at the address, once the handshake tells it.
            remote_id = await self._links.introduce(
                address, INTRODUCTION_HOLD, first_message=gossip
            )
            if remote_id is not None:
                log.info("Seed %s is node %s.", address, remote_id)
        finally:
            self._introducing.discard(address)

    def _known_addresses(self) -> dict[str, str]:
        known = {}
        for node_id in self._links.status():
            state = self._membership.state_of(node_id)
            if state is not None:
                known[node_id] = state.address
        known.update(self._membership.live_members())
        return known

    def _apply_events(self) -> None:
        """Act on what the membership saw happen (the caller tells of the change)."""
        events = self._membership.events()
        if not events:
            return
        for event in events:
            if isinstance(event, MemberUp):
                log.info("Member %s is up at %s.", event.node_id, event.address)
                self._keep_linked(event.node_id, event.address)
                # At once, not at the next tick: until it has heard from every member it knows
                # of, a starting member waits (`Membership.knows_the_cluster`).
                self._links.send(event.node_id, self._membership.gossip())
            elif isinstance(event, MemberDown):
                log.warning(
                    "Member %s %s.", event.node_id, "left" if event.left else "is down (silent)"
                )
                if event.left:
                    self._stop_dialing(event.node_id)
                self._on_member_down(event.node_id)
            elif isinstance(event, Forgotten):
                log.critical(
                    "The cluster forgot this node (%s, sluicegate forget): it is no member any "
                    "more, and stops. Start it again to join as a new life.",
                    event.node_id,
                )
                self._on_forgotten()
        self.ring = Ring(self._membership.live_members())

    def _keep_linked(self, node_id: str, address: str) -> None:
        """Dial members that are ours to dial; keep dialing silent ones so recovery is seen."""
        if not self._links.dials(node_id):
            return
        current = self._dialing.get(node_id)
        if current is not None and current[0] == address:
            self._links.redial(node_id)
            return
        self._stop_dialing(node_id)
        scope = trio.CancelScope()
        self._dialing[node_id] = (address, scope)

        async def dial() -> None:
            with scope:
                await self._links.keep_linked(node_id, address)

        self._running().start_soon(dial)

    def _stop_dialing(self, node_id: str) -> None:
        current = self._dialing.pop(node_id, None)
        if current is not None:
            current[1].cancel()


def _state(node_id: str, live, left: set[str], forgotten: set[str]) -> str:
    if node_id in forgotten:
        return "forgotten"
    if node_id in left:
        return "left"
    return "up" if node_id in live else "down"
