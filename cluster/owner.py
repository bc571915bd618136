"""The owner role: the semaphores of the slots this node acts for. Check 9, the FIFO queue and
fencing tokens live in `SemaphoreLeases`; this adds the conversation with homes
(`cluster/lock_messages.py`):

* a request, restore or release from a home is applied if its ticket is not below the latest
  known of the peer, and answered (a grant with its token, or "waits");
* a grant to a waiter goes to the waiter's home, which answers `LockTaken`;
* a release the home waits on (`confirm`) is answered `LockReleased` once the grants it caused
  were taken (or `TAKEN_PATIENCE` passed), so that whoever asks next, anywhere, sees them;
* every `AUDIT_INTERVAL` the owner asks homes whether they still want the locks it counts for
  their peers (a release lost with a life on the way is found so); with more locks than
  `AUDIT_RATE` asks a second keeps up with, less often.

Pure: `now` comes in; where a peer's home is comes from `home_of`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from .lock_messages import (
    Audit,
    HomeToOwner,
    LockAnswer,
    LockRelease,
    LockReleased,
    LockRequest,
    LockRestore,
    LockTaken,
)
from .semaphore_leases import (
    LockRecord,
    SemaphoreConfig,
    SemaphoreLeases,
    SemaphoreRecord,
    SemaphoreStats,
    lock_key,
)

AUDIT_INTERVAL = 2.0
# Locks asked about per second at most, over an audit: 100,000 waiting locks audited every 2 s
# kept a node busy with little else.
AUDIT_RATE = 10_000
# Locks asked about in one step at most: the rest in the next steps, after whatever else is
# ready (an audit of tens of thousands of waiting locks in one step held a node up, and 2,000 a
# step took 15 to 20 ms).
AUDIT_CHUNK = 500
# A release waits at most this long for the homes of the waiters it granted to take them.
TAKEN_PATIENCE = 1.0


@dataclass
class _ReleaseAck:
    """`LockReleased` to `home`, once the grants (peer id, ticket) in `waiting` were taken."""

    home: str
    answer: LockReleased
    until: float
    waiting: set[tuple[int, int]] = field(default_factory=set)


class Owner:
    def __init__(
        self,
        semaphores: Mapping[str, SemaphoreConfig],
        home_of: Callable[[int], str | None],
        *,
        cold_start_grace: float = 0.0,
    ) -> None:
        self.leases = SemaphoreLeases(semaphores)
        self._home_of = home_of
        self._cold_start_grace = cold_start_grace
        # The semaphores whose slot this node acts for.
        self._acting: set[str] = set()
        # Changed since the last `changed()`, to be written: semaphore -> the peers whose lock
        # there may have changed.
        self._dirty: dict[str, set[int]] = {}
        self._acks: list[_ReleaseAck] = []
        self._audit_at = -math.inf
        # The locks of the audit under way not asked about yet: a list per semaphore, both
        # taken from the end.
        self._to_audit: list[tuple[str, list[tuple[int, int]]]] = []
        self._outbox: list[tuple[str, object]] = []

    # -- slots ------------------------------------------------------------------------------

    def gain(
        self,
        names: Iterable[str],
        records: Iterable[SemaphoreRecord | LockRecord],
        now: float,
        epoch: int,
        cold: bool,
    ) -> None:
        """Act for the semaphores `names` from now on, from their `records`; tokens go on in
        `epoch` at least. After a cold start, `cold_start_grace` lets restores in first."""
        names = list(names)
        self.leases.start_epoch(names, epoch)
        self.leases.load(records, now, epoch)
        self._acting.update(names)
        if cold and self._cold_start_grace > 0:
            self.leases.start_grace(now + self._cold_start_grace, names)
        self._audit_at = min(self._audit_at, now + AUDIT_INTERVAL)

    def lose(self, names: Iterable[str]) -> None:
        names = set(names)
        self.leases.drop(names)
        self._acting -= names
        for name in names:
            self._dirty.pop(name, None)
        self._acks = [ack for ack in self._acks if ack.answer.semaphore not in names]

    def acts_for(self, name: str) -> bool:
        return name in self._acting

    # -- the conversation with homes ---------------------------------------------------------

    def receive(self, sender: str, message: HomeToOwner, now: float) -> None:
        """A message from a home about a semaphore this node acts for."""
        name = message.semaphore
        leases = self.leases
        if isinstance(message, LockTaken):
            for ack in self._acks:
                ack.waiting.discard((message.peer_id, message.ticket))
            self._send_acks(now)
            return
        self._dirty.setdefault(name, set()).add(message.peer_id)
        if isinstance(message, LockRelease):
            leases.release(message.peer_id, name, message.ticket)
            ack = _ReleaseAck(
                sender,
                LockReleased(message.peer_id, name, message.ticket),
                now + TAKEN_PATIENCE,
            )
            ack.waiting.update(self._deliver_grants())
            if message.confirm:
                self._acks.append(ack)
                self._send_acks(now)
            return
        if isinstance(message, LockRequest):
            granted = leases.request(message.peer_id, name, message.count, now, message.ticket)
        else:
            assert isinstance(message, LockRestore)
            granted = leases.restore(message.peer_id, name, message.count, message.ticket) or None
        if granted is None:
            return  # a ticket below the latest: stale
        token = leases.grant(message.peer_id, name)[1] if granted else 0
        self._outbox.append(
            (sender, LockAnswer(message.peer_id, name, message.ticket, granted, token))
        )
        self._deliver_grants()

    def _deliver_grants(self) -> list[tuple[int, int]]:
        """Tell the homes of the waiters just granted; (peer id, ticket) of each."""
        delivered = []
        for grant in self.leases.events():
            self._dirty.setdefault(grant.semaphore, set()).add(grant.peer_id)
            ticket, token = self.leases.grant(grant.peer_id, grant.semaphore)
            home = self._home_of(grant.peer_id)
            if home is not None:
                self._outbox.append(
                    (home, LockAnswer(grant.peer_id, grant.semaphore, ticket, True, token))
                )
            delivered.append((grant.peer_id, ticket))
        return delivered

    def _send_acks(self, now: float) -> None:
        kept = []
        for ack in self._acks:
            if ack.waiting and now < ack.until:
                kept.append(ack)
            else:
                self._outbox.append((ack.home, ack.answer))
        self._acks = kept

    # -- reads ------------------------------------------------------------------------------

    def remainder(self, name: str) -> int:
        return self.leases.remainder(name)

    def stats(self, now: float) -> list[SemaphoreStats]:
        return self.leases.stats(now, sorted(self._acting))

    # -- time -------------------------------------------------------------------------------

    def next_deadline(self) -> float:
        deadlines = [ack.until for ack in self._acks]
        grace = self.leases.grace_until
        if grace is not None:
            deadlines.append(grace)
        if self._to_audit:
            deadlines.append(-math.inf)
        elif self.leases.any_in_use():
            deadlines.append(self._audit_at)
        return min(deadlines, default=math.inf)

    def tick(self, now: float) -> None:
        """End grace periods, send release answers whose patience ran out, and audit."""
        if self.leases.end_grace(now):
            self._deliver_grants()
        self._send_acks(now)
        if now >= self._audit_at and not self._to_audit:
            self._to_audit = [
                (name, self.leases.holdings(name)[::-1])
                for name in sorted(self._acting, reverse=True)
                if self.leases.in_use(name)
            ]
            locks = sum(len(holdings) for _, holdings in self._to_audit)
            self._audit_at = now + max(AUDIT_INTERVAL, locks / AUDIT_RATE)
        self._audit()

    def _audit(self) -> None:
        """Ask the homes whether they still want `AUDIT_CHUNK` of the locks they hold or wait
        for; a lock released since the audit began is asked about under its old ticket, which
        a home's answer cannot release again."""
        asks: dict[str, Audit] = {}
        left = AUDIT_CHUNK
        while self._to_audit and left:
            name, holdings = self._to_audit[-1]
            if name not in self._acting:
                self._to_audit.pop()
                continue
            chunk = holdings[-left:]
            del holdings[-left:]
            if not holdings:
                self._to_audit.pop()
            left -= len(chunk)
            for peer_id, ticket in reversed(chunk):
                home = self._home_of(peer_id)
                if home is None:
                    continue
                audit = asks.setdefault(home, Audit([], [], []))
                audit.peer_ids.append(peer_id)
                audit.semaphores.append(name)
                audit.tickets.append(ticket)
        self._outbox.extend(asks.items())

    # -- outputs ----------------------------------------------------------------------------

    def changed(self) -> list[tuple[str, list[SemaphoreRecord | LockRecord], list[str]]]:
        """What changed since the last call, to be written, semaphore by semaphore: its name,
        its own record and those of its locks that changed, and the keys of those gone."""
        if not self._dirty:
            return []
        dirty, self._dirty = self._dirty, {}
        changes = []
        for name in sorted(dirty):
            records: list[SemaphoreRecord | LockRecord] = [self.leases.header(name)]
            gone = []
            for peer_id in sorted(dirty[name]):
                lock = self.leases.lock_record(name, peer_id)
                if lock is None:
                    gone.append(lock_key(name, peer_id))
                else:
                    records.append(lock)
            changes.append((name, records, gone))
        return changes

    def outbox(self) -> list[tuple[str, object]]:
        outbox, self._outbox = self._outbox, []
        return outbox
