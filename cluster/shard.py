"""One node's share of the semaphores in a cluster: the slots it acts for (`cluster/ownership.py`),
the peers homed in them (`cluster/home.py`) and the semaphores owned in them
(`cluster/owner.py`), joined by messages (`cluster/lock_messages.py`).

Events in, effects out, in the manner of h11: `submit` takes a client's operation, `receive` a
message from another node, `tick` the passing of time; `answers()`, `outbox()` and
`slot_changes()` say what to do. Three rules make it safe (docs/cluster.md):

* an operation on a peer or semaphore is applied only while this node acts for its slot
  (else `NotServing`, which is 503);
* every change is written to the slot's acceptors, and nothing that follows it (an answer, a
  message, even one to this node's own home or owner) leaves before the write is committed
  (`CommitGate`); what a lost slot's uncommitted writes held back fails instead (503);
* the answer to an acquire, a release, a peer's deletion or a heartbeat that ends its peer
  waits until the releases of the peer's locks are confirmed by their owners, so that whatever
  the client asks next, through any node, sees them.

Acquires that wait (`block_for`, or only for a remote owner's first answer) park here until their
peer holds all its locks, fails, moves, or the time is up. An acquire or a read of a peer that
settles (`Home.settling`: its slot gained while it asked for a lock) waits, unapplied, until the
owner has answered for that lock.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import cast

from .errors import NotServing, NotServingCutOff, SemaphoreError, UnknownPeer, UnknownSemaphore
from .home import Confirmed, Granted, Home, Queued, Removed, Settled
from .limits import DEFAULT_LIMITS, Limits
from .lock_messages import (
    Audit,
    HomeToOwner,
    LockAnswer,
    LockRefused,
    LockReleased,
    LockRequest,
    LockRestore,
)
from .owner import Owner
from .ownership import Gained, Lost, Ownership
from .ownership import Message as OwnershipMessage
from .parked import STOP_CHUNK, ParkedAcquires
from .peers import PeerRecord
from .replication import Record
from .ring import peer_key, semaphore_key
from .semaphore_leases import SemaphoreConfig, SemaphoreStats
from .semaphore_ops import (
    Acquire,
    AcquireOutcome,
    Heartbeat,
    IsAcquired,
    ListPeers,
    NewPeer,
    Operation,
    ReleaseLock,
    ReleasePeer,
    Remainder,
    Restore,
)
from .slots import Ballot, slot_of

NOT_YET = AcquireOutcome(False)


@dataclass(frozen=True)
class Answer:
    """The answer to the client's request `request_id`: `result`, or `error`."""

    request_id: int
    result: object = None
    error: SemaphoreError | None = None


@dataclass(frozen=True)
class SlotGained:
    slot: int
    ballot: Ballot
    previous: Ballot
    cold: bool


@dataclass(frozen=True)
class SlotLost:
    slot: int
    ballot: Ballot
    resigned: bool


SlotChange = SlotGained | SlotLost


@dataclass
class _Send:
    member: str
    message: object


@dataclass
class _Reply:
    peer_id: int | None
    answer: Answer


@dataclass
class _Step:
    """What one step produced, to hold behind its writes."""

    items: list = field(default_factory=list)


class Shard:
    def __init__(
        self,
        me: str,
        semaphores: Mapping[str, SemaphoreConfig],
        ownership: Ownership,
        rng: random.Random,
        *,
        cold_start_grace: float = 0.0,
        limits: Limits = DEFAULT_LIMITS,
    ) -> None:
        self.me = me
        self.ownership = ownership
        self._config = dict(semaphores)
        self._rng = rng
        self._semaphore_slot = {name: slot_of(semaphore_key(name)) for name in semaphores}
        self._slot_semaphores: dict[int, list[str]] = defaultdict(list)
        for name, slot in self._semaphore_slot.items():
            self._slot_semaphores[slot].append(name)
        self.home = Home(semaphores, owner_of=self._owner_of_semaphore, limits=limits)
        self._limits = limits
        self.owner = Owner(semaphores, home_of=self._home_of, cold_start_grace=cold_start_grace)
        self._parked = ParkedAcquires()
        # Per settling peer, the operations that wait for it to settle by request id, oldest
        # first; the peer of each; and those of peers settled, to apply at the end of the step.
        self._unsettled: dict[int, dict[int, Operation]] = {}
        self._unsettled_peer: dict[int, int] = {}
        self._settled: list[tuple[int, Operation]] = []
        # Answers about a peer that wait for the confirmation of its releases.
        self._held_for: dict[int, list[Answer]] = {}
        self._answers: list[Answer] = []
        self._outbox: list[tuple[str, object]] = []
        self._changes: list[SlotChange] = []
        self._local: list[object] = []
        self._step = _Step()
        self._blocking = True
        self._now = -math.inf

    # -- placement --------------------------------------------------------------------------

    @property
    def semaphore_names(self) -> Mapping[str, int]:
        """The configured semaphores (with their slots)."""
        return self._semaphore_slot

    def home_of(self, peer_id: int, now: float) -> str | None:
        """Where a peer's operations go now (see `Ownership.actor_of`)."""
        return self.ownership.actor_of(slot_of(peer_key(peer_id)), now)

    def owner_of(self, semaphore: str, now: float) -> str | None:
        """Where a semaphore's requests go now."""
        return self.ownership.actor_of(self._semaphore_slot[semaphore], now)

    def serves_peer(self, peer_id: int, now: float) -> bool:
        return self.ownership.acting(slot_of(peer_key(peer_id)), now)

    def serves_semaphore(self, name: str, now: float) -> bool:
        return self.ownership.acting(self._semaphore_slot[name], now)

    def _home_of(self, peer_id: int) -> str | None:
        return self.ownership.actor_of(slot_of(peer_key(peer_id)), self._now)

    def _owner_of_semaphore(self, name: str) -> str | None:
        return self.ownership.actor_of(self._semaphore_slot[name], self._now)

    # -- inputs -----------------------------------------------------------------------------

    def submit(self, request_id: int, op: Operation, now: float) -> None:
        """Apply a client's operation; its answer comes out of `answers()`, maybe later."""
        self._begin(now)
        self._submit(request_id, op, now)
        self._end(now)

    def _submit(self, request_id: int, op: Operation, now: float) -> None:
        if isinstance(op, (Acquire, IsAcquired)) and self.home.settling(op.peer_id):
            self._unsettled.setdefault(op.peer_id, {})[request_id] = op
            self._unsettled_peer[request_id] = op.peer_id
            return
        try:
            if isinstance(op, Acquire):
                self._limits.make_room_to_wait(
                    op, self._parked.count_of(op.peer_id), len(self._parked)
                )
            result = self._apply(op, now)
        except SemaphoreError as error:
            self._reply(self._waits_for_releases(op), Answer(request_id, error=error))
        else:
            if isinstance(op, Acquire):
                self._acquired(request_id, op, cast("bool | None", result), now)
            else:
                self._reply(self._waits_for_releases(op), Answer(request_id, result))

    def _waits_for_releases(self, op: Operation) -> int | None:
        """The peer whose releases the answer to `op` waits for (see the module), if any.

        A heartbeat that leaves its peer alive waits for none: it released nothing, and its
        answer tells the client only that its lease runs on. Held behind a release of an
        earlier operation, it would wait on the one link between the home and that lock's
        owner, and a clog of that link alone would lose a lease a majority could keep
        (five-node seed 379641930)."""
        if isinstance(op, (Acquire, ReleaseLock, ReleasePeer)):
            return op.peer_id
        if isinstance(op, Heartbeat) and (
            op.expires_in <= 0 or not self.home.peers.has_peer(op.peer_id)
        ):
            return op.peer_id
        return None

    def withdraw(self, request_id: int) -> None:
        """Forget a waiting acquire whose asker has gone: it is never answered."""
        self._parked.withdraw(request_id)
        peer_id = self._unsettled_peer.pop(request_id, None)
        if peer_id is not None:
            waiting = self._unsettled[peer_id]
            del waiting[request_id]
            if not waiting:
                del self._unsettled[peer_id]

    def receive(self, sender: str, message: object, now: float) -> None:
        """A message from node `sender`. What it changes is written, and what follows goes out,
        at the next `flush` (so that a frame of messages makes one write per slot)."""
        self._begin(now)
        self._handle(sender, message, now)

    def flush(self, now: float) -> None:
        """Write what changed, and release what the commits allow."""
        self._begin(now)
        self._end(now)

    def tick(self, now: float) -> None:
        """Let time pass: leases, expiry, retries, audits, parked acquires running out."""
        self._begin(now)
        self.home.tick(now)
        self.owner.tick(now)
        for request in self._parked.due(now):
            self._reply(request.op.peer_id, Answer(request.request_id, NOT_YET))
        self._end(now)

    def members_changed(self, live: Mapping[str, int], voters, now: float) -> None:
        self._begin(now)
        self.ownership.members_changed(live, voters, now)
        self._end(now)

    def knows_the_voters(self, now: float) -> None:
        """See `Ownership.knows_the_voters`."""
        self._begin(now)
        self.ownership.knows_the_voters(now)
        self._end(now)

    def leave(self, now: float) -> None:
        """Hand every slot on (`Ownership.leave`) and park no acquire any more."""
        while self.stop_blocking(now):
            pass
        self._begin(now)
        self.ownership.leave(now)
        self._end(now)

    def stop_blocking(self, now: float) -> bool:
        """Park no acquire any more (shutting down), and answer up to `STOP_CHUNK` of those
        parked "not yet" now; whether more are left."""
        self._begin(now)
        self._blocking = False
        for request in self._parked.take_first(STOP_CHUNK):
            self._reply(request.op.peer_id, Answer(request.request_id, NOT_YET))
        self._end(now)
        return len(self._parked) > 0

    # -- outputs ----------------------------------------------------------------------------

    def answers(self) -> list[Answer]:
        answers, self._answers = self._answers, []
        return answers

    def outbox(self) -> list[tuple[str, object]]:
        """Messages to other nodes: the ownership's, and what homes and owners say."""
        outbox = [*self.ownership.outbox(), *self._outbox]
        self._outbox = []
        return outbox

    def slot_changes(self) -> list[SlotChange]:
        changes, self._changes = self._changes, []
        return changes

    def next_deadline(self) -> float:
        if self.home.graveyard:
            return -math.inf  # more to free: step again at once
        deadlines = [
            self.ownership.next_deadline(),
            self.home.next_deadline(),
            self.owner.next_deadline(),
            self._parked.next_deadline(),
        ]
        return min(deadlines)

    # -- observation ------------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        return self.ownership.ready

    def stats(self, now: float) -> list[SemaphoreStats]:
        return self.owner.stats(now)

    @property
    def restores_beyond_max(self) -> int:
        return self.owner.leases.restores_beyond_max

    @property
    def waiting_acquires(self) -> int:
        """Acquires parked here until their peer holds its locks (or their time is up)."""
        return len(self._parked)

    def fencing_token(self, peer_id: int, semaphore: str) -> int | None:
        return self.home.peers.token(peer_id, semaphore)

    # -- operations -------------------------------------------------------------------------

    def _apply(self, op: Operation, now: float) -> object:
        home = self.home
        match op:
            case NewPeer(lifetime, key):
                if not self.ownership.acts_for_any(now):
                    raise self._not_serving(f"{self.me} acts for no slot now", now)
                return home.new_peer(
                    now,
                    lifetime,
                    self._rng,
                    lambda peer_id: self.serves_peer(peer_id, now),
                    key,
                )
            case Remainder(name):
                if name not in self._config:
                    raise UnknownSemaphore(name)
                if not self.serves_semaphore(name, now):
                    raise self._not_serving(
                        f"semaphore {name!r} is not served by {self.me} now", now
                    )
                return self.owner.remainder(name)
            case ListPeers(low, high, most):
                return home.peers.peer_ids(low, high, most)
        self._check_home(op.peer_id, now)
        home.expire_if_due(op.peer_id, now)
        match op:
            case Acquire(peer_id, name, count, expires_in, _, number):
                return home.acquire(peer_id, name, count, now, expires_in, number)
            case ReleaseLock(peer_id, name, number):
                home.release_lock(peer_id, name, number, now)
                return None
            case Heartbeat(peer_id, expires_in):
                home.heartbeat(peer_id, now, expires_in)
                return None
            case ReleasePeer(peer_id, number):
                return home.release_peer(peer_id, number, now)
            case IsAcquired(peer_id):
                return home.peers.is_acquired(peer_id)
            case Restore(peer_id, expires_in, acquired, number):
                home.restore(peer_id, acquired, expires_in, number, now)
                return None
        raise TypeError(f"not a semaphore operation: {op!r}")

    def _check_home(self, peer_id: int, now: float) -> None:
        if not self.serves_peer(peer_id, now):
            raise self._not_serving(f"peer {peer_id} is not served by {self.me} now", now)

    def _not_serving(self, reason: str, now: float) -> NotServing:
        """Refusing what this node does not serve; cut off from most members, it says so, and
        whoever forwarded the request here sends the client on (docs/cluster.md, "Routing")."""
        if self.ownership.reaches_quorum(now):
            return NotServing(reason)
        return NotServingCutOff(f"{reason}: its links reach no quorum")

    def _acquired(self, request_id: int, op: Acquire, result: bool | None, now: float) -> None:
        if result:
            self._reply(op.peer_id, Answer(request_id, self._granted(op)))
        elif op.block_for and op.block_for > 0 and self._blocking:
            self._parked.park(request_id, op, now + op.block_for, undecided=False)
        elif result is None and self._blocking:
            self._parked.park(request_id, op, self.home.deciding_until(op.peer_id, now), True)
        else:
            self._reply(op.peer_id, Answer(request_id, NOT_YET))

    def _granted(self, op: Acquire) -> AcquireOutcome:
        return AcquireOutcome(True, self.home.peers.token(op.peer_id, op.semaphore))

    # -- messages ---------------------------------------------------------------------------

    def _handle(self, sender: str, message: object, now: float) -> None:
        if isinstance(message, HomeToOwner):
            if message.semaphore not in self._semaphore_slot:
                # Defined at the home, not here: nodes configured otherwise (members drifted).
                # Left unanswered, the lock waits until its owner defines the semaphore too.
                return
            if self.serves_semaphore(message.semaphore, now):
                self.owner.receive(sender, message, now)
            elif isinstance(message, (LockRequest, LockRestore)):
                self._send(sender, LockRefused(message.peer_id, message.semaphore, message.ticket))
        elif isinstance(message, Audit):
            kept = [
                (peer_id, name, ticket)
                for peer_id, name, ticket in zip(
                    message.peer_ids, message.semaphores, message.tickets, strict=True
                )
                if self.serves_peer(peer_id, now)
            ]
            if kept:
                self.home.receive(sender, Audit(*map(list, zip(*kept, strict=True))), now)
        elif isinstance(message, (LockAnswer, LockRefused, LockReleased)):
            if self.serves_peer(message.peer_id, now):
                self.home.receive(sender, message, now)
        else:
            self._hold(now)
            self.ownership.receive(sender, cast(OwnershipMessage, message), now)

    # -- the step: apply, write, hold back, release ----------------------------------------

    def _begin(self, now: float) -> None:
        self._now = now
        if self.ownership.due(now):
            self._hold(now)
            self.ownership.tick(now)
        self._slot_events(now)

    def _end(self, now: float) -> None:
        self._slot_events(now)
        # Peers whose deadline has come expire, a chunk a step (one a request names, before it
        # is applied: `_apply`).
        self.home.expire(now)
        while True:
            self._slot_events(now)
            self._hold(now)
            self._release()
            if not self._local and not self._settled:
                self.home.graveyard.free()
                return
            local, self._local = self._local, []
            for message in local:
                self._handle(self.me, message, now)
            settled, self._settled = self._settled, []
            for request_id, op in settled:
                self._submit(request_id, op, now)

    def _hold(self, now: float) -> None:
        """What the homes and owners changed becomes writes, and what it caused (answers,
        messages) is held behind them. Before anything that may end this node's acting for a
        slot, too: a slot resigned or lost with a change not written yet would let what the
        change caused go out with no write to hold it back, and the next owner, which never
        heard of the change, would make it again (a grant and its token: seed 973444241)."""
        self._home_events(now)
        for member, message in [*self.home.outbox(), *self.owner.outbox()]:
            self._send(member, message)
        # A home's new lock request goes with the write of its ticket, not after it.
        for member, message in self.home.ahead():
            self._send_now(member, message)
        self._write(now)

    def _slot_events(self, now: float) -> None:
        events = self.ownership.events()
        if not events:
            return
        lost: list[int] = []
        for event in events:
            if isinstance(event, Gained):
                self._lose_peers(lost)  # a slot lost and gained again: the loss first
                lost = []
                peers = [r for r in event.records if isinstance(r, PeerRecord)]
                semaphores = [r for r in event.records if not isinstance(r, PeerRecord)]
                self.home.gain(peers, now)
                names = self._slot_semaphores.get(event.slot, [])
                self.owner.gain(names, semaphores, now, self.ownership.era, event.cold)
                self._changes.append(
                    SlotGained(event.slot, event.ballot, event.previous, event.cold)
                )
            elif isinstance(event, Lost):
                slot = event.slot
                lost.append(slot)
                self.owner.lose(self._slot_semaphores.get(slot, []))
                self._changes.append(SlotLost(slot, event.ballot, event.resigned))
        self._lose_peers(lost)

    def _lose_peers(self, slots: list[int]) -> None:
        """The home serves the peers of `slots` no more; their waiting acquires are answered
        "not yet"."""
        if not slots:
            return
        gone = self.home.lose(slots)
        if self._unsettled:
            reason = "the peer's slot moved to another node while it settled"
            for peer_id in gone:
                for request_id, _ in self._take_unsettled(peer_id):
                    self._reply(peer_id, Answer(request_id, error=NotServing(reason)))
        waiting = self._parked.peers()
        if not waiting:
            return
        for peer_id in [p for p in gone if p in waiting]:
            for request in self._parked.take_peer(peer_id):
                self._reply(peer_id, Answer(request.request_id, NOT_YET))

    def _home_events(self, now: float) -> None:
        for event in self.home.events():
            peer_id = event.peer_id
            if isinstance(event, Granted):
                for request in [
                    r for r in self._parked.of_peer(peer_id) if r.op.semaphore == event.semaphore
                ]:
                    self._parked.take(request)
                    self._reply(peer_id, Answer(request.request_id, self._granted(request.op)))
            elif isinstance(event, Queued):
                for request in [r for r in self._parked.of_peer(peer_id) if r.undecided]:
                    self._parked.take(request)
                    self._reply(peer_id, Answer(request.request_id, NOT_YET))
            elif isinstance(event, Removed):
                for request in self._parked.take_peer(peer_id):
                    self._reply(peer_id, Answer(request.request_id, error=UnknownPeer(peer_id)))
                self._settled.extend(self._take_unsettled(peer_id))
            elif isinstance(event, Settled):
                if event.answered:
                    self._settled.extend(self._take_unsettled(peer_id))
                    continue
                reason = f"the owners of peer {peer_id}'s locks have not said which it holds"
                for request_id, _ in self._take_unsettled(peer_id):
                    self._reply(peer_id, Answer(request_id, error=NotServing(reason)))
            elif isinstance(event, Confirmed):
                self._answers.extend(self._held_for.pop(peer_id, ()))

    def _take_unsettled(self, peer_id: int) -> list[tuple[int, Operation]]:
        """The operations that wait for the peer to settle, taken out, oldest first."""
        waiting = self._unsettled.pop(peer_id, {})
        for request_id in waiting:
            del self._unsettled_peer[request_id]
        return list(waiting.items())

    def _write(self, now: float) -> None:
        """Write every slot changed in this step, then hold what the step produced behind it."""
        records, gone = self.home.changed(now)
        semaphores = self.owner.changed()
        if records or gone or semaphores:
            by_slot: dict[int, tuple[list[Record], list[int | str]]] = defaultdict(lambda: ([], []))
            for record in records:
                by_slot[slot_of(peer_key(record.peer_id))][0].append(record)
            for peer_id in gone:
                by_slot[slot_of(peer_key(peer_id))][1].append(peer_id)
            for name, written, removed in semaphores:
                records_of_slot, gone_of_slot = by_slot[self._semaphore_slot[name]]
                records_of_slot.extend(written)
                gone_of_slot.extend(removed)
            for slot, (changed, dropped) in sorted(by_slot.items()):
                self.ownership.write(slot, changed, dropped, now)
        if self._step.items:
            gate = self.ownership.gate
            for item in self._step.items:
                gate.hold(item)
            self._step.items = []

    def _release(self) -> None:
        gate = self.ownership.gate
        for item in gate.released():
            if isinstance(item, _Send):
                self._send_now(item.member, item.message)
            elif item.peer_id is not None and self.home.unconfirmed(item.peer_id):
                self._held_for.setdefault(item.peer_id, []).append(item.answer)
            else:
                self._answers.append(item.answer)
        for item in gate.failed():
            if isinstance(item, _Reply):
                reason = "the slot moved to another node before this was committed"
                self._answers.append(Answer(item.answer.request_id, error=NotServing(reason)))

    def _send_now(self, member: str, message: object) -> None:
        """Send `message` without holding it back: to this node's own home or owner in this
        step, to another node through the outbox."""
        if member == self.me:
            self._local.append(message)
        else:
            self._outbox.append((member, message))

    def _send(self, member: str, message: object) -> None:
        self._step.items.append(_Send(member, message))

    def _reply(self, peer_id: int | None, answer: Answer) -> None:
        self._step.items.append(_Reply(peer_id, answer))
