"""Property tests of the semaphore core against an independent, deliberately naive model.

A hypothesis state machine drives `SemaphoreCore` with random operations (new_peer, acquire with any
count and level, release_lock, release_peer, heartbeat, expire with the clock moving, restore) and
runs the same operations on `Model`, which keeps plain lists and dicts and re-derives every sum.
The core is observed only through its public API: return values and exceptions, `events`, `stats`,
`remainder`, `is_acquired`, `peer_ids`, `next_deadline`.

The model predicts each operation's answer from THROTTLE_API.md's check order. Grants are not
predicted but checked: every `LockGranted` must be for the oldest live waiter of its semaphore and
must fit the free room at that moment, and after every step no head waiter may fit the free room.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from sluicegate.cluster.errors import (
    AlreadyPending,
    InvalidLockCount,
    LockHierarchyViolation,
    LockNeverAcquirable,
    RestoreConflict,
    ShrinkingLockCount,
    UnknownPeer,
    UnknownSemaphore,
)
from sluicegate.cluster.semaphores import (
    LockGranted,
    PeerRemoved,
    SemaphoreConfig,
    SemaphoreCore,
)

CONFIG = {
    "A": SemaphoreConfig(max=3, level=0),
    "B": SemaphoreConfig(max=5, level=1),
    "C": SemaphoreConfig(max=1, level=2),
}
NAMES = sorted(CONFIG)
UNKNOWN_PEER = 999  # restore ids are drawn from 1..6, random ids are 64-bit: never this one

# Mostly valid input, so that locks are held and waited for; now and then an invalid one.
semaphore_names = st.sampled_from([*NAMES, *NAMES, *NAMES, "Z"])  # Z is not configured
counts = st.one_of(
    st.integers(min_value=1, max_value=2),
    st.integers(min_value=1, max_value=3),
    st.integers(min_value=1, max_value=5),
    st.integers(min_value=-1, max_value=6),
)
ttls = st.sampled_from([2.0, 5.0, 10.0, 20.0])
peer_choices = st.integers(min_value=0, max_value=1_000)


@dataclass
class ModelPeer:
    deadline: float
    held: dict[str, int] = field(default_factory=dict)
    pending: str | None = None
    restored: bool = False  # holds locks that were never checked against max


@dataclass
class Waiter:
    peer_id: int
    count: int
    since: float


class Model:
    def __init__(self) -> None:
        self.peers: dict[int, ModelPeer] = {}
        self.queues: dict[str, list[Waiter]] = {name: [] for name in NAMES}

    def held_sum(self, name: str) -> int:
        return sum(p.held.get(name, 0) for p in self.peers.values())

    def pending_sum(self, name: str) -> int:
        return sum(w.count for w in self.queues[name])

    def room(self, name: str) -> int:
        return CONFIG[name].max - self.held_sum(name)

    def withdraw(self, peer_id: int) -> None:
        peer = self.peers[peer_id]
        if peer.pending is not None:
            queue = self.queues[peer.pending]
            (index,) = [i for i, w in enumerate(queue) if w.peer_id == peer_id]
            del queue[index]
            peer.pending = None

    def remove(self, peer_id: int) -> None:
        self.withdraw(peer_id)
        del self.peers[peer_id]

    def grant(self, event: LockGranted) -> None:
        """Apply a grant the core reported, after checking it is the one strict FIFO allows."""
        queue = self.queues[event.semaphore]
        assert queue, f"{event} but nobody waits for {event.semaphore}"
        head = queue[0]
        assert (event.peer_id, event.count) == (head.peer_id, head.count), (
            f"{event} overtakes the oldest waiter {head}"
        )
        assert event.count <= self.room(event.semaphore), f"{event} does not fit"
        queue.pop(0)
        peer = self.peers[event.peer_id]
        assert peer.pending == event.semaphore
        peer.pending = None
        peer.held[event.semaphore] = event.count


class SemaphoreMachine(RuleBasedStateMachine):
    @initialize(seed=st.integers(min_value=0, max_value=2**32 - 1))
    def start(self, seed: int) -> None:
        self.core = SemaphoreCore(CONFIG)
        self.model = Model()
        self.rng = random.Random(seed)
        self.now = 0.0
        self.known: list[int] = []  # every id ever seen, live or not, in order of appearance

    # -- helpers ---------------------------------------------------------------------------------

    def pick(self, choice: int) -> int:
        """Mostly a live peer; now and then a gone one, or one the core never saw."""
        live = [pid for pid in self.known if pid in self.model.peers]
        gone = [pid for pid in self.known if pid not in self.model.peers]
        if choice % 13 == 12 or not self.known:
            return UNKNOWN_PEER
        if gone and (choice % 5 == 4 or not live):
            return gone[choice % len(gone)]
        return live[choice % len(live)]

    def remember(self, peer_id: int) -> None:
        if peer_id not in self.known:
            self.known.append(peer_id)

    def drain(self, removed: list[int] | None = None, expired: bool = False) -> None:
        """Apply the core's events to the model; PeerRemoved must be exactly `removed`, in order."""
        seen = []
        for event in self.core.events():
            if isinstance(event, PeerRemoved):
                assert event.expired is expired, event
                assert event.peer_id in self.model.peers, event
                seen.append(event.peer_id)
                self.model.remove(event.peer_id)
            else:
                assert isinstance(event, LockGranted), event
                self.model.grant(event)
        assert seen == (removed or [])

    def call(self, func, *args, **kwargs):
        """Run a core operation; returns ("ok", value) or ("err", exception)."""
        try:
            return "ok", func(*args, **kwargs)
        except (
            AlreadyPending,
            InvalidLockCount,
            LockHierarchyViolation,
            LockNeverAcquirable,
            RestoreConflict,
            ShrinkingLockCount,
            UnknownPeer,
            UnknownSemaphore,
        ) as exc:
            return "err", exc

    # -- rules -----------------------------------------------------------------------------------

    @rule(ttl=ttls)
    def new_peer(self, ttl: float) -> None:
        peer_id = self.core.new_peer(self.now + ttl, self.rng)
        assert 0 <= peer_id < 2**64
        assert peer_id not in self.model.peers
        self.model.peers[peer_id] = ModelPeer(self.now + ttl)
        self.remember(peer_id)
        self.drain()

    @rule(
        choice=peer_choices,
        name=semaphore_names,
        count=counts,
        expires_in=st.none() | ttls,
    )
    def acquire(self, choice: int, name: str, count: int, expires_in: float | None) -> None:
        self.do_acquire(self.pick(choice), name, count, expires_in)

    def do_acquire(self, peer_id: int, name: str, count: int, expires_in: float | None) -> None:
        expected = self.predict_acquire(peer_id, name, count, expires_in)
        outcome = self.call(self.core.acquire, peer_id, name, count, self.now, expires_in)
        if expected[0] == "err":
            assert outcome[0] == "err", (outcome, expected)
            exc = outcome[1]
            assert type(exc) is expected[1], (exc, expected)
            assert exc.args == expected[2], (exc.args, expected)
        else:
            assert outcome == ("ok", expected[1]), (outcome, expected)
        self.drain()

    @precondition(lambda self: self.model.peers)
    @rule(choice=peer_choices, name=st.sampled_from(NAMES), data=st.data())
    def acquire_valid(self, choice: int, name: str, data) -> None:
        """A live peer asks for a count that can be granted some day: the interesting case."""
        count = data.draw(st.integers(min_value=1, max_value=CONFIG[name].max))
        self.do_acquire(self.pick(choice), name, count, None)

    def descenders(self) -> list[int]:
        """Live peers that hold locks, wait for none, and may still go down a level."""
        return sorted(
            pid
            for pid, p in self.model.peers.items()
            if p.held and p.pending is None and min(CONFIG[n].level for n in p.held) > 0
        )

    @precondition(lambda self: self.descenders())
    @rule(data=st.data())
    def descend(self, data) -> None:
        """A peer holding locks asks for one of a lower level, as the level rule allows; when it
        has to wait, it waits while holding locks."""
        peer_id = data.draw(st.sampled_from(self.descenders()))
        lowest = min(CONFIG[n].level for n in self.model.peers[peer_id].held)
        name = data.draw(st.sampled_from([n for n in NAMES if CONFIG[n].level < lowest]))
        count = data.draw(st.integers(min_value=1, max_value=CONFIG[name].max))
        self.do_acquire(peer_id, name, count, None)

    @rule(name=st.sampled_from(NAMES), data=st.data())
    def crowd(self, name: str, data) -> None:
        """Several new peers ask for the same semaphore one after the other: queues form."""
        asks = data.draw(
            st.lists(st.integers(min_value=1, max_value=CONFIG[name].max), min_size=2, max_size=4)
        )
        for count in asks:
            peer_id = self.core.new_peer(self.now + 20.0, self.rng)
            assert peer_id not in self.model.peers
            self.model.peers[peer_id] = ModelPeer(self.now + 20.0)
            self.remember(peer_id)
            self.do_acquire(peer_id, name, count, None)

    @precondition(lambda self: any(p.held for p in self.model.peers.values()))
    @rule(data=st.data())
    def release_held(self, data) -> None:
        holders = sorted(pid for pid, p in self.model.peers.items() if p.held)
        peer_id = data.draw(st.sampled_from(holders))
        name = data.draw(st.sampled_from(sorted(self.model.peers[peer_id].held)))
        self.core.release_lock(peer_id, name)
        del self.model.peers[peer_id].held[name]
        self.drain()

    def predict_acquire(self, peer_id: int, name: str, count: int, expires_in: float | None):
        """THROTTLE_API.md's acquire check order, applied to the model (mutating it on success)."""
        model = self.model
        if name not in CONFIG:
            return "err", UnknownSemaphore, (name,)
        cfg = CONFIG[name]
        if count > cfg.max:
            return "err", LockNeverAcquirable, (count, cfg.max)
        if expires_in is not None:
            if peer_id not in model.peers:
                return "err", UnknownPeer, (peer_id,)
            model.peers[peer_id].deadline = self.now + expires_in
        if count < 1:
            return "err", InvalidLockCount, (count,)
        if peer_id not in model.peers:
            return "err", UnknownPeer, (peer_id,)
        peer = model.peers[peer_id]
        previous = peer.held.get(name)
        if previous is None and peer.pending == name:
            (previous,) = [w.count for w in model.queues[name] if w.peer_id == peer_id]
        if previous is not None:
            if count == previous:
                return "ok", peer.pending is None
            if count < previous:
                return "err", ShrinkingLockCount, ()
            return "err", LockHierarchyViolation, (cfg.level, cfg.level)
        if peer.held:
            current = min(CONFIG[n].level for n in peer.held)
            if current <= cfg.level:
                return "err", LockHierarchyViolation, (current, cfg.level)
        if peer.pending is not None:
            return "err", AlreadyPending, ()
        if model.held_sum(name) + model.pending_sum(name) + count <= cfg.max:
            peer.held[name] = count
            return "ok", True
        peer.pending = name
        model.queues[name].append(Waiter(peer_id, count, self.now))
        return "ok", False

    @rule(choice=peer_choices, name=semaphore_names)
    def release_lock(self, choice: int, name: str) -> None:
        peer_id = self.pick(choice)
        outcome = self.call(self.core.release_lock, peer_id, name)
        if name not in CONFIG:
            assert outcome[0] == "err" and type(outcome[1]) is UnknownSemaphore, outcome
        elif peer_id not in self.model.peers:
            assert outcome[0] == "err" and type(outcome[1]) is UnknownPeer, outcome
            assert outcome[1].peer_id == peer_id
        else:
            assert outcome == ("ok", None), outcome
            peer = self.model.peers[peer_id]
            if name in peer.held:
                del peer.held[name]
            elif peer.pending == name:
                self.model.withdraw(peer_id)
        self.drain()

    @rule(choice=peer_choices)
    def release_peer(self, choice: int) -> None:
        peer_id = self.pick(choice)
        present = peer_id in self.model.peers
        assert self.core.release_peer(peer_id) is present
        self.drain(removed=[peer_id] if present else [])

    @rule(choice=peer_choices, ttl=ttls)
    def heartbeat(self, choice: int, ttl: float) -> None:
        peer_id = self.pick(choice)
        outcome = self.call(self.core.heartbeat, peer_id, self.now + ttl)
        if peer_id in self.model.peers:
            assert outcome == ("ok", None), outcome
            self.model.peers[peer_id].deadline = self.now + ttl
        else:
            assert outcome[0] == "err" and type(outcome[1]) is UnknownPeer, outcome
        self.drain()

    @rule(step=st.sampled_from([0.0, 0.5, 1.0, 3.0]))
    def expire(self, step: float) -> None:
        self.now += step
        due = {pid for pid, p in self.model.peers.items() if p.deadline <= self.now}
        expired = self.core.expire(self.now)
        assert set(expired) == due
        assert len(expired) == len(due)
        self.drain(removed=expired, expired=True)
        assert all(p.deadline > self.now for p in self.model.peers.values())

    @rule(
        target_id=st.integers(min_value=1, max_value=6) | peer_choices.map(lambda c: -c - 1),
        acquired=st.dictionaries(
            semaphore_names, st.integers(min_value=1, max_value=3) | counts, max_size=2
        ),
        ttl=ttls,
    )
    def restore(self, target_id: int, acquired: dict[str, int], ttl: float) -> None:
        # Small positive ids are fresh (or earlier restores); negative picks an id already seen.
        peer_id = target_id if target_id > 0 else self.pick(-target_id - 1)
        if peer_id == UNKNOWN_PEER:
            peer_id = target_id if target_id > 0 else 6
        outcome = self.call(self.core.restore, peer_id, acquired, self.now + ttl)
        existing = self.model.peers.get(peer_id)
        unknown = [n for n in acquired if n not in CONFIG]
        invalid = [c for c in acquired.values() if c < 1]
        if unknown:
            assert outcome[0] == "err" and type(outcome[1]) is UnknownSemaphore, outcome
            assert outcome[1].semaphore in unknown
        elif invalid:
            assert outcome[0] == "err" and type(outcome[1]) is InvalidLockCount, outcome
            assert outcome[1].count in invalid
        elif existing is not None:
            if existing.pending is None and existing.held == acquired:
                assert outcome == ("ok", None), outcome  # deadline untouched
            else:
                assert outcome[0] == "err" and type(outcome[1]) is RestoreConflict, outcome
        else:
            assert outcome == ("ok", None), outcome
            self.model.peers[peer_id] = ModelPeer(
                self.now + ttl, dict(acquired), restored=bool(acquired)
            )
            self.remember(peer_id)
        self.drain()

    def asked(self) -> list[tuple[int, str, int]]:
        """Every (peer, semaphore, count) a live peer holds or waits for, within max (a restored
        count beyond max fails the count > max check before anything else)."""
        result = [
            (pid, name, count)
            for pid, peer in self.model.peers.items()
            for name, count in peer.held.items()
            if count <= CONFIG[name].max
        ]
        result += [(w.peer_id, name, w.count) for name, q in self.model.queues.items() for w in q]
        return sorted(result)

    def held_while_waiting(self) -> list[tuple[int, str, int]]:
        return [
            (pid, name, count)
            for pid, name, count in self.asked()
            if self.model.peers[pid].pending not in (None, name)
        ]

    @precondition(lambda self: self.asked())
    @rule(data=st.data())
    def ask_again(self, data) -> None:
        """A peer repeats an acquire (as the client does while polling): the same answer again,
        by the peer-wide flag, and nothing moves."""
        self.repeat(*data.draw(st.sampled_from(self.asked())))

    @precondition(lambda self: self.held_while_waiting())
    @rule(data=st.data())
    def ask_again_for_held_while_waiting(self, data) -> None:
        """Asking again for a held lock while another one waits answers False."""
        self.repeat(*data.draw(st.sampled_from(self.held_while_waiting())))

    def repeat(self, peer_id: int, name: str, count: int) -> None:
        expected = self.model.peers[peer_id].pending is None
        before = self.asked(), {n: [w.peer_id for w in q] for n, q in self.model.queues.items()}
        assert self.core.acquire(peer_id, name, count, self.now) is expected
        self.drain()
        after = self.asked(), {n: [w.peer_id for w in q] for n, q in self.model.queues.items()}
        assert after == before

    # -- invariants, checked after every step ----------------------------------------------------

    @invariant()
    def counts_agree(self) -> None:
        stats = {s.name: s for s in self.core.stats(self.now)}
        assert sorted(stats) == NAMES
        for name in NAMES:
            cfg = CONFIG[name]
            held = self.model.held_sum(name)
            s = stats[name]
            # Released counts are never lost, nor counted twice.
            assert self.core.remainder(name) == cfg.max - held
            assert s.acquired == held
            assert s.max == cfg.max
            assert s.pending == self.model.pending_sum(name)
            queue = self.model.queues[name]
            assert s.longest_pending == (self.now - queue[0].since if queue else 0.0)
            # Only restores may push a semaphore past its max.
            if not any(p.restored and name in p.held for p in self.model.peers.values()):
                assert s.acquired <= cfg.max, s
            # Locks granted by acquire never exceed max, whatever restores added beside them.
            checked = sum(p.held.get(name, 0) for p in self.model.peers.values() if not p.restored)
            assert checked <= cfg.max, (name, checked)

    @invariant()
    def no_waiter_that_fits_is_left_waiting(self) -> None:
        for name in NAMES:
            queue = self.model.queues[name]
            if queue:
                assert queue[0].count > self.model.room(name), (name, queue[0])

    @invariant()
    def peers_agree(self) -> None:
        assert sorted(self.core.peer_ids()) == sorted(self.model.peers)
        for peer_id, peer in self.model.peers.items():
            assert self.core.has_peer(peer_id)
            assert self.core.is_acquired(peer_id) is (peer.pending is None)
        deadlines = [p.deadline for p in self.model.peers.values()]
        assert self.core.next_deadline() == (min(deadlines) if deadlines else None)
        assert self.core.events() == []


SemaphoreMachine.TestCase.settings = settings(
    max_examples=200,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestSemaphoreMachine = SemaphoreMachine.TestCase
