"""The home role: the peers of the slots this node acts for. The peer-level rules (checks 1 to
8, expiry, levels, tickets) live in `PeerTable`; this adds the conversation with owners
(`cluster/lock_messages.py`):

* a lock the owner has not answered yet goes to it again every `RETRY_INTERVAL`, and one that
  waits in line every `QUEUED_RECHECK` (a grant may have been lost with a life), or less often
  when more wait than `RECHECK_RATE` asks a second keep up with; a home that gains a slot asks
  again for the pending locks of its peers;
* a grant for a lock the peer no longer has is released at once; every grant is answered
  `LockTaken`, so the release that caused it can be answered;
* a grant is not written here: the owner wrote it, and a home that gains the slot asks again
  for the locks its copy says are pending. Until the owner answers, the peer *settles*: what
  the client reads or asks next of it waits (`settling`), for the peer may hold what its copy
  says it waits for (docs/cluster.md, "A grant is written once");
* releases (by the client, a peer's deletion, expiry) go to the semaphore's owner again every
  `RETRY_INTERVAL` until it confirms them (`LockReleased`; at most `RELEASE_PATIENCE`): until
  then `unconfirmed` says so, and the shard holds back the answers that depend on them;
* a peer lives `STRETCH` times the `expires_in` its client asked for, by this node's clock:
  the client counts its lease on its own, which may run slower than this node's (by up to
  DRIFT, and this node's faster), and must never hold a lock its home already gave up;
* a heartbeat that keeps the peer's lease (its `expires_in`) writes nothing: a home that gains
  the peer's slot gives it a whole lease from then, which is later than any deadline the old
  home set (`PeerTable.load`);
* a peer whose acquire waits for the owner's first answer expires only after that answer (at
  most `DECISION_TIMEOUT` later): an operation completes before an expiry it raced, as on one
  node.

Pure: `now` comes in; where a semaphore's owner is comes from `owner_of`.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from operator import itemgetter

from .deadlines import Deadlines
from .graveyard import Graveyard
from .limits import DEFAULT_LIMITS, Limits
from .lock_messages import (
    Audit,
    LockAnswer,
    LockRefused,
    LockRelease,
    LockReleased,
    LockRequest,
    LockRestore,
    LockTaken,
    OwnerToHome,
)
from .peers import EXPIRE_CHUNK, FIRST_TICKET, TICKET_GAP, AskOwner, PeerRecord, PeerTable
from .ring import peer_key
from .semaphore_leases import SemaphoreConfig
from .slots import STRETCH, slot_of

# A home sends a lock to its owner again if no answer came this long after it sent it...
RETRY_INTERVAL = 1.0
# ... and asks again about a lock that waits in line this often.
QUEUED_RECHECK = 5.0
# Locks that wait in line asked about again per second at most, over all of them: 100,000 asked
# about every 5 s kept a node busy with little else.
RECHECK_RATE = 10_000
# A release waits at most this long for its owner's confirmation before its client is answered.
RELEASE_PATIENCE = 5.0
# An acquire waits at most this long for its owner's first answer.
DECISION_TIMEOUT = 5.0
# Timers run in one step at most, of each kind: the rest are due at once, and run in the next
# steps, after whatever else is ready. Acquires that came in one burst wait in line together,
# and come due together every `QUEUED_RECHECK`: asked about all in one step, tens of thousands
# of them held the node up for a quarter of a second, and 500 a step took 15 ms.
TIMER_CHUNK = 125


@dataclass(frozen=True)
class Granted:
    """The owner granted the peer's pending lock: it now holds all its locks."""

    peer_id: int
    semaphore: str


@dataclass(frozen=True)
class Queued:
    """The owner answered: the peer's lock waits in line."""

    peer_id: int
    semaphore: str


@dataclass(frozen=True)
class Removed:
    """The peer is gone (deleted, or `expired`)."""

    peer_id: int
    expired: bool


@dataclass(frozen=True)
class Settled:
    """The owner answered for the pending lock of a peer whose slot this node gained (or it
    did not, in `DECISION_TIMEOUT`: `answered` False)."""

    peer_id: int
    answered: bool


@dataclass(frozen=True)
class Confirmed:
    """Every release of the peer's locks so far is confirmed by its owner (or waited out)."""

    peer_id: int


Event = Granted | Queued | Removed | Confirmed | Settled


def _slot_of_peer(peer_id: int) -> int:
    return slot_of(peer_key(peer_id))


def _without(kept: set[int], gone: set[int]) -> set[int]:
    """`kept - gone`, passing over the smaller of the two (`-=` passes over `gone`)."""
    return {p for p in kept if p not in gone} if len(kept) < len(gone) else kept - gone


class Home:
    def __init__(
        self,
        semaphores: Mapping[str, SemaphoreConfig],
        owner_of: Callable[[str], str | None],
        limits: Limits = DEFAULT_LIMITS,
    ) -> None:
        # What a lost slot's peers leave behind, freed a chunk a step (`Shard`).
        self.graveyard = graveyard = Graveyard()
        self.peers = PeerTable(
            semaphores,
            limits.peers,
            limits.restore_count,
            lambda peer_id: slot_of(peer_key(peer_id)),
            graveyard,
        )
        self._owner_of = owner_of
        # Locks to tell their owners about again: (peer, semaphore) -> when.
        self._due: Deadlines[tuple[int, str]] = Deadlines(itemgetter(0), graveyard)
        # Peers whose acquire waits for the owner's first answer: peer -> until when.
        self._deciding: Deadlines[int] = Deadlines(int, graveyard)
        # Peers of a gained slot whose pending lock their owner has not answered for yet.
        self._settling: Deadlines[int] = Deadlines(int, graveyard)
        # Releases not confirmed yet: (peer, semaphore, ticket) -> until when to wait, and when
        # to send them again.
        self._unconfirmed: Deadlines[tuple[int, str, int]] = Deadlines(itemgetter(0), graveyard)
        self._resend: Deadlines[tuple[int, str, int]] = Deadlines(itemgetter(0), graveyard)
        # Per peer, its next ticket when this node began to serve it (its slot gained, or the
        # peer new): a request numbered less than `TICKET_GAP` above it leaves ahead of its
        # write (`ahead`).
        self._first_ticket: dict[int, int] = {}
        self._ahead: list[tuple[str, object]] = []
        # Changed or gone since the last `changed()`: to be written.
        self._dirty: set[int] = set()
        self._gone: set[int] = set()
        self._events: list[Event] = []
        self._outbox: list[tuple[str, object]] = []
        self._now = -math.inf
        # When peers were last expired, and whether some due then were left for the next step.
        self._expired_at = -math.inf
        self._expire_more = False

    # -- slots ------------------------------------------------------------------------------

    def gain(self, records: Iterable[PeerRecord], now: float) -> None:
        """Serve the peers of `records` from now on; ask again for their pending locks."""
        self._now = now
        records = list(records)
        for record in records:
            self._first_ticket[record.peer_id] = record.next_ticket
        for peer_id in self.peers.load(records, now):
            for _, name, _, waiting, _ in self.peers.locks([peer_id]):
                if waiting:
                    self._settling.set(peer_id, now + DECISION_TIMEOUT)
                    self._tell_owner(peer_id, name, now)

    def lose(self, slots: Iterable[int]) -> list[int]:
        """Serve the peers of `slots` no more; their ids, slot by slot. All at once: a stop
        loses every slot in one step, and each table is passed over once, not once a slot."""
        gone = self.peers.drop(slots)
        timers = [
            deadlines
            for deadlines in (
                self._deciding,
                self._settling,
                self._due,
                self._unconfirmed,
                self._resend,
            )
            if deadlines
        ]
        for peer_id in gone:
            self._first_ticket.pop(peer_id, None)
        if gone and (timers or self._dirty or self._gone):
            gone_set = set(gone)
            self._dirty = _without(self._dirty, gone_set)
            self._gone = _without(self._gone, gone_set)
            for deadlines in timers:
                deadlines.drop_peers(gone_set)
        return gone

    # -- the Throttle API ------------------------------------------------------------------

    def new_peer(
        self, now: float, lease: float, rng: random.Random, homed, key: bytes | None = None
    ) -> int:
        expires_at = now + lease * STRETCH
        peer_id = self.peers.new_peer(expires_at, rng, homed_here=homed, lease=lease, key=key)
        self._first_ticket[peer_id] = FIRST_TICKET
        self._dirty.add(peer_id)
        return peer_id

    def heartbeat(self, peer_id: int, now: float, lease: float) -> None:
        if self.peers.lease(peer_id) != lease:
            self._dirty.add(peer_id)
        self.peers.heartbeat(peer_id, now + lease * STRETCH, lease)

    def release_peer(self, peer_id: int, op: int | None, now: float) -> bool:
        if self.peers.has_peer(peer_id):
            self.peers.numbered(peer_id, op)
        locks = self.peers.remove(peer_id)
        if locks is None:
            return False
        self._peer_gone(peer_id, locks, expired=False, now=now)
        return True

    def acquire(
        self,
        peer_id: int,
        semaphore: str,
        count: int,
        now: float,
        expires_in: float | None,
        op: int | None,
    ) -> bool | None:
        """True if the peer holds all its locks now, False if it waits for one, None if its
        owner decides (the answer comes as an event)."""
        self._now = now
        self.peers.numbered(peer_id, op)
        self._dirty.add(peer_id)
        decision = self.peers.acquire(peer_id, semaphore, count, now, expires_in, STRETCH)
        if not isinstance(decision, AskOwner):
            return decision
        self._deciding.set(peer_id, now + DECISION_TIMEOUT)
        first = self._first_ticket.get(peer_id, -TICKET_GAP)
        ahead = decision.ticket < first + TICKET_GAP and not self._unconfirmed.has_peer(peer_id)
        self._tell_owner(peer_id, semaphore, now, ahead)
        return None

    def release_lock(self, peer_id: int, semaphore: str, op: int | None, now: float) -> None:
        self.peers.numbered(peer_id, op)
        ticket = self.peers.release_lock(peer_id, semaphore)
        self._dirty.add(peer_id)
        if ticket is not None:
            self._release(peer_id, semaphore, ticket, now)

    def restore(
        self,
        peer_id: int,
        acquired: Mapping[str, int],
        lease: float,
        op: int | None,
        now: float,
    ) -> None:
        tickets = self.peers.restore(peer_id, acquired, now + lease * STRETCH, lease, op)
        if tickets is None:
            return
        self._dirty.add(peer_id)
        self._gone.discard(peer_id)
        for name in tickets:
            self._tell_owner(peer_id, name, now)

    # -- the conversation with owners --------------------------------------------------------

    def receive(self, sender: str, message: OwnerToHome, now: float) -> None:
        """A message from an owner about peers this node serves."""
        self._now = now
        match message:
            case LockAnswer():
                self._answered(sender, message, now)
                # A peer spared while its acquire was decided expires with the decision, in
                # this step: its answer then waits for the release, and what the client reads
                # next sees the peer gone.
                self.expire_if_due(message.peer_id, now)
            case LockRefused(peer_id, name, ticket):
                if self.peers.ticket(peer_id, name) == ticket:
                    self._due.set((peer_id, name), now + RETRY_INTERVAL)
            case LockReleased(peer_id, name, ticket):
                self._confirm(peer_id, name, ticket)
            case Audit(peer_ids, names, tickets):
                for peer_id, name, ticket in zip(peer_ids, names, tickets, strict=True):
                    if not self.peers.wants(peer_id, name, ticket):
                        self._outbox.append((sender, LockRelease(peer_id, name, ticket, False)))

    def _answered(self, sender: str, answer: LockAnswer, now: float) -> None:
        peer_id, name, ticket = answer.peer_id, answer.semaphore, answer.ticket
        if self.peers.ticket(peer_id, name) != ticket:
            if answer.granted:
                # A grant nobody wants (released, or the peer is gone): undo it.
                self._outbox.append((sender, LockRelease(peer_id, name, ticket, False)))
                self._outbox.append((sender, LockTaken(peer_id, name, ticket)))
            return
        self._deciding.pop(peer_id)
        if self._settling.pop(peer_id) is not None:
            self._events.append(Settled(peer_id, answered=True))
        if not answer.granted:
            pending = self.peers.pending(peer_id)
            if pending is not None and pending[0] == name:
                recheck = max(QUEUED_RECHECK, len(self._due) / RECHECK_RATE)
                self._due.set((peer_id, name), now + recheck)
                self._events.append(Queued(peer_id, name))
            return
        self._due.pop((peer_id, name))
        pending = self.peers.pending(peer_id)
        waiting = pending is not None and pending[0] == name  # else: a held lock, confirmed
        if self.peers.granted(peer_id, name, ticket, answer.token):
            if waiting:
                # Written by the owner: this copy goes with the peer's next write.
                self._events.append(Granted(peer_id, name))
            else:
                self._dirty.add(peer_id)  # a held lock's token, which no home asks again
        self._outbox.append((sender, LockTaken(peer_id, name, ticket)))

    def deciding_until(self, peer_id: int, now: float) -> float:
        """Until when the peer's acquire waits for its owner's first answer."""
        return self._deciding.get(peer_id, now + DECISION_TIMEOUT)

    def settling(self, peer_id: int) -> bool:
        """Does the peer wait for its owner to say whether it holds its pending lock (its slot
        gained since it asked)?"""
        return peer_id in self._settling

    def unconfirmed(self, peer_id: int) -> bool:
        """Has the peer a release its owner has not confirmed yet?"""
        return self._unconfirmed.has_peer(peer_id)

    # -- time -------------------------------------------------------------------------------

    def next_deadline(self) -> float:
        expiry = self.peers.next_deadline()
        if expiry is None or (expiry <= self._expired_at and not self._expire_more):
            # Due already, so spared: such a peer's time comes with its decision's.
            expiry = math.inf
        return min(
            expiry,
            self._due.next_deadline(),
            self._deciding.next_deadline(),
            self._settling.next_deadline(),
            self._unconfirmed.next_deadline(),
            self._resend.next_deadline(),
        )

    def tick(self, now: float) -> None:
        """Spare no peer whose decision took too long, tell owners again what they did not
        answer, stop waiting for confirmations that take too long. (Peers expire in `expire`,
        which the shard runs once a step.)"""
        self._now = now
        for peer_id in self._deciding.due(now, TIMER_CHUNK):
            self._deciding.pop(peer_id)
        for peer_id in self._settling.due(now, TIMER_CHUNK):
            self._settling.pop(peer_id)
            self._events.append(Settled(peer_id, answered=False))
        for peer_id, name in self._due.due(now, TIMER_CHUNK):
            self._tell_owner(peer_id, name, now)
        due = {*self._unconfirmed.due(now, TIMER_CHUNK), *self._resend.due(now, TIMER_CHUNK)}
        for key in sorted(due, key=self._unconfirmed.order):
            if now >= self._unconfirmed.at(key):
                self._confirm(*key)
            else:
                self._send_release(*key, now)

    def expire(self, now: float) -> None:
        """Remove the peers whose deadline has come (but those an acquire decides for), at
        most `EXPIRE_CHUNK` of them: `next_deadline` says the rest are due."""
        self._expired_at = now
        expired = self.peers.expire(now, spared=self._deciding.__contains__, most=EXPIRE_CHUNK)
        self._expire_more = len(expired) == EXPIRE_CHUNK
        for peer_id, locks in expired:
            self._peer_gone(peer_id, locks, expired=True, now=now)

    def expire_if_due(self, peer_id: int, now: float) -> None:
        """Remove the peer if its deadline has come (unless an acquire decides for it), before
        anything is asked of it: expiring the others in chunks may not have reached it yet."""
        if peer_id in self._deciding:
            return
        locks = self.peers.expire_peer(peer_id, now)
        if locks is not None:
            self._peer_gone(peer_id, locks, expired=True, now=now)

    # -- outputs ----------------------------------------------------------------------------

    def changed(self, now: float) -> tuple[list[PeerRecord], list[int]]:
        """The records of the peers changed since the last call, and the ids of those gone."""
        if not self._dirty and not self._gone:
            return [], []
        present = [peer_id for peer_id in self._dirty if self.peers.has_peer(peer_id)]
        gone = sorted(self._gone | (self._dirty - set(present)))
        self._dirty, self._gone = set(), set()
        return self.peers.snapshot(now, sorted(present)), gone

    def events(self) -> list[Event]:
        events, self._events = self._events, []
        return events

    def outbox(self) -> list[tuple[str, object]]:
        outbox, self._outbox = self._outbox, []
        return outbox

    def ahead(self) -> list[tuple[str, object]]:
        """Requests that may leave before the writes of this step are committed: each the first
        its peer asks for under its ticket, numbered less than `TICKET_GAP` above the peer's
        ticket when this node began to serve it, of a peer with no release its owner has not
        confirmed (docs/cluster.md, "A request goes with its write")."""
        ahead, self._ahead = self._ahead, []
        return ahead

    # -- internals --------------------------------------------------------------------------

    def _tell_owner(self, peer_id: int, name: str, now: float, ahead: bool = False) -> None:
        """Send the lock as it stands to its owner: a request while it waits, a restore while
        it is held (`ahead`: a new request, sent with its write). Until an owner answers, it
        goes again every `RETRY_INTERVAL`."""
        ticket = self.peers.ticket(peer_id, name)
        if ticket is None:
            self._due.pop((peer_id, name))
            return
        pending = self.peers.pending(peer_id)
        if pending is not None and pending[0] == name:
            message: object = LockRequest(peer_id, name, pending[1], ticket)
        else:
            held = self.peers.holds(peer_id, name)
            assert held is not None  # a lock with a ticket that does not wait is held
            message = LockRestore(peer_id, name, held, ticket)
        self._due.set((peer_id, name), now + RETRY_INTERVAL)
        owner = self._owner_of(name)
        if owner is not None:
            (self._ahead if ahead else self._outbox).append((owner, message))

    def _release(self, peer_id: int, name: str, ticket: int, now: float) -> None:
        self._due.pop((peer_id, name))
        self._unconfirmed.set((peer_id, name, ticket), now + RELEASE_PATIENCE)
        self._send_release(peer_id, name, ticket, now)

    def _send_release(self, peer_id: int, name: str, ticket: int, now: float) -> None:
        self._resend.set((peer_id, name, ticket), now + RETRY_INTERVAL)
        owner = self._owner_of(name)
        if owner is not None:
            self._outbox.append((owner, LockRelease(peer_id, name, ticket, True)))

    def _confirm(self, peer_id: int, name: str, ticket: int) -> None:
        self._resend.pop((peer_id, name, ticket))
        if self._unconfirmed.pop((peer_id, name, ticket)) is None:
            return
        if not self.unconfirmed(peer_id):
            self._events.append(Confirmed(peer_id))

    def _peer_gone(
        self, peer_id: int, locks: list[tuple[str, int]], expired: bool, now: float
    ) -> None:
        self._deciding.pop(peer_id)
        self._settling.pop(peer_id)
        self._first_ticket.pop(peer_id, None)
        self._gone.add(peer_id)
        self._dirty.discard(peer_id)
        self._events.append(Removed(peer_id, expired))
        for name, ticket in locks:
            self._release(peer_id, name, ticket, now)
