"""The shard actor: one trio task owns a cluster node's `Shard` (cluster/shard.py) and its time.

Client operations and messages from other nodes are applied in the task that brings them,
synchronously: trio runs synchronous code atomically between awaits, so nothing interleaves and
no lock is needed. After each, what the shard released goes out: answers to their callbacks,
messages to the links, slot changes to the rate limits. The actor's own task sleeps until the
shard's next deadline (by the node's clock) and ticks it; whoever changes the deadline moves
its wake-up.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import trio

from sluicegate.cluster.departures import Claim, Departed
from sluicegate.cluster.semaphore_ops import Operation
from sluicegate.cluster.shard import Shard, SlotChange, SlotGained

from .clock import TRIO_CLOCK, Clock
from .semaphore_actor import Answers, Askers, answer

log = logging.getLogger("sluicegate.slots")
# Slot changes are logged as one line at most this often (a change of members moves dozens).
LOG_EVERY = 1.0


class ShardActor:
    def __init__(
        self,
        shard: Shard,
        *,
        send_together: Callable[[list[tuple[str, object]]], None],
        on_slot_changes: Callable[[list[SlotChange]], None] = lambda changes: None,
        keep_era: Callable[[int], None] = lambda era: None,
        on_claims: Callable[[tuple[Claim, ...]], None] = lambda claims: None,
        clock: Clock = TRIO_CLOCK,
    ) -> None:
        self.shard = shard
        self._send_together = send_together
        # Keeps the era on disk (node/state_file.py) before a message of it leaves.
        self._keep_era = keep_era
        self._kept_era = 0
        self._slow = False
        # What the ownership settled of departed members, for the membership to gossip.
        self._on_claims = on_claims
        self._claims_revision = 0
        self._on_slot_changes = on_slot_changes
        self._clock = clock
        self._ids = itertools.count(1)
        # Who waits for each request still unanswered.
        self._askers = Askers()
        # The scope the actor sleeps in, while it sleeps.
        self._sleep: trio.CancelScope | None = None
        # Messages were applied that no flush has written yet.
        self._unflushed = False
        # Slot changes not logged yet: gained, lost, resigned; and when the next line is due.
        self._unlogged = [0, 0, 0]
        self._log_at = math.inf
        self._logged_at = -math.inf

    @property
    def node_id(self) -> str:
        return self.shard.me

    # -- inputs -----------------------------------------------------------------------------

    def submit(self, requests: Iterable[tuple[Operation, int]], answers: Answers) -> None:
        """Apply each operation now, in order; `answers` hears of each by its key, its result
        or its error, now or later (once what it follows is committed), unless it withdraws
        first."""
        now = self._clock.now()
        for op, key in requests:
            request_id = next(self._ids)
            self._askers.add(request_id, answers, key)
            self.shard.submit(request_id, op, now)
        self._after()

    def withdraw(self, answers: Answers) -> None:
        """Forget the requests `answers` submitted that still wait: it never hears of them."""
        for request_id in self._askers.withdraw(answers):
            self.shard.withdraw(request_id)
        self._after()

    async def call(self, op: Operation) -> Any:
        """Apply `op` and return its answer, raising its error."""
        return await answer(self, op)

    def deliver(self, sender: str, message: object) -> None:
        """A message from node `sender`: applied now, written and answered at the next
        `flush`, once the messages that came with it are applied too (one write per slot)."""
        self.shard.receive(sender, message, self._clock.now())
        self._unflushed = True

    def flush(self) -> None:
        """Write what the messages delivered changed, and send what the commits allow: in the
        task that delivered them, which saves the hop a wake-up of the actor's task."""
        if self._unflushed:
            self.shard.flush(self._clock.now())
            self._after()

    def members_changed(self, live: Mapping[str, int], voters: Iterable[str]) -> None:
        """The live members (id -> life) or the voters (members not gone for good) changed."""
        self.shard.members_changed(live, voters, self._clock.now())
        self._after()

    def departures_changed(
        self, departed: frozenset[Departed], unsettled: frozenset[Departed]
    ) -> None:
        """The lives of the members that left or were forgotten, and those not yet settled
        (`Ownership.departures_changed`)."""
        self.shard.ownership.departures_changed(departed, unsettled, self._clock.now())
        self._after()

    def unknown_seeds(self, count: int) -> None:
        """See `Ownership.unknown_seeds`."""
        self.shard.ownership.unknown_seeds(count)

    def knows_the_voters(self) -> None:
        """The membership heard from every member it knows of (`Ownership.knows_the_voters`)."""
        self.shard.knows_the_voters(self._clock.now())
        self._after()

    async def leave(self, timeout: float) -> None:
        """Answer every parked acquire and park none any more, then hand every slot on before
        this node says goodbye; at most `timeout` for the slots."""
        # The loop runs between chunks of answers: tens of thousands at once stalled it.
        while self.shard.stop_blocking(self._clock.now()):
            self._after()
            await self._clock.sleep(0)
        self.shard.leave(self._clock.now())
        self._after()
        with self._clock.move_on_after(timeout):
            while self.shard.ownership.acting_slots(self._clock.now()):
                await self._clock.sleep(0.005)

    # -- the actor's own task ---------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        clock = self._clock
        while True:
            with clock.move_on_at(self._wake_at()) as self._sleep:
                await trio.sleep_forever()
            self._sleep = None
            now = clock.now()
            if now >= self.shard.next_deadline():
                self.shard.tick(now)
            else:
                self.shard.flush(now)
            self._after()

    # -- internals --------------------------------------------------------------------------

    def _after(self) -> None:
        self._unflushed = False
        shard = self.shard
        told: dict[Answers, list[tuple[int, object, BaseException | None]]] = {}
        for done in shard.answers():
            asker = self._askers.pop(done.request_id)
            if asker is not None:
                answers, key = asker
                told.setdefault(answers, []).append((key, done.result, done.error))
        for answers, outcomes in told.items():
            answers.answered_together(outcomes)
        era = shard.ownership.kept_era
        if era > self._kept_era:
            self._keep_era(era)
            self._kept_era = era
        self._send_together(shard.outbox())
        revision = shard.ownership.claims_revision
        if revision != self._claims_revision:
            self._claims_revision = revision
            self._on_claims(shard.ownership.claims())
        if shard.ownership.slow != self._slow:
            self._slow = shard.ownership.slow
            self._log_pace()
        changes = shard.slot_changes()
        if changes:
            self._note(changes)
            self._on_slot_changes(changes)
        if self._clock.now() >= self._log_at:
            self._log()
        sleep = self._sleep
        if sleep is not None:
            deadline = self._wake_at()
            if deadline != self._clock.deadline_of(sleep):
                self._clock.reschedule(sleep, deadline)

    def _wake_at(self) -> float:
        return min(self.shard.next_deadline(), self._log_at)

    def _log_pace(self) -> None:
        if self._slow:
            log.warning(
                "This node's lease rounds take over %.2f s to reach a quorum: its links to most "
                "members are slow. It hands its slots on, and the members name it for none "
                "until its rounds are fast again.",
                self.shard.ownership.lease / 4,
            )
        else:
            log.info("This node's lease rounds reach a quorum quickly again: it takes slots again.")

    def _note(self, changes: list[SlotChange]) -> None:
        for change in changes:
            if isinstance(change, SlotGained):
                self._unlogged[0] += 1
            else:
                self._unlogged[1 + change.resigned] += 1
        if self._log_at == math.inf:
            self._log_at = max(self._clock.now(), self._logged_at + LOG_EVERY)

    def _log(self) -> None:
        gained, lost, resigned = self._unlogged
        now = self._clock.now()
        log.info(
            "Slots: %d gained, %d lost, %d resigned; acting for %d now.",
            gained,
            lost,
            resigned,
            len(self.shard.ownership.acting_slots(now)),
        )
        self._unlogged = [0, 0, 0]
        self._logged_at, self._log_at = now, math.inf
