"""A model of a cluster of `Ownership` cores, without trio or sockets: discrete events in real
time, a network that loses, repeats and delays messages (in order per pair of lives, as node
links are), partitions, pauses, crashes and clocks that run up to 1.5% fast or slow.

Each node has lives; a life is an `Ownership` core that sees only its own clock. The model
watches what the docs/cluster.md invariants forbid:

* O1: every few milliseconds of real time it asks every life that runs whether it acts for each
  slot, and records the span of real time of each gained term; two terms of one slot overlap
  never.
* O2: lives that act write records with unique keys; a write is committed when its node's
  `CommitGate` releases what was held behind it; every later owner of the slot starts from
  records that contain it.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections import defaultdict
from dataclasses import dataclass, field

from sluicegate.cluster.departures import unsettled
from sluicegate.cluster.ownership import Gained, Lost, Ownership
from sluicegate.cluster.peers import PeerRecord
from sluicegate.cluster.ring import Ring
from sluicegate.cluster.slots import SLOTS, slot_owners

LEASE = 1.0
DOWN_AFTER = 1.0
HELLO_EVERY = 0.1
PROBE_EVERY = 0.01


@dataclass
class Life:
    node: str
    number: int
    core: Ownership
    rate: float
    # local time = offset + rate * real time
    offset: float
    paused_until: float = -1.0
    heard: dict[str, float] = field(default_factory=dict)  # member -> local time last heard
    view: tuple = ()
    known: set = field(default_factory=set)
    departures: tuple = ()
    # Its seeds: every other member, or none (the first node of a cluster that grows from one).
    seeded: bool = True

    def local(self, t: float) -> float:
        return self.offset + self.rate * t

    def real(self, local: float) -> float:
        return (local - self.offset) / self.rate


@dataclass
class Term:
    """One gained term of one slot at one life: the real times it was seen acting."""

    life: tuple[str, int]
    gained_at: float
    first: float | None = None
    last: float | None = None
    ended: bool = False


class Model:
    def __init__(
        self,
        seed: int,
        nodes: int = 3,
        skew: float = 0.015,
        rates: dict[str, float] | None = None,
        down_after: float = DOWN_AFTER,
        start: list[str] | None = None,
    ) -> None:
        """`skew`: each life's clock runs up to that much fast or slow, at random; `rates`: or
        exactly so fast, by node; `down_after`: how long a life's silence takes to be
        noticed; `start`: the nodes that start at once (default: all); then each node's voters
        are the members it has heard of, as a real node's known members."""
        self.down_after = down_after
        self.known_voters = start is not None
        self.rng = random.Random(seed)
        self.ids = [f"n{i}" for i in range(1, nodes + 1)]
        self.skew = skew
        self.rates = rates or {}
        self.t = 0.0
        self._events: list = []
        self._seq = itertools.count()
        self.lives: dict[str, Life | None] = {}
        self._life_numbers = itertools.count(1)
        self.cut: set[tuple[str, str]] = set()
        # (sender, receiver) -> how long its messages take, when slower than usual
        self.slow: dict[tuple[str, str], float] = {}
        self.loss = 0.0
        self.duplicate = 0.0
        # (sender life, receiver node) -> real time its last message is due (order per pair)
        self._due: dict[tuple[tuple[str, int], str], float] = {}
        self.terms: dict[int, list[Term]] = defaultdict(list)
        self._open: dict[tuple[int, tuple[str, int]], Term] = {}
        self.committed: dict[int, set[int]] = defaultdict(set)
        self.violations: list[str] = []
        self._keys = itertools.count(1)
        self.writes = 0
        self.gains = 0
        # Members forgotten (`sluicegate forget`): no life counts them as voters any more;
        # their departed lives, for cluster/departures.py.
        self.forgotten: set[str] = set()
        self._departed: frozenset[tuple[str, int]] = frozenset()
        for node in self.ids if start is None else start:
            self.start(node, seeded=start is None or len(start) > 1)
        self._schedule(0.0, "probe")

    # -- running ----------------------------------------------------------------------------

    def run_until(self, end: float) -> None:
        while self._events and self._events[0][0] <= end:
            t, _, kind, data = heapq.heappop(self._events)
            self.t = t
            getattr(self, "_on_" + kind)(*data)
        self.t = end

    def _schedule(self, t: float, kind: str, *data) -> None:
        heapq.heappush(self._events, (t, next(self._seq), kind, data))

    # -- faults -----------------------------------------------------------------------------

    def start(self, node: str, seeded: bool = True) -> None:
        """A new life of `node`; `seeded`: it has seeds (every node but the first of a cluster
        that grows from one)."""
        rate = self.rates.get(node, 1 + self.rng.uniform(-self.skew, self.skew))
        offset = self.rng.uniform(0, 1000)
        number = next(self._life_numbers)
        life = Life(node, number, None, rate, offset, seeded=seeded)  # type: ignore[arg-type]
        life.core = Ownership(
            node,
            life=number,
            lease=LEASE,
            settle=self.down_after,
            era_floor=1000 + int(self.t * 1000),
            rng=random.Random(self.rng.getrandbits(64)),
            now=life.local(self.t),
        )
        life.core.unknown_seeds(self._unknown_seeds(life))
        self.lives[node] = life
        self._schedule(self.t, "tick", node, number)
        self._schedule(self.t, "hello", node, number)

    def crash(self, node: str) -> None:
        life = self.lives[node]
        if life is not None:
            for (slot, key), term in list(self._open.items()):
                if key == (node, life.number):
                    term.ended = True
                    del self._open[slot, key]
        self.lives[node] = None

    def forget(self, node: str) -> None:
        """`node`, dead, is forgotten: every life counts it out of the voters at once."""
        life = self.lives[node]
        assert life is not None
        self.crash(node)
        self.forgotten.add(node)
        self._departed |= {(node, life.number)}

    def pause(self, node: str, seconds: float) -> None:
        life = self.lives[node]
        if life is not None:
            life.paused_until = self.t + seconds

    def partition(self, a: str, b: str, both_ways: bool = True) -> None:
        self.cut.add((a, b))
        if both_ways:
            self.cut.add((b, a))

    def slow_down(self, a: str, b: str, seconds: float) -> None:
        """Messages between `a` and `b` take `seconds` each way, in order."""
        self.slow[a, b] = self.slow[b, a] = seconds

    def heal(self) -> None:
        self.cut.clear()
        self.slow.clear()

    def isolate(self, node: str) -> None:
        """Cut `node` off from every other node, both ways."""
        for other in self.ids:
            if other != node:
                self.partition(node, other)

    # -- event handlers ---------------------------------------------------------------------

    def _running(self, node: str, number: int) -> Life | None:
        life = self.lives.get(node)
        if life is None or life.number != number:
            return None
        return life

    def _deferred(self, life: Life, kind: str, *data) -> bool:
        """A paused life does nothing: its events wait until it wakes."""
        if self.t < life.paused_until:
            self._schedule(life.paused_until, kind, *data)
            return True
        return False

    def _on_tick(self, node: str, number: int) -> None:
        life = self._running(node, number)
        if life is None or self._deferred(life, "tick", node, number):
            return
        now = life.local(self.t)
        self._refresh_view(life, now)
        life.core.tick(now)
        self._maybe_write(life, now)
        self._after(life, now)
        deadline = life.core.next_deadline()
        due = min(life.real(max(deadline, now)), self.t + 0.05)
        self._schedule(max(due, self.t + 0.001), "tick", node, number)

    def _on_hello(self, node: str, number: int) -> None:
        life = self._running(node, number)
        if life is None or self._deferred(life, "hello", node, number):
            return
        for other in self.ids:
            if other != node:
                self._transmit(life, other, ("hello",))
        self._schedule(self.t + HELLO_EVERY, "hello", node, number)

    def _on_deliver(self, sender: str, receiver: tuple[str, int], message) -> None:
        # As node links: a message meant for one life never reaches a later one.
        life = self._running(*receiver)
        if life is None:
            return
        if self._deferred(life, "deliver", sender, receiver, message):
            return
        now = life.local(self.t)
        life.heard[sender] = now
        self._refresh_view(life, now)
        if message != ("hello",):
            life.core.receive(sender, message, now)
            self._after(life, now)

    def _on_probe(self) -> None:
        for life in self.lives.values():
            if life is None or self.t < life.paused_until:
                continue
            now = life.local(self.t)
            key = (life.node, life.number)
            for slot in life.core.acting_slots(now):
                term = self._open.get((slot, key))
                if term is None:
                    self.violations.append(f"{self.t:.3f}: {key} acts for {slot} ungained")
                    continue
                if term.first is None:
                    term.first = self.t
                term.last = self.t
                for other in self.terms[slot]:
                    if other is not term and other.first is not None and other.last >= term.first:
                        self.violations.append(
                            f"{self.t:.3f}: slot {slot} acted by {key} since {term.first:.3f} "
                            f"and by {other.life} from {other.first:.3f} to {other.last:.3f}"
                        )
        self._schedule(self.t + PROBE_EVERY, "probe")

    # -- internals --------------------------------------------------------------------------

    def _unknown_seeds(self, life: Life) -> int:
        """Its seeds that are no member it knows of (`Membership.unknown_seeds`): neither one it
        heard from nor a voter it was told of; a forgotten member is known as such."""
        if not life.seeded:
            return 0
        voters = set(life.view[1]) if life.view else set()
        return len(set(self.ids) - {life.node} - life.known - voters - self.forgotten)

    def _refresh_view(self, life: Life, now: float) -> None:
        live = {life.node: life.number}
        for member, heard in life.heard.items():
            if now - heard <= self.down_after:
                other = self.lives.get(member)
                live[member] = other.number if other is not None else 0
        life.known.update(live)
        voters = sorted(life.known) if self.known_voters else self.ids
        voters = [member for member in voters if member not in self.forgotten]
        view = (tuple(sorted(live)), tuple(voters))
        if view != life.view:
            life.view = view
            life.core.members_changed(live, voters, now)
            life.core.unknown_seeds(self._unknown_seeds(life))
        # What gossip would tell it of the departures, at once: every running life's claims.
        claims = [
            c for other in self.lives.values() if other is not None for c in other.core.claims()
        ]
        departures = (self._departed, frozenset(unsettled(self._departed, claims)))
        if departures != life.departures:
            life.departures = departures
            life.core.departures_changed(*departures, now)
        # As `Membership.knows_the_cluster`, every other node being a seed: this life heard
        # from each of them.
        if set(self.ids) - {life.node} <= life.heard.keys():
            life.core.knows_the_voters(now)

    def _maybe_write(self, life: Life, now: float) -> None:
        acting = life.core.acting_slots(now)
        if not acting or self.rng.random() < 0.5:
            return
        slot = self.rng.choice(acting)
        key = next(self._keys)
        record = PeerRecord(key, 1e9, 0.0, {}, None, 0, {}, {}, 1, 0)
        life.core.write(slot, [record], [], now)
        life.core.gate.hold((slot, key))
        self.writes += 1

    def _after(self, life: Life, now: float) -> None:
        core = life.core
        for event in core.events():
            me = (life.node, life.number)
            if isinstance(event, Gained):
                self.gains += 1
                keys = {record.key for record in event.records}
                missing = self.committed[event.slot] - keys
                if missing:
                    self.violations.append(
                        f"{self.t:.3f}: {me} gained slot {event.slot} without committed "
                        f"writes {sorted(missing)[:5]}"
                    )
                term = Term(me, self.t)
                self.terms[event.slot].append(term)
                self._open[event.slot, me] = term
            elif isinstance(event, Lost):
                term = self._open.pop((event.slot, me), None)
                if term is not None:
                    term.ended = True
        for slot, key in core.gate.released():  # after the events: they came first
            self.committed[slot].add(key)
        core.gate.failed()
        for member, message in core.outbox():
            self._transmit(life, member, message)

    def _transmit(self, life: Life, member: str, message) -> None:
        receiver = self.lives.get(member)
        if receiver is None or (life.node, member) in self.cut or self.rng.random() < self.loss:
            return
        copies = 2 if self.rng.random() < self.duplicate else 1
        pair = ((life.node, life.number), member)
        slow = self.slow.get((life.node, member), 0.0)
        for _ in range(copies):
            late = self.t + slow + self.rng.uniform(0.0005, 0.02)
            due = max(late, self._due.get(pair, 0.0))
            self._due[pair] = due
            self._schedule(due, "deliver", life.node, (member, receiver.number), message)

    def run_until_ready(self, limit: float = 20.0) -> float:
        """Run until every running life is ready (at most `limit` seconds); how long it took."""
        start = self.t
        while self.t < start + limit and not all(
            life is None or life.core.ready for life in self.lives.values()
        ):
            self.run_until(self.t + 0.05)
        return self.t - start

    def acting(self) -> list[tuple[str, int]]:
        """(node, slot) for each slot a running life acts for now, by node."""
        return [
            (node, slot)
            for node, life in self.lives.items()
            if life is not None
            for slot in life.core.acting_slots(life.local(self.t))
        ]

    def write_one(self, node: str, slot: int) -> int:
        """`node`, acting for `slot`, writes one record, held back until committed; its key."""
        life = self.lives[node]
        assert life is not None
        now = life.local(self.t)
        key = 10**9 + next(self._keys)
        life.core.write(slot, [PeerRecord(key, 1e9, 0.0, {}, None, 0, {}, {}, 1, 0)], [], now)
        life.core.gate.hold((slot, key))
        self._after(life, now)
        return key

    def run_until_committed(self, slot: int, key: int, limit: float = 3 * LEASE) -> None:
        end = self.t + limit
        while key not in self.committed[slot] and self.t < end:
            self.run_until(self.t + 0.001)

    # -- after the faults -------------------------------------------------------------------

    def serving(self) -> list[int]:
        """The slots no running life acts for now."""
        acting = set()
        for life in self.lives.values():
            if life is not None and self.t >= life.paused_until:
                acting.update(life.core.acting_slots(life.local(self.t)))
        return [slot for slot in range(SLOTS) if slot not in acting]


def random_run(seed: int, nodes: int = 3, faults: int = 12) -> Model:
    """A run of `seed`: boot, random faults one after another (each once the last one's
    restarted life is ready: until then its memory is still lost), heal, settle."""
    model = Model(seed, nodes)
    rng = random.Random(seed ^ 0x5EED)
    model.run_until(5.0)
    for _ in range(faults):
        model.run_until_ready()
        kind = rng.choice(["crash", "pause", "partition", "one_way", "lossy", "long_pause"])
        victim = rng.choice(model.ids)
        lasting = rng.uniform(0.2, 4.0)
        if kind == "crash":
            model.crash(victim)
            model.run_until(model.t + lasting)
            model.start(victim)
        elif kind in ("pause", "long_pause"):
            model.pause(victim, lasting if kind == "pause" else 3 * LEASE + lasting)
            model.run_until(model.t + lasting)
        elif kind in ("partition", "one_way"):
            for other in model.ids:
                if other != victim:
                    model.partition(victim, other, both_ways=kind == "partition")
            model.run_until(model.t + lasting)
            model.heal()
        else:
            model.loss, model.duplicate = 0.2, 0.2
            model.run_until(model.t + lasting)
            model.loss, model.duplicate = 0.0, 0.0
        model.run_until(model.t + rng.uniform(0.5, 3.0))
    model.heal()
    model.run_until(model.t + 15.0)
    return model


def overlapping_run(seed: int, nodes: int = 5, bursts: int = 10) -> Model:
    """A run of `seed` whose faults overlap: bursts of several at once on different members, a
    minority of them (a member counts as failed from its crash until its new life is ready):
    crashes restarted within half a second, pauses, cuts one way and both ways of some of a
    member's links, slow links (a third of a lease each way), and loss with repeats. Between
    bursts everything heals and the restarted lives recover."""
    model = Model(seed, nodes)
    rng = random.Random(seed ^ 0x0FA17)
    model.run_until(5.0)
    minority = (nodes - 1) // 2
    for _ in range(bursts):
        model.run_until_ready()
        for victim in rng.sample(model.ids, rng.randint(1, minority)):
            kind = rng.choice(["crash", "pause", "cut", "one_way", "slow", "lossy"])
            others = rng.sample([o for o in model.ids if o != victim], rng.randint(1, nodes - 1))
            if kind == "crash":
                model.crash(victim)
                model.run_until(model.t + rng.uniform(0.0, 0.5))
                model.start(victim)
            elif kind == "pause":
                model.pause(victim, rng.uniform(0.2, 3 * LEASE))
            elif kind in ("cut", "one_way"):
                for other in others:
                    model.partition(victim, other, both_ways=kind == "cut")
            elif kind == "slow":
                for other in others:
                    model.slow_down(victim, other, rng.uniform(0.25, 0.35) * LEASE)
            else:
                model.loss, model.duplicate = 0.2, 0.2
            model.run_until(model.t + rng.uniform(0.0, 0.7))
        model.run_until(model.t + rng.uniform(0.2, 3.0))
        model.heal()
        model.loss = model.duplicate = 0.0
    model.heal()
    model.run_until(model.t + 15.0)
    return model


def restart_behind_a_slow_quorum(seed: int, pick: int = 0) -> tuple[Model, int, int]:
    """Issue 38's five-node schedule, two faults at once: owner O is cut from B and D and its
    link to C is slow (0.3 s each way, against a lease of 1 s). O writes; the moment X's
    acceptance is back at O, X crashes and starts again, and O-X is cut. X's new life asks B,
    C and D for their copies before the write reaches C; then C accepts it, and O counts {O,
    X's old life, C}: committed. Then O is cut from C too, and X (named by the ring for the
    slot once O is gone) takes it with B and D, none of which holds the write. Returns the
    model, the slot and the key of the write."""
    model = Model(seed, nodes=5, skew=0.0)
    model.run_until(5.0)
    o, slot = model.acting()[pick % len(model.acting())]
    others = sorted(set(model.ids) - {o})
    x = slot_owners(Ring(others))[slot]
    c, b, d = [m for m in others if m != x]
    model.partition(o, b)
    model.partition(o, d)
    model.slow_down(o, c, 0.3 * LEASE)
    model.run_until(model.t + 0.5)  # B's and D's lease promises to O run out
    key = model.write_one(o, slot)
    owner = model.lives[o]
    assert owner is not None
    writer = owner.core.leases.owned[slot].writer
    assert writer is not None
    while writer._held.get(x, 0) < writer.version:
        model.run_until(model.t + 0.0005)
    model.crash(x)
    model.partition(o, x)
    model.start(x)
    model.run_until_committed(slot, key)
    model.run_until(model.t + 0.1)
    model.partition(o, c)
    model.run_until(model.t + 6 * LEASE)
    model.heal()
    model.run_until(model.t + 6 * LEASE)
    return model, slot, key


def forget_then_crash(seed: int, pick: int = 0) -> tuple[Model, int, int]:
    """A departure, then a crash (docs/cluster.md): five members; A and B are cut from the
    owner O of a slot, so O's write is committed by O, X and F. F dies and is forgotten; X
    crashes and starts again, cut from O. Two memories of five are lost, and O still holds
    the write; but the voters are four, so X's new life reads two others, A and B. Then O is
    cut off from everyone, and a quorum of {X, A, B} takes the slot. Returns the model, the
    slot and the key of the write."""
    model = Model(seed, nodes=5, skew=0.0)
    model.run_until(5.0)
    o, slot = model.acting()[pick % len(model.acting())]
    x, f, a, b = [m for m in model.ids if m != o]
    model.partition(o, a)
    model.partition(o, b)
    model.run_until(model.t + 0.5)
    key = model.write_one(o, slot)
    model.run_until_committed(slot, key)
    model.forget(f)
    model.run_until(model.t + 0.2)
    model.crash(x)
    model.partition(o, x)
    model.start(x)
    model.run_until(model.t + 6 * LEASE)
    model.heal()
    model.run_until(model.t + 6 * LEASE)
    return model, slot, key
