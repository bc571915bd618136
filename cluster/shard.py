"""One node's share of the semaphores in a cluster: the peers homed here, the semaphores owned
here, and the messages between homes and owners.

The ring (`cluster/ring.py`) places every peer at a *home*, the owner of its id, and every
semaphore at an *owner*. A client's operation on a peer runs at the peer's home, which holds its
`PeerTable` entry: expiry, its locks, and acquire checks 1 to 8. Check 9 and the FIFO queue live at
the semaphore's owner, in `SemaphoreLeases`. Homes and owners talk in messages, events in and
effects out in the manner of h11: `on_message` takes what arrived, `outbox()` says what to send,
`events()` what the node must tell its waiting clients. A message to this node itself is handled
at once, so a cluster of one behaves exactly like `SemaphoreCore`.

Home to owner: `LockRequest`, `LockRestore`, `LockRelease`. Owner to home: `LockAnswer` (granted
with its fencing token, or queued; a queued lock's grant is another `LockAnswer` later) and
`LockRefused` (not the owner in its view; the home asks again later). Every lock carries a
*ticket*, the home's random name for it: answers and releases quote it, so a message that crossed
a newer request of the same peer on the way cannot touch the newer lock.

Nothing here assumes messages arrive. A home sends a request or restore again every
`RETRY_INTERVAL` until the owner answers it, and asks again about a queued lock every
`QUEUED_RECHECK` (a grant may have been lost); an owner asks each home every `AUDIT_INTERVAL`
whether it still wants the locks it holds for it (`Audit`) and drops those it does not. All of it
is idempotent, so lost, repeated and late messages all settle.

Every node streams its share to the others (`cluster/replica_stream.py`, driven by `replicate`).
When members change (`change_members`):
* a member that is gone (dead, left, or restarted with a new generation) leaves its keys to its
  ring successors, which take them over from their replica of it, and ask every member to
  re-assert its peers' locks on the semaphores they gained (`Reassert`). A semaphore taken over
  gets a grace period: restores and re-assertions come in, nothing new is granted;
* a node that joins, or restarts empty, sends `Pull` to every member (again every `pull_retry`),
  and serves nothing (503) until each answered with a `Handoff` of what it held that the new node
  owns now. A member answers once it counts the new node as a member, and stops serving that
  share then. A member that dies before it answers leaves its share to its replica;
* every home re-asserts, to the new owner, each lock on a semaphore whose owner changed;
* state a node holds but does not own is pushed on to its owner (`_push_stranded`);
* a node that sees no majority of the members it knows drops everything and serves nothing
  (`_step_down`); it rejoins like a new node.

Pure: `now` and fencing epochs come in as arguments, randomness from the `rng` given.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from .errors import NotServing
from .peers import AskOwner, PeerRecord, PeerRemoved, PeerTable
from .replica_stream import PART_RECORDS, ReplicaDelta, ReplicaFeed, ReplicaResync, ReplicaStore
from .ring import Ring, peer_key, semaphore_key
from .semaphore_leases import (
    LockGranted,
    SemaphoreConfig,
    SemaphoreLeases,
    SemaphoreRecord,
    SemaphoreStats,
)
from .semaphores import Replica

# A home sends a lock to its owner again if no answer came this long after it sent it...
RETRY_INTERVAL = 1.0
# ... and asks again about a lock that waits in line this often.
QUEUED_RECHECK = 5.0
# An owner asks homes whether they still want its locks this often (once members are settled).
AUDIT_INTERVAL = 2.0
# Owner messages kept for semaphores whose state is on its way here, at most.
HELD_BACK_LIMIT = 100_000


@dataclass(frozen=True, slots=True)
class LockRequest:
    """Home to owner: the peer passed checks 1 to 8; does `count` fit (check 9)? `provisional`:
    the home took the peer over from a replica and its client has not restored it yet."""

    peer_id: int
    semaphore: str
    count: int
    ticket: int
    provisional: bool = False


@dataclass(frozen=True, slots=True)
class LockRestore:
    """Home to owner: the peer holds this lock; count it, even beyond max."""

    peer_id: int
    semaphore: str
    count: int
    ticket: int


@dataclass(frozen=True, slots=True)
class LockRelease:
    """Home to owner: the lock of this ticket is released or withdrawn."""

    peer_id: int
    semaphore: str
    ticket: int


@dataclass(frozen=True, slots=True)
class LockAnswer:
    """Owner to home: the lock of this ticket is granted (with its fencing token) or waits."""

    peer_id: int
    semaphore: str
    ticket: int
    granted: bool
    token: int


@dataclass(frozen=True, slots=True)
class LockRefused:
    """Owner to home: this node does not own the semaphore (now); the request did nothing."""

    peer_id: int
    semaphore: str
    ticket: int


@dataclass(frozen=True, slots=True)
class Audit:
    """Owner to home: does it still want these locks (peer, semaphore, ticket)?"""

    peer_ids: list[int]
    semaphores: list[str]
    tickets: list[int]


@dataclass(frozen=True, slots=True)
class Reassert:
    """A new owner to every member: tell me of your peers' locks on these semaphores (it took
    them over from a departed member, maybe before the receiver noticed the departure)."""

    semaphores: list[str]


@dataclass(frozen=True, slots=True)
class Pull:
    """A joining node, in its life `generation`, to a member: hand me what you hold that I own
    now."""

    generation: int


@dataclass(frozen=True, slots=True)
class Handoff:
    """The answer to `Pull`, in one or more parts: the state the sender held for keys the
    receiver owns; the sender has dropped it."""

    peers: list[PeerRecord]
    semaphores: list[SemaphoreRecord]
    last: bool


@dataclass(frozen=True)
class LockQueued:
    """The owner answered: the peer's lock waits in line."""

    peer_id: int
    semaphore: str


@dataclass(frozen=True)
class PeerMoved:
    """The peer's home is another node now; a request waiting for it must answer here."""

    peer_id: int


Event = LockGranted | LockQueued | PeerRemoved | PeerMoved
Message = (
    LockRequest
    | LockRestore
    | LockRelease
    | LockAnswer
    | LockRefused
    | Audit
    | Reassert
    | Pull
    | Handoff
    | ReplicaDelta
    | ReplicaResync
)


class ShardCore:
    def __init__(
        self,
        node_id: str,
        semaphores: Mapping[str, SemaphoreConfig],
        *,
        rng: random.Random,
        epoch: int,
        settle: float,
        takeover_grace: float,
        cold_start_grace: float,
        pull_retry: float,
    ) -> None:
        self.node_id = node_id
        self._config = dict(semaphores)
        self._rng = rng
        self._epoch = epoch
        self._settle = settle
        self._takeover_grace = takeover_grace
        self._cold_start_grace = cold_start_grace
        self._pull_retry = pull_retry
        self._peers = PeerTable(semaphores)
        self._leases = SemaphoreLeases(semaphores, epoch)
        self._ring: Ring | None = None
        self._generations: dict[str, int] = {}
        # The latest life of every node ever a member, gone ones too: messages are meant for it.
        self._lives: dict[str, int] = {}
        self._ring_changed_at = -math.inf
        # Members whose Handoff this node waits for: member -> (ring before the change, or None
        # if this node had none, and when to send the pull again if no answer came).
        self._awaiting: dict[str, tuple[Ring | None, float]] = {}
        # Pulls from nodes (and their lives) this node does not count as members yet; answered
        # once it does.
        self._deferred_pulls: dict[str, int] = {}
        # Members this node saw gone and has heard no Pull or Handoff from since (on the same
        # link as anything it said before): a node cut off steps down and pulls when it is back,
        # and what it said before may arrive after this node counts it in again (told by
        # others). Member -> when this node last pulled from it (to hear from one that did not
        # step down; None: not yet).
        self._cut: dict[str, float | None] = {}
        # This node's share as streamed to the others, and theirs as received.
        self._feed = ReplicaFeed()
        self._replicas: dict[str, ReplicaStore] = {}
        # Owner messages for semaphores whose state is on its way here, applied once it came.
        self._held_back: list[tuple[str, Message]] = []
        # Home: the ticket of each lock of its peers, the token of each held one, and when to
        # tell the owner again about a lock it has not confirmed (or that waits in line).
        self._tickets: dict[tuple[int, str], int] = {}
        self._tokens: dict[tuple[int, str], int] = {}
        # (When, and to which node if not the owner by this node's view.)
        self._due: dict[tuple[int, str], tuple[float, str | None]] = {}
        self._next_retry = math.inf
        self._next_audit = -math.inf
        # Set when this node may hold state it does not own (see `_push_stranded`).
        self._stranded = False
        self._outbox: list[tuple[str, int | None, Message]] = []
        # The latest `now` passed in: operations without one (release, restore) happen then.
        self._now = -math.inf
        self._local: deque[Message] = deque()
        self._events: list[Event] = []
        self.takeovers = 0
        self.step_downs = 0

    # -- placement ---------------------------------------------------------------------------

    def home_of(self, peer_id: int) -> str | None:
        return self._ring.owner(peer_key(peer_id)) if self._ring is not None else None

    def owner_of(self, semaphore: str) -> str | None:
        return self._ring.owner(semaphore_key(semaphore)) if self._ring is not None else None

    def serves_peer(self, peer_id: int) -> bool:
        return self._serves(peer_key(peer_id))

    def serves_semaphore(self, semaphore: str) -> bool:
        return self._serves(semaphore_key(semaphore))

    def owned_semaphores(self) -> list[str]:
        return [name for name in self._config if self.owner_of(name) == self.node_id]

    def _serves(self, key: bytes) -> bool:
        if self._ring is None or self._ring.owner(key) != self.node_id:
            return False
        return not any(
            old is None or old.owner(key) == source for source, (old, _) in self._awaiting.items()
        )

    def _check_home(self, peer_id: int) -> None:
        if not self.serves_peer(peer_id):
            raise NotServing(f"peer {peer_id} is not served by {self.node_id} now")

    # -- the Throttle API, at the peer's home ------------------------------------------------

    def new_peer(self, expires_at: float, rng: random.Random) -> int:
        if self._ring is None or any(old is None for old, _ in self._awaiting.values()):
            raise NotServing(f"{self.node_id} is still taking over its share")
        peer_id = self._peers.new_peer(
            expires_at, rng, homed_here=self.serves_peer, lease=expires_at - self._now
        )
        self._feed.peer_changed(peer_id)
        return peer_id

    def heartbeat(self, peer_id: int, expires_at: float) -> None:
        self._check_home(peer_id)
        self._peers.heartbeat(peer_id, expires_at, lease=expires_at - self._now)
        self._feed.peer_changed(peer_id)

    def release_peer(self, peer_id: int) -> bool:
        self._check_home(peer_id)
        locks = self._peers.remove(peer_id)
        if locks is None:
            return False
        self._peer_gone(peer_id, locks, expired=False)
        self._drain_local()
        return True

    def is_acquired(self, peer_id: int) -> bool:
        self._check_home(peer_id)
        return self._peers.is_acquired(peer_id)

    def peer_ids(self) -> list[int]:
        return [peer_id for peer_id in self._peers.peer_ids() if self.serves_peer(peer_id)]

    def has_peer(self, peer_id: int) -> bool:
        return self._peers.has_peer(peer_id)

    def acquire(
        self,
        peer_id: int,
        semaphore: str,
        count: int,
        now: float,
        expires_in: float | None = None,
    ) -> bool | None:
        """Ask for a lock: True if the peer now holds all its locks, False if this one waits,
        None if its owner is another node, whose answer comes later as an event."""
        self._check_home(peer_id)
        self._now = now
        self._feed.peer_changed(peer_id)
        decision = self._peers.acquire(peer_id, semaphore, count, now, expires_in)
        if not isinstance(decision, AskOwner):
            return decision
        self._tickets[peer_id, semaphore] = self._rng.getrandbits(63)
        seen = len(self._events)
        self._tell_owner(peer_id, semaphore, now)
        self._drain_local()
        if self._peers.holds(peer_id, semaphore) == count:
            return True
        if LockQueued(peer_id, semaphore) in self._events[seen:]:
            return False
        return None

    def locks_of(self, peer_id: int) -> list[str]:
        self._check_home(peer_id)
        return self._peers.locks_of(peer_id)

    def release_lock(self, peer_id: int, semaphore: str) -> None:
        self._check_home(peer_id)
        if self._peers.release_lock(peer_id, semaphore):
            self._feed.peer_changed(peer_id)
            self._forget_lock(peer_id, semaphore, tell_owner=True)
            self._drain_local()

    def remainder(self, semaphore: str) -> int:
        if semaphore in self._config and not self.serves_semaphore(semaphore):
            raise NotServing(f"semaphore {semaphore!r} is not served by {self.node_id} now")
        return self._leases.remainder(semaphore)

    def fencing_token(self, peer_id: int, semaphore: str) -> int | None:
        return self._tokens.get((peer_id, semaphore))

    def restore(self, peer_id: int, acquired: Mapping[str, int], expires_at: float) -> None:
        self._check_home(peer_id)
        # A provisional peer (taken over from a replica) becomes what its client holds: locks
        # the replica had and the client has not are released now (else the owners' audits
        # would, later).
        previous = self._peers.locks_of(peer_id) if self._peers.is_provisional(peer_id) else []
        if self._peers.restore(peer_id, acquired, expires_at, lease=expires_at - self._now):
            self._feed.peer_changed(peer_id)
            for name in previous:
                if name not in acquired:
                    self._forget_lock(peer_id, name, tell_owner=True)
            for name in acquired:
                self._tickets[peer_id, name] = self._rng.getrandbits(63)
                self._tell_owner(peer_id, name, self._now)
            self._drain_local()

    # -- members -----------------------------------------------------------------------------

    def change_members(
        self,
        members: Mapping[str, int],
        now: float,
        epoch: int,
        cold: bool = False,
        majority: bool = True,
        left: Iterable[str] = (),
    ) -> None:
        """The live members (id -> generation) changed. `epoch` (wall-clock ms now) lets
        fencing tokens of semaphores taken over continue above anything seen before; `cold`
        says nobody was serving before (the first ring of a cluster starting together);
        `majority` says whether the live members are more than half of the members known;
        `left`, which departed members said goodbye (their replicas are complete)."""
        self._now = now
        if not majority:
            if self._ring is not None:
                self._step_down()
            return
        old, old_generations = self._ring, self._generations
        new = Ring(members)
        self._ring, self._generations = new, dict(members)
        self._lives.update(members)
        self._ring_changed_at = now
        self._epoch = max(self._epoch, epoch)
        me = self.node_id
        restarted = {m for m, g in members.items() if old_generations.get(m, g) != g}
        gone = (set(old_generations) - set(members)) | restarted
        gone.discard(me)
        for member in gone:
            self._cut[member] = None
        for member in gone:
            self._feed.restart(member)  # a new stream if it comes back
        # Tokens of a semaphore new to this node go on above every token an earlier owner gave,
        # whether or not its state ever reaches here (an owner cut off gives no hand-over).
        self._leases.merge([], now, self._epoch, self._gained(old))

        if old is None or me not in old.members:
            # Joining (or back after a restart): everything this node owns is somewhere else.
            grace = self._cold_start_grace if cold else self._takeover_grace
            if grace > 0:
                self._leases.start_grace(now + grace, self.owned_semaphores())
            for source in members:
                if source != me:
                    self._awaiting[source] = (None, now + self._pull_retry)
                    self._send(source, Pull(members[me]))
        else:
            left = set(left)
            for source in sorted(gone):
                awaited = self._awaiting.pop(source, None)
                self._take_over(source, awaited[0] if awaited else old, now, source in left)

        for source, generation in sorted(self._deferred_pulls.items()):
            if members.get(source) == generation:
                del self._deferred_pulls[source]
                self._answer_pull(source, generation)
        self._push_stranded()
        # Peers this node no longer serves: a request waiting on one must answer, not wait.
        for peer_id in self._peers.peer_ids():
            if self.home_of(peer_id) != me:
                self._events.append(PeerMoved(peer_id))

        def owner_changed(name: str) -> bool:
            owner = self.owner_of(name)
            return old is None or old.owner(semaphore_key(name)) != owner or owner in restarted

        def untold(peer_id: int, name: str) -> bool:
            # A lock of a peer that came here while another node was its home in this node's
            # view: no owner has heard of it from here yet.
            return (peer_id, name) not in self._tickets

        self._reassert(self._peers.peer_ids(), owner_changed, now, untold=untold)
        self._replay_held_back()
        self._drain_local()

    # -- messages ----------------------------------------------------------------------------

    def on_message(self, sender: str, message: Message, now: float) -> None:
        """A message from node `sender` arrived."""
        self._now = now
        self._receive(sender, message)
        self._drain_local()

    def outbox(self) -> list[tuple[str, int | None, Message]]:
        """What to send since the last call, in order: (node id, generation, message). A message
        is meant for the life of the node (`generation`) this node knew of when it said it, and
        must not reach a later one (None: any); a node that restarted starts from what it
        pulls, and what was said to its previous life (a hand-off, a grant) would be stale."""
        outbox, self._outbox = self._outbox, []
        return outbox

    def events(self) -> list[Event]:
        events, self._events = self._events, []
        return events

    # -- time --------------------------------------------------------------------------------

    def next_deadline(self) -> float | None:
        deadlines = [self._peers.next_deadline(), self._leases.grace_until]
        if self._due:
            deadlines.append(self._next_retry)
        deadlines.extend(deadline for _, deadline in self._awaiting.values())
        if (self._needs_audit() or self._stranded) and not self._awaiting:
            deadlines.append(max(self._next_audit, self._ring_changed_at + self._settle))
        known = [d for d in deadlines if d is not None]
        return min(known) if known else None

    def expire(self, now: float) -> list[int]:
        """Expire peers, end grace periods, send again what was not answered (locks, pulls),
        audit and push stranded state, as their times come; returns the expired peers' ids."""
        self._now = now
        expired = self._peers.expire(now)
        for peer_id, locks in expired:
            self._peer_gone(peer_id, locks, expired=True)
        self._leases.end_grace(now)
        self._deliver_grants()
        for source, (old, due) in list(self._awaiting.items()):
            if now >= due:
                # The pull or its answer may be lost, or the member has not seen this node yet
                # (it answers once it has). Taking its share from a replica instead would make
                # two nodes serve it; only a member that is gone leaves its share to a replica.
                self._awaiting[source] = (old, now + self._pull_retry)
                self._send(source, Pull(self._generations[self.node_id]))
        if self._due and now >= self._next_retry:
            for (peer_id, name), (_, owner) in [
                item for item in self._due.items() if now >= item[1][0]
            ]:
                self._tell_owner(peer_id, name, now, owner)
            self._next_retry = now + RETRY_INTERVAL
        if (self._needs_audit() or self._stranded) and now >= self._next_audit:
            if self._settled(now):
                self._audit()
                if self._stranded:
                    self._push_stranded()
                self._next_audit = now + AUDIT_INTERVAL
        self._drain_local()
        return [peer_id for peer_id, _ in expired]

    # -- replicas and observation -------------------------------------------------------------

    def replica(self, now: float) -> Replica:
        """All of this node's share (and anything it holds for others)."""
        me = self.node_id
        names = [n for n in self._config if self._leases.in_use(n) or self.owner_of(n) == me]
        return Replica(self._peers.snapshot(now), self._leases.snapshot(names))

    def replicate(self, now: float) -> None:
        """Stream what changed since the last call to every other member (see
        `cluster/replica_stream.py`); a member new to the stream gets a whole copy."""
        self._now = now
        if self._ring is None:
            return
        changed, removed, semaphores = self._feed.take_changes()
        present = [p for p in changed if self._peers.has_peer(p)]
        delta = (
            self._peers.snapshot(now, present),
            sorted(removed | (changed - set(present))),
            self._leases.snapshot(sorted(semaphores)),
        )
        copy = None
        for member in sorted(self._ring.members - {self.node_id}):
            if self._feed.needs_copy(member):
                if copy is None:
                    copy = self.replica(now)
                parts = self._feed.deltas(member, copy.peers, [], copy.semaphores)
            else:
                parts = self._feed.deltas(member, *delta)
            for part in parts:
                self._send(member, part)

    def stats(self, now: float) -> list[SemaphoreStats]:
        return self._leases.stats(now, [n for n in self._config if self.serves_semaphore(n)])

    @property
    def restores_beyond_max(self) -> int:
        return self._leases.restores_beyond_max

    def waiting_for_handoff(self) -> list[str]:
        return sorted(self._awaiting)

    def semaphores_in_grace(self) -> list[str]:
        """Semaphores that grant nothing new yet: taken over (or joined) moments ago."""
        return self._leases.in_grace()

    @property
    def serving(self) -> bool:
        """Does this node serve its share (it knows the members, is in a majority, and has
        pulled what it owns)?"""
        return self._ring is not None and not self._awaiting

    # -- internals: home ---------------------------------------------------------------------

    def _tell_owner(
        self, peer_id: int, semaphore: str, now: float, owner: str | None = None
    ) -> None:
        """Send the lock as it stands to its owner (by this node's view, unless `owner` says): a
        request while it waits, a restore while it is held. Until an owner answers, it goes
        again every `RETRY_INTERVAL`."""
        key = (peer_id, semaphore)
        pending = self._peers.pending(peer_id)
        ticket = self._tickets.get(key)
        if ticket is None:
            ticket = self._tickets[key] = self._rng.getrandbits(63)
        if pending is not None and pending[0] == semaphore:
            message: Message = LockRequest(
                peer_id, semaphore, pending[1], ticket, self._peers.is_provisional(peer_id)
            )
        else:
            count = self._peers.holds(peer_id, semaphore)
            if count is None:
                self._due.pop(key, None)
                return
            message = LockRestore(peer_id, semaphore, count, ticket)
        if not self._due:
            self._next_retry = now + RETRY_INTERVAL
        self._due[key] = (now + RETRY_INTERVAL, owner)
        self._send(owner or self.owner_of(semaphore), message)

    def _peer_gone(self, peer_id: int, locks: list[str], expired: bool) -> None:
        self._events.append(PeerRemoved(peer_id, expired))
        self._feed.peer_removed(peer_id)
        for name in locks:
            self._forget_lock(peer_id, name, tell_owner=True)

    def _forget_lock(self, peer_id: int, semaphore: str, tell_owner: bool) -> None:
        # A lock this home never named (it came with the peer from a replica or a hand-over,
        # and has not been re-asserted yet) is released under ticket 0: whichever lock the
        # owner has for the peer there, as no newer one can exist without this home's name.
        ticket = self._tickets.pop((peer_id, semaphore), 0)
        self._tokens.pop((peer_id, semaphore), None)
        self._due.pop((peer_id, semaphore), None)
        if tell_owner:
            self._send(self.owner_of(semaphore), LockRelease(peer_id, semaphore, ticket))

    def _reassert(
        self,
        peer_ids: Iterable[int],
        which: Callable[[str], bool],
        now: float,
        owner: str | None = None,
        untold: Callable[[int, str], bool] = lambda peer_id, name: False,
    ) -> None:
        """Tell owners (or `owner`) again about the locks of `peer_ids` on semaphores `which`
        says (and about those `untold` says)."""
        for peer_id, name, _, _ in list(self._peers.locks(iter(list(peer_ids)))):
            if (which(name) or untold(peer_id, name)) and self.home_of(peer_id) == self.node_id:
                self._tell_owner(peer_id, name, now, owner)

    def _as_home(self, sender: str, message: LockAnswer | LockRefused) -> None:
        peer_id, name = message.peer_id, message.semaphore
        if self._tickets.get((peer_id, name)) != message.ticket:
            # An answer about a lock this home no longer has: the owner must not keep a grant
            # nobody wants. The ticket keeps the release from touching any newer lock.
            # Only a home serving the peer knows that: one still waiting for the peer's state
            # re-asserts its locks once it has it.
            if isinstance(message, LockAnswer) and message.granted and self.serves_peer(peer_id):
                self._send(sender, LockRelease(peer_id, name, message.ticket))
            return
        if isinstance(message, LockRefused):
            # Another node owns it in the sender's view: send it again later, to the owner in
            # this node's view then.
            due = self._due.get((peer_id, name))
            if due is not None:
                self._due[peer_id, name] = (due[0], None)
            return
        pending = self._peers.pending(peer_id)
        waiting = pending is not None and pending[0] == name
        if not message.granted:
            if waiting:
                self._due[peer_id, name] = (self._now + QUEUED_RECHECK, None)
                self._events.append(LockQueued(peer_id, name))
            return
        self._due.pop((peer_id, name), None)
        self._tokens[peer_id, name] = message.token
        if waiting and self._peers.granted(peer_id, name, pending[1]):
            self._feed.peer_changed(peer_id)
            self._events.append(LockGranted(peer_id, name, pending[1]))

    def _answer_audit(self, sender: str, audit: Audit) -> None:
        if not self._settled(self._now):
            return
        for peer_id, name, ticket in zip(
            audit.peer_ids, audit.semaphores, audit.tickets, strict=True
        ):
            if not self.serves_peer(peer_id) or self._peers.is_provisional(peer_id):
                # A provisional peer's replica may be behind its client: it says what it holds
                # when it restores the peer (or the peer expires).
                continue
            if self._peers.wants(peer_id, name) is None:
                self._send(sender, LockRelease(peer_id, name, ticket))

    # -- internals: owner --------------------------------------------------------------------

    def _as_owner(self, sender: str, message: LockRequest | LockRestore | LockRelease) -> None:
        name = message.semaphore
        if name not in self._config:
            return
        if self._ring is not None and self.owner_of(name) != self.node_id:
            # Not ours in this node's view: the home sends a request or restore again until the
            # owner it finds answers; a release sent here by mistake is left to that owner's
            # audit.
            if not isinstance(message, LockRelease):
                self._send(sender, LockRefused(message.peer_id, name, message.ticket))
            return
        if self._ring is None or not self.serves_semaphore(name):
            # Bounded: a home sends its locks again until an owner answers.
            if len(self._held_back) < HELD_BACK_LIMIT:
                self._held_back.append((sender, message))
            return
        peer_id = message.peer_id
        if not isinstance(message, LockRelease) and (
            sender not in self._ring.members or sender in self._cut
        ):
            # Only members speak for locks. A node cut off (it stepped down, and forgot its
            # peers) may still have requests it made then on their way, and a request under a
            # stale ticket would drop the lock the peer's home holds now. They may come after
            # it counts as a member again (heard of through others), but before its pull.
            # (A release quotes its lock's ticket, so it is safe from anyone.)
            self._send(sender, LockRefused(peer_id, name, message.ticket))
            probed = self._cut.get(sender, -math.inf)
            if sender in self._ring.members and (
                probed is None or self._now >= probed + self._pull_retry
            ):
                # One that did not step down does not pull: its answer to a pull comes after
                # all it said before, as well.
                self._cut[sender] = self._now
                self._send(sender, Pull(self._generations[self.node_id]))
            return
        self._feed.semaphores_changed([name])
        if isinstance(message, LockRelease):
            self._leases.release(peer_id, name, message.ticket or None)
        else:
            if isinstance(message, LockRequest):
                granted = self._leases.request(
                    peer_id, name, message.count, self._now, message.ticket, message.provisional
                )
            else:
                self._leases.restore(peer_id, name, message.count, message.ticket)
                granted = True
            token = self._leases.token(peer_id, name) if granted else 0
            self._send(sender, LockAnswer(peer_id, name, message.ticket, granted, token))
        self._deliver_grants()

    def _deliver_grants(self) -> None:
        for grant in self._leases.events():
            self._feed.semaphores_changed([grant.semaphore])
            ticket = self._leases.ticket(grant.peer_id, grant.semaphore)
            token = self._leases.token(grant.peer_id, grant.semaphore)
            home = self.home_of(grant.peer_id)
            if home is not None:
                self._send(home, LockAnswer(grant.peer_id, grant.semaphore, ticket, True, token))

    def _needs_audit(self) -> bool:
        return self._leases.any_in_use()

    def _settled(self, now: float) -> bool:
        return not self._awaiting and now >= self._ring_changed_at + self._settle

    def _audit(self) -> None:
        asks: dict[str, Audit] = {}
        for name in self._config:
            if not self.serves_semaphore(name):
                continue
            for peer_id, ticket in self._leases.holdings(name):
                home = self.home_of(peer_id)
                audit = asks.setdefault(home, Audit([], [], []))
                audit.peer_ids.append(peer_id)
                audit.semaphores.append(name)
                audit.tickets.append(ticket)
        for home, audit in asks.items():
            self._send(home, audit)

    # -- internals: moving state -------------------------------------------------------------

    def _gained(self, old: Ring | None) -> list[str]:
        """The semaphores this node owns now and did not own in ring `old`."""
        me = self.node_id
        if old is None or me not in old.members:
            return self.owned_semaphores()
        return [n for n in self.owned_semaphores() if old.owner(semaphore_key(n)) != me]

    def _take_over(self, source: str, old: Ring | None, now: float, left: bool = False) -> None:
        """`source` is gone (or never handed over): take what this node owns of its share from
        its latest replica, with a grace period for its semaphores. Its peers are provisional
        unless it `left` gracefully (it replicated everything, and stopped, before it said
        goodbye)."""
        me = self.node_id

        def was_theirs(key: bytes) -> bool:
            return old is None or old.owner(key) == source

        gained = [n for n in self.owned_semaphores() if was_theirs(semaphore_key(n))]
        store = self._replicas.pop(source, None)
        replica = store.replica(now) if store is not None else Replica([], [])
        # Every peer the departed member held, also those another member is home of now: that
        # one may have no replica (it joined moments ago, or the views differed), and
        # `_push_stranded` sends them on. Semaphores are rebuilt by their homes if need be.
        # Its node may have renewed a peer after the replica, until it stepped down, about when
        # this node saw it gone: a grace period's margin covers the difference.
        margin = None if left else self._takeover_grace
        loaded = self._peers.load(replica.peers, now, provisional_margin=margin)
        for peer_id in loaded:
            self._feed.peer_changed(peer_id)
        theirs = [n for n in self._config if was_theirs(semaphore_key(n))]
        self._leases.merge(replica.semaphores, now, self._epoch, theirs)
        self._feed.semaphores_changed(theirs)
        self._stranded = True
        if self._takeover_grace > 0:
            self._leases.start_grace(now + self._takeover_grace, gained)
        if gained or loaded:
            self.takeovers += 1
        self._reassert(loaded, lambda name: True, now)
        if gained:
            for member in self._ring.members - {me}:
                self._send(member, Reassert(gained))

    def _answer_pull(self, sender: str, generation: int) -> None:
        if self._generations.get(sender) != generation:
            # Not a member yet in this node's view, or a life of it this node has not seen
            # start: the previous one must be taken over (from its replica) first, and what is
            # handed over must go to the life that asked.
            self._deferred_pulls[sender] = generation
            return
        names = [n for n in self._config if self.owner_of(n) == sender]
        # The puller may have restarted before this node noticed, and lost what its semaphores
        # held: tell it of this node's peers' locks on them first, so it counts them before it
        # serves (it holds them back until the handoff has arrived).
        self._reassert(self._peers.peer_ids(), set(names).__contains__, self._now)
        self._hand_off(sender, lambda peer_id: self.home_of(peer_id) == sender, names)

    def _push_stranded(self) -> None:
        """Send what this node holds but does not own to its owners. A pull usually fetches it;
        this covers state left behind when the node it was meant for went away first, and state
        pushed here by a node whose view of the members differed."""
        me = self.node_id
        homes = {self.home_of(peer_id) for peer_id in self._peers.peer_ids()} - {me}
        owners: dict[str, list[str]] = {}
        for name in self._config:
            owner = self.owner_of(name)
            if owner != me and self._leases.in_use(name):
                owners.setdefault(owner, []).append(name)
        for node_id in sorted(homes | set(owners)):
            if node_id is not None:
                self._hand_off(
                    node_id,
                    lambda peer_id, node_id=node_id: self.home_of(peer_id) == node_id,
                    owners.get(node_id, []),
                )
        self._stranded = False

    def _hand_off(self, node_id: str, peers: Callable[[int], bool], names: list[str]) -> None:
        """Move the peers chosen by `peers` and the semaphores `names` to `node_id`."""
        records = self._peers.take(peers, self._now)
        for record in records:
            for name in [*record.held, record.pending_semaphore]:
                if name is not None:
                    self._forget_lock(record.peer_id, name, tell_owner=False)
            self._feed.peer_removed(record.peer_id)
            self._events.append(PeerMoved(record.peer_id))
        semaphores = self._leases.snapshot(names)
        self._leases.drop(names)
        self._feed.semaphores_changed(names)
        # In parts, so that none comes near the link's frame limit.
        for start in range(0, max(len(records), 1), PART_RECORDS):
            last = start + PART_RECORDS >= len(records)
            part = records[start : start + PART_RECORDS]
            self._send(node_id, Handoff(part, semaphores if last else [], last))

    def _take_handoff(self, sender: str, handoff: Handoff) -> None:
        """Take on what another node handed over: all of it, even what this node does not own
        in its view (views may differ for a moment; `_push_stranded` sends that on)."""
        if handoff.last:
            self._awaiting.pop(sender, None)
            if self._cut.get(sender) is not None:  # pulled from it: maybe the answer
                del self._cut[sender]
        now = self._now
        loaded = self._peers.load(handoff.peers, now)
        for peer_id in loaded:
            self._feed.peer_changed(peer_id)
        names = [r.name for r in handoff.semaphores if r.name in self._config]
        self._leases.merge(handoff.semaphores, now, self._epoch, names)
        self._feed.semaphores_changed(names)
        self._reassert(loaded, lambda name: True, now)
        self._stranded = True
        self._replay_held_back()

    def _step_down(self) -> None:
        """This node sees no majority of the members it knows, so the others may take its share
        over by now (after `down_after`, and they grant nothing new before their grace ends).
        It forgets everything (the majority has the replicas) and serves nothing; once it sees
        a majority again, it rejoins like a new node and pulls its share. Fencing token counters
        and counted restores stay."""
        for record in self._peers.take(lambda peer_id: True, self._now):
            self._events.append(PeerMoved(record.peer_id))
        self._leases.drop(list(self._config))
        self._ring, self._generations = None, {}
        self._awaiting.clear()
        self._deferred_pulls.clear()
        self._cut.clear()
        self._held_back.clear()
        self._replicas.clear()
        self._tickets.clear()
        self._tokens.clear()
        self._due.clear()
        self._feed = ReplicaFeed()
        self._stranded = False
        self.step_downs += 1

    def _replay_held_back(self) -> None:
        held_back, self._held_back = self._held_back, []
        for sender, message in held_back:
            self._receive(sender, message)

    # -- internals: plumbing -----------------------------------------------------------------

    def _receive(self, sender: str, message: Message) -> None:
        match message:
            case LockRequest() | LockRestore() | LockRelease():
                self._as_owner(sender, message)
            case LockAnswer() | LockRefused():
                self._as_home(sender, message)
            case Audit():
                self._answer_audit(sender, message)
            case Reassert(names):
                self._reassert(self._peers.peer_ids(), set(names).__contains__, self._now, sender)
            case Pull(generation):
                # Whatever the sender said before it stepped down arrived before this.
                self._cut.pop(sender, None)
                self._answer_pull(sender, generation)
            case ReplicaDelta():
                store = self._replicas.setdefault(sender, ReplicaStore())
                if not store.apply(message, self._now):
                    self._send(sender, ReplicaResync())
            case ReplicaResync():
                self._feed.restart(sender)
            case Handoff() if self._ring is None:
                self._held_back.append((sender, message))
            case Handoff():
                self._take_handoff(sender, message)

    def _send(self, node_id: str | None, message: Message) -> None:
        if node_id is None:
            return
        if node_id == self.node_id:
            self._local.append(message)
        else:
            self._outbox.append((node_id, self._lives.get(node_id), message))

    def _drain_local(self) -> None:
        while self._local:
            self._receive(self.node_id, self._local.popleft())


__all__ = [
    "Audit",
    "Event",
    "Handoff",
    "LockAnswer",
    "LockGranted",
    "LockQueued",
    "LockRefused",
    "LockRelease",
    "LockRequest",
    "LockRestore",
    "Message",
    "PeerMoved",
    "PeerRemoved",
    "Pull",
    "Reassert",
    "ShardCore",
]
