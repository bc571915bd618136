"""Membership: who is in the cluster, by gossiped heartbeats and failure detection by silence.

Every node keeps one entry per node id: its address, its *generation* (a number that grows with each
start of that node, so a restarted node is recognisably a new life) and its *heartbeat* (a counter
the node bumps on every tick). Nodes periodically send their whole table to a few others; a receiver
keeps whichever entry has the larger (generation, heartbeat). An entry that stops advancing for
`down_after` seconds of the receiver's own clock marks that member down; no node trusts another's
clock. A node leaving gracefully gossips its entry once more with `left` set, which spreads like any
newer entry and takes the member out at once instead of after the timeout. A member that is dead
for good is *forgotten* (`forget`, asked of any live member): that member writes the dead life's
goodbye for it, with a heartbeat (`FORGOTTEN`) no life reaches, so the goodbye outranks anything
that life may still send, while a new life of the same id (a larger generation) is a member
again. A forgotten life that wakes learns it from the gossip and stops (`Forgotten`). The voters
change by one member per forget, and this node refuses another forget, or one while a member
joins or leaves, until `settle` seconds after it last saw the voters change
(docs/cluster.md, "Forgetting a member").

An entry also carries what the node's writes settled of each departed life it knows of (a
bit per slot written again without it, cluster/departures.py): a departure is settled once
the entries together cover every slot (`departures`), and until then a new life's recovery
read counts the departed member among the voters.

An entry also carries a digest of the node's definitions (its semaphores and rate limiters), so
that every node learns which live members were configured otherwise than itself
(`drifted_members`): each decides by its own definitions, and a cluster that disagrees answers
differently depending on who decides.

Pure: `now` and the random source come in as arguments; messages to send come out as values.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable
from dataclasses import dataclass, replace

from .departures import Claim, Departed, unsettled

DEFAULT_DOWN_AFTER = 3.0
DEFAULT_FANOUT = 3
# The heartbeat of a forgotten life's goodbye: beyond any it counts to (one a tick).
FORGOTTEN = 2**62


@dataclass(frozen=True, slots=True)
class MemberState:
    """One node's entry as gossiped."""

    node_id: str
    address: str
    generation: int
    heartbeat: int
    left: bool = False
    # A digest of the node's semaphore and rate-limit definitions (node/config.py).
    definitions: str = ""
    # What the node's writes settled of each departed life it knows of (cluster/departures.py).
    settled: tuple[Claim, ...] = ()

    @property
    def version(self) -> tuple[int, int, bool]:
        # At equal (generation, heartbeat), the goodbye wins.
        return (self.generation, self.heartbeat, self.left)

    @property
    def forgotten(self) -> bool:
        return self.left and self.heartbeat >= FORGOTTEN


@dataclass(frozen=True, slots=True)
class Gossip:
    sender: str
    members: tuple[MemberState, ...]


@dataclass(frozen=True, slots=True)
class MemberUp:
    """A member joined, came back, or restarted (a new generation: it lost its memory)."""

    node_id: str
    address: str
    generation: int


@dataclass(frozen=True, slots=True)
class MemberDown:
    node_id: str
    left: bool  # True: said goodbye; False: fell silent


@dataclass(frozen=True, slots=True)
class Forgotten:
    """This life was forgotten by the others (`forget`): it is no member any more."""

    node_id: str


MembershipEvent = MemberUp | MemberDown | Forgotten


@dataclass(frozen=True, slots=True)
class NotForgotten:
    """Why a forget was refused; `retry_after` seconds, if asking again then may do."""

    reason: str
    retry_after: float = 0.0


class _Entry:
    __slots__ = ("state", "changed_at", "changed_before", "alive")

    def __init__(self, state: MemberState, changed_at: float, alive: bool) -> None:
        self.state = state
        self.changed_at = changed_at
        # When it advanced the time before `changed_at`.
        self.changed_before = -math.inf
        self.alive = alive

    def advanced(self, state: MemberState, now: float) -> None:
        self.state = state
        self.changed_before = self.changed_at
        self.changed_at = now


class Membership:
    def __init__(
        self,
        node_id: str,
        address: str,
        generation: int,
        seeds: Iterable[str] = (),
        *,
        down_after: float = DEFAULT_DOWN_AFTER,
        fanout: int = DEFAULT_FANOUT,
        definitions: str = "",
    ) -> None:
        self.node_id = node_id
        self.down_after = down_after
        self.fanout = fanout
        self._me = MemberState(node_id, address, generation, 0, definitions=definitions)
        self._listed_seeds = [seed for seed in dict.fromkeys(seeds) if seed != address]
        self._seeds = self._listed_seeds
        self._others: dict[str, _Entry] = {}
        self._events: list[MembershipEvent] = []
        # When (by our clock) the voters last changed: a member joined, left or was forgotten.
        self._voters_changed_at = -math.inf
        # Forgotten lives heard from since the last tick: told at the next one.
        self._awake_forgotten: set[str] = set()
        # Member -> the generation of its life this node heard from itself, not through others.
        self._heard_from: dict[str, int] = {}

    # -- queries ----------------------------------------------------------------------------

    @property
    def address(self) -> str:
        return self._me.address

    def live_members(self) -> dict[str, str]:
        """node id -> address of every member believed alive, this node included unless it left."""
        live = {} if self._me.left else {self.node_id: self._me.address}
        for node_id, entry in self._others.items():
            if entry.alive:
                live[node_id] = entry.state.address
        return live

    def known_members(self) -> set[str]:
        """Every member that has not said goodbye, alive or silent, this node included unless it
        left: the cluster whose majority decides who may serve (a member that dies for good keeps
        counting until the cluster restarts)."""
        known = {node_id for node_id, e in self._others.items() if not e.state.left}
        if not self._me.left:
            known.add(self.node_id)
        return known

    def left_members(self) -> set[str]:
        """The other members that said goodbye, or were forgotten (and have not come back
        since)."""
        return {node_id for node_id, e in self._others.items() if e.state.left}

    def departures(self) -> tuple[frozenset[Departed], frozenset[Departed]]:
        """The lives of the members that said goodbye or were forgotten, and of those the ones
        not yet settled: the claims of every node known here do not cover every slot
        (cluster/departures.py)."""
        departed = frozenset(
            (node_id, e.state.generation) for node_id, e in self._others.items() if e.state.left
        )
        if not departed:
            return departed, departed
        claims = [*self._me.settled]
        for entry in self._others.values():
            claims += entry.state.settled
        return departed, frozenset(unsettled(departed, claims))

    def claim(self, settled: tuple[Claim, ...]) -> None:
        """What this node's writes settled, gossiped from now on."""
        if settled != self._me.settled:
            self._me = replace(self._me, settled=settled)

    def forgotten_members(self) -> set[str]:
        return {node_id for node_id, e in self._others.items() if e.state.forgotten}

    def drifted_members(self) -> set[str]:
        """The live members whose definitions differ from this node's."""
        mine = self._me.definitions
        return {
            node_id
            for node_id, entry in self._others.items()
            if entry.alive and entry.state.definitions != mine
        }

    def unknown_seeds(self) -> int:
        """How many of this node's seeds (listed, or found by DNS; its own address skipped)
        belong to no member it knows of, in any state: each may be a voter it has not heard of
        (`Recovery._cold_quorum`). A seed at a member's address is that member, as in
        `knows_the_cluster`."""
        known = {entry.state.address for entry in self._others.values()}
        return sum(seed not in known for seed in self._seeds)

    def knows_the_cluster(self) -> bool:
        """Has this node heard from each of its seeds, and from every member any of them named,
        in its current life, its own gossip? Then it knows every member those know: waiting
        longer would teach it of none but those that start meanwhile (docs/cluster.md, "New
        lives, and a cold start"). Never without seeds: a node that knows nobody cannot tell
        whether others know it."""
        if not self._seeds:
            return False
        others = self._others
        heard_at = {others[node_id].state.address for node_id in self._heard_from}
        return set(self._seeds) <= heard_at and all(
            self._heard_from.get(node_id) == entry.state.generation
            for node_id, entry in others.items()
            if not entry.state.left
        )

    def state_of(self, node_id: str) -> MemberState | None:
        if node_id == self.node_id:
            return self._me
        entry = self._others.get(node_id)
        return entry.state if entry is not None else None

    def last_advanced(self, node_id: str) -> float | None:
        """When (by our clock) another member's entry last advanced; None for unknown or self."""
        entry = self._others.get(node_id)
        return entry.changed_at if entry is not None else None

    def advanced_twice_at(self, node_id: str) -> float | None:
        """When (by our clock) another member's entry had advanced twice as of now: the time of
        the advance before the last (docs/cluster.md, "Routing": one late heartbeat through
        another member is no news of a life that still runs); None for unknown or self."""
        entry = self._others.get(node_id)
        return entry.changed_before if entry is not None else None

    def gossip(self) -> Gossip:
        """This node's whole table, as it gossips it."""
        states = [self._me, *(entry.state for _, entry in sorted(self._others.items()))]
        return Gossip(self.node_id, tuple(states))

    def events(self) -> list[MembershipEvent]:
        events, self._events = self._events, []
        return events

    # -- inputs -----------------------------------------------------------------------------

    def tick(self, now: float, rng: random.Random) -> list[tuple[str, Gossip]]:
        """Advance our heartbeat, mark silent members down, and say what to gossip to whom."""
        if self._me.left:
            return []
        me = self._me
        self._me = replace(me, heartbeat=me.heartbeat + 1)
        for node_id, entry in sorted(self._others.items()):
            if entry.alive and now - entry.changed_at > self.down_after:
                entry.alive = False
                self._events.append(MemberDown(node_id, left=False))

        alive = sorted(e.state.address for e in self._others.values() if e.alive)
        down = sorted(
            e.state.address for e in self._others.values() if not e.alive and not e.state.left
        )
        targets = rng.sample(alive, min(self.fanout, len(alive)))
        # A forgotten life that speaks learns it from us (nobody else gossips to it).
        targets.extend(sorted(self._awake_forgotten))
        self._awake_forgotten.clear()
        # One silent member per tick, so a healed partition is noticed; one seed, so clusters that
        # formed apart (or a node that knows nobody yet) find each other.
        if down:
            targets.append(rng.choice(down))
        seeds = [seed for seed in self._seeds if seed not in targets]
        if seeds:
            if not alive:
                targets.extend(seeds)
            else:
                targets.append(rng.choice(seeds))
        gossip = self.gossip()
        return [(target, gossip) for target in dict.fromkeys(targets)]

    def receive(self, gossip: Gossip, now: float) -> None:
        for state in gossip.members:
            if state.node_id == self.node_id:
                # Nobody knows better than we do who we are, but that we were forgotten.
                me = self._me
                if state.forgotten and state.generation == me.generation and not me.left:
                    self._me = replace(me, heartbeat=FORGOTTEN, left=True)
                    self._events.append(Forgotten(self.node_id))
                continue
            if state.node_id == gossip.sender:
                heard = self._heard_from.get(state.node_id, state.generation)
                self._heard_from[state.node_id] = max(heard, state.generation)
            entry = self._others.get(state.node_id)
            if entry is None:
                entry = self._others[state.node_id] = _Entry(state, now, alive=False)
                if not state.left:
                    entry.alive = True
                    self._voters_changed_at = now
                    self._events.append(MemberUp(state.node_id, state.address, state.generation))
                continue
            if state.version <= entry.state.version:
                forgotten = entry.state
                if state.node_id == gossip.sender and forgotten.forgotten:
                    if state.generation == forgotten.generation:
                        self._awake_forgotten.add(forgotten.address)
                continue
            previous = entry.state
            entry.advanced(state, now)
            if state.left != previous.left:
                self._voters_changed_at = now
            if state.left:
                if entry.alive:
                    entry.alive = False
                    self._events.append(MemberDown(state.node_id, left=True))
            elif not entry.alive or state.generation != previous.generation:
                entry.alive = True
                self._events.append(MemberUp(state.node_id, state.address, state.generation))

    def forget(self, node_id: str, now: float, settle: float) -> NotForgotten | None:
        """Forget `node_id`, a member dead for good: its life's goodbye, written here, spreads
        with the next gossip. None if forgotten. Only a member counted and silent is forgotten,
        and only `settle` seconds after the voters last changed here, so that the voters of
        any two members differ by one member at most."""
        if node_id == self.node_id:
            return NotForgotten("a node cannot forget itself: drain it (sluicegate drain)")
        entry = self._others.get(node_id)
        if entry is None:
            return NotForgotten("no member of that id is known here")
        if entry.state.left:
            gone = "forgotten" if entry.state.forgotten else "left"
            return NotForgotten(f"{node_id} is gone already ({gone})")
        if entry.alive:
            return NotForgotten(
                f"{node_id} is alive (heard {now - entry.changed_at:.1f} s ago): stop it first, "
                f"or drain it; a member is forgotten once silent for {self.down_after:g} s"
            )
        wait = self._settling(now, settle)
        if wait:
            return NotForgotten(
                f"the members changed {now - self._voters_changed_at:.1f} s ago: one change "
                f"at a time, each {settle:g} s apart, so that every node counts the same voters "
                "to within one",
                wait,
            )
        entry.advanced(replace(entry.state, heartbeat=FORGOTTEN, left=True), now)
        self._voters_changed_at = now
        return None

    def _settling(self, now: float, settle: float) -> float:
        """Seconds until the members may change again by a forget (0: now)."""
        return max(0.0, self._voters_changed_at + settle - now)

    def use_found_seeds(self, seeds: Iterable[str]) -> None:
        """Seeds a discovery found (DNS names of the join list), in place of those it found
        before; the listed seeds stay. Only whom a tick introduces this node to changes: the
        members known stay, alive or not, as their gossip says."""
        found = [seed for seed in seeds if seed != self._me.address]
        self._seeds = list(dict.fromkeys([*self._listed_seeds, *found]))

    def leave(self) -> list[tuple[str, Gossip]]:
        """Say goodbye: the final gossip, to every member believed alive."""
        me = self._me
        self._me = replace(me, heartbeat=me.heartbeat + 1, left=True)
        gossip = self.gossip()
        return [(e.state.address, gossip) for _, e in sorted(self._others.items()) if e.alive]
