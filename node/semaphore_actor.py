"""The semaphore actor of a single node: one trio task owns the semaphore core's time and its
mailbox (a cluster node runs a `ShardActor`, node/shard_actor.py, instead).

Operations are applied in the task that asks, synchronously: trio runs synchronous code
atomically between awaits, so no lock is needed and nothing can interleave, and a request is
answered without waking another task (a WebSocket frame's requests are applied and answered in
the task that read it). Each comes with a key of its submitter's, which hears of its answer by
that key (`Answers`). The actor's own task sleeps until the core's next deadline or the next
parked acquire's, and takes messages from other nodes and control messages from its memory
channel, draining what is queued into one batch per wake-up. After operations are applied
elsewhere, it is told its next deadline (a cancel scope's, so without a wake-up).

Acquires with `block_for` park here, in the actor, and are answered the moment their peer holds
all its locks, fails (peer deleted or expired), or the time is up; or forgotten, when whoever
asked (a connection, a call) withdraws.
"""

from __future__ import annotations

import itertools
import logging
import random
from typing import Any, Protocol

import trio

from sluicegate.cluster.errors import SemaphoreError, UnknownPeer
from sluicegate.cluster.limits import DEFAULT_LIMITS, Limits
from sluicegate.cluster.parked import STOP_CHUNK, ParkedAcquire, ParkedAcquires
from sluicegate.cluster.peers import EXPIRE_CHUNK
from sluicegate.cluster.semaphore_ops import Acquire, AcquireOutcome, Operation, Restore, apply
from sluicegate.cluster.semaphores import LockGranted, PeerRemoved, SemaphoreCore, SemaphoreStats

log = logging.getLogger("sluicegate.semaphores")

INBOX_SIZE = 4096
NOT_YET = AcquireOutcome(False)


class Answers(Protocol):
    """Whoever submits requests to an actor: told each one's outcome by the key it gave it."""

    def answered(self, key: int, result: object, error: BaseException | None) -> None:
        """The outcome of request `key`: (result, None) or (None, error)."""

    def answered_together(self, outcomes: list[tuple[int, object, BaseException | None]]) -> None:
        """Outcomes that came at once, (key, result, error) each: `answered` for each, in
        order, and then whatever an answer sets going (a frame to the client) goes once."""


class Actor(Protocol):
    """What applies semaphore operations: this module's actor, or a cluster node's shard actor."""

    def submit(self, requests: list[tuple[Operation, int]], answers: Answers) -> None:
        """Apply operations now, in order; `answers` hears of each by its key, now or later."""

    def withdraw(self, answers: Answers) -> None:
        """Forget what `answers` submitted and still waits: it will never hear of it."""


class _Outcome:
    __slots__ = ("done", "value")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.value: tuple[object, BaseException | None] | None = None

    def answered(self, key: int, result: object, error: BaseException | None) -> None:
        self.value = (result, error)
        self.done.set()

    def answered_together(self, outcomes: list[tuple[int, object, BaseException | None]]) -> None:
        for outcome in outcomes:
            self.answered(*outcome)


async def answer(actor: Actor, op: Operation) -> Any:
    """Submit `op` to an actor and wait for the answer, raising its error. Cancelled, the call
    withdraws `op` if it still waits."""
    outcome = _Outcome()
    actor.submit([(op, 0)], outcome)
    try:
        await outcome.done.wait()
    finally:
        if outcome.value is None:
            actor.withdraw(outcome)
    assert outcome.value is not None  # set before `done`
    result, error = outcome.value
    if error is not None:
        raise error
    return result


class Askers:
    """Who waits for which of an actor's requests: request id -> (asker, its key). Kept as
    plain values, which the garbage collector stops walking once it has seen them, however many
    requests wait; the askers themselves (a connection, a call) are few."""

    def __init__(self) -> None:
        self._waiting: dict[int, tuple[int, int]] = {}
        self._askers: dict[int, Answers] = {}
        self._of_asker: dict[int, dict[int, None]] = {}

    def __len__(self) -> int:
        return len(self._waiting)

    def add(self, request_id: int, answers: Answers, key: int) -> None:
        asker = id(answers)  # unique while `_askers` keeps `answers`
        self._waiting[request_id] = (asker, key)
        self._askers[asker] = answers
        self._of_asker.setdefault(asker, {})[request_id] = None

    def pop(self, request_id: int) -> tuple[Answers, int] | None:
        """Who waits for `request_id`, and by which key; None if nobody (any more)."""
        entry = self._waiting.pop(request_id, None)
        if entry is None:
            return None
        asker, key = entry
        answers = self._askers[asker]
        requests = self._of_asker[asker]
        del requests[request_id]
        if not requests:
            del self._of_asker[asker], self._askers[asker]
        return answers, key

    def withdraw(self, answers: Answers) -> list[int]:
        """Forget what `answers` waits for; those request ids."""
        asker = id(answers)
        if self._askers.get(asker) is not answers:
            return []
        del self._askers[asker]
        request_ids = list(self._of_asker.pop(asker))
        for request_id in request_ids:
            del self._waiting[request_id]
        return request_ids


class _StopBlocking:
    """Control message: park no more acquires and answer up to `STOP_CHUNK` of those parked
    (used at shutdown); `more` says whether some are left."""

    def __init__(self) -> None:
        self.done = trio.Event()
        self.more = False


class _Stats:
    def __init__(self) -> None:
        self.done = trio.Event()
        self.result: list[SemaphoreStats] = []


_Message = _StopBlocking | _Stats


class SemaphoreActor:
    def __init__(
        self,
        core: SemaphoreCore,
        *,
        rng: random.Random | None = None,
        limits: Limits = DEFAULT_LIMITS,
    ) -> None:
        self._core = core
        self._limits = limits
        # Peer ids must not be guessable from the ones a client has seen: the system's source.
        self._rng = rng if rng is not None else random.SystemRandom()
        self._send, self._inbox = trio.open_memory_channel(INBOX_SIZE)
        # Parked acquires, by a number of the actor's own, and who waits for each.
        self._parked = ParkedAcquires()
        self._askers = Askers()
        self._ids = itertools.count(1)
        self._blocking = True
        # The scope the actor sleeps in, while it sleeps (see `submit`).
        self._sleep: trio.CancelScope | None = None

    async def call(self, op: Operation) -> Any:
        """Apply `op` and return its answer (once decided), raising its `SemaphoreError`."""
        return await answer(self, op)

    def submit(self, requests: list[tuple[Operation, int]], answers: Answers) -> None:
        """Apply each operation now, in order; `answers` hears of each by its key, its result
        or its `SemaphoreError`, now or (a parked acquire) later, from the actor's task, unless
        it withdraws first."""
        now = trio.current_time()
        sleep = self._sleep
        # While the actor sleeps, nothing is due before its wake-up.
        if sleep is None or now >= sleep.deadline:
            self._expire(now)
        for op, key in requests:
            self._apply(op, key, answers, now)
        self._reschedule()

    def withdraw(self, answers: Answers) -> None:
        """Forget the parked acquires `answers` submitted: it will never hear of them."""
        for parked_id in self._askers.withdraw(answers):
            self._parked.withdraw(parked_id)
        self._reschedule()

    async def stats(self) -> list[SemaphoreStats]:
        message = _Stats()
        await self._send.send(message)
        await message.done.wait()
        return message.result

    async def stop_blocking(self) -> None:
        """Answer every parked acquire "not yet", and park none any more. In chunks, so that
        the loop runs between them: tens of thousands at once stalled it."""
        while True:
            message = _StopBlocking()
            await self._send.send(message)
            await message.done.wait()
            if not message.more:
                return

    @property
    def core(self) -> SemaphoreCore:
        """For reading gauges at scrape time; everything else goes through messages."""
        return self._core

    @property
    def restores_beyond_max(self) -> int:
        """Restores that left a semaphore above its max, over this node's life."""
        return self._core.restores_beyond_max

    def close(self) -> None:
        self._send.close()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        inbox = self._inbox
        while True:
            batch = []
            try:
                with trio.move_on_at(self._next_wakeup()) as self._sleep:
                    batch.append(await inbox.receive())
            except trio.EndOfChannel:
                self._blocking = False
                self._answer_parked_first(len(self._parked))
                return
            finally:
                self._sleep = None
            while True:
                try:
                    batch.append(inbox.receive_nowait())
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
            now = trio.current_time()
            self._expire(now)
            for message in batch:
                self._handle(message, now)

    # -- internals ---------------------------------------------------------------------------

    def _reschedule(self) -> None:
        sleep = self._sleep
        if sleep is not None:
            wakeup = self._next_wakeup()
            if wakeup != sleep.deadline:
                sleep.deadline = wakeup

    def _next_wakeup(self) -> float:
        deadline = self._core.next_deadline()
        parked = self._parked.next_deadline()
        return parked if deadline is None else min(deadline, parked)

    def _expire(self, now: float) -> None:
        # In chunks, each a step of its own (`EXPIRE_CHUNK`).
        expired = self._core.expire(now, most=EXPIRE_CHUNK)
        if expired:
            log.warning("Removed %d peers due to expiration.", len(expired))
        self._dispatch_events()
        for parked in self._parked.due(now):
            # Out of patience: the lock stays pending, the answer is "not yet".
            self._answer_parked(parked, NOT_YET)

    def _handle(self, message: _Message, now: float) -> None:
        if isinstance(message, _Stats):
            message.result = self._core.stats(now)
        elif isinstance(message, _StopBlocking):
            self._blocking = False
            self._answer_parked_first(STOP_CHUNK)
            message.more = len(self._parked) > 0
        message.done.set()

    def _apply(self, op: Operation, key: int, answers: Answers, now: float) -> None:
        try:
            if isinstance(op, Acquire):
                self._limits.make_room_to_wait(
                    op, self._parked.count_of(op.peer_id), len(self._parked)
                )
            result = apply(self._core, op, now, self._rng)
        except SemaphoreError as error:
            answers.answered(key, None, error)
        else:
            if not isinstance(op, Acquire):
                answers.answered(key, result, None)
            elif result:
                answers.answered(key, self._granted(op), None)
            elif op.block_for and op.block_for > 0 and self._blocking:
                parked_id = next(self._ids)
                self._parked.park(parked_id, op, now + op.block_for, undecided=False)
                self._askers.add(parked_id, answers, key)
            else:
                answers.answered(key, NOT_YET, None)
            if isinstance(op, Restore):
                # Throttle warns about revenants too: frequent ones mean expiries are too short.
                log.warning(
                    "Revenant peer %d restored with locks %s.", op.peer_id, dict(op.acquired)
                )
        self._dispatch_events()

    def _dispatch_events(self) -> None:
        for event in self._core.events():
            if isinstance(event, LockGranted):
                for parked in self._parked.take_peer(event.peer_id):
                    self._answer_parked(parked, self._granted(parked.op))
            elif isinstance(event, PeerRemoved):
                for parked in self._parked.take_peer(event.peer_id):
                    self._answer_parked(parked, None, UnknownPeer(event.peer_id))

    def _granted(self, op: Acquire) -> AcquireOutcome:
        return AcquireOutcome(True, self._core.fencing_token(op.peer_id, op.semaphore))

    def _answer_parked(
        self, parked: ParkedAcquire, result: object, error: BaseException | None = None
    ) -> None:
        """Answer a parked acquire taken out of `_parked`."""
        asker = self._askers.pop(parked.request_id)
        assert asker is not None  # every parked acquire has its asker
        answers, key = asker
        answers.answered(key, result, error)

    def _answer_parked_first(self, most: int) -> None:
        """Answer "not yet" the `most` acquires parked longest ago."""
        for parked in self._parked.take_first(most):
            self._answer_parked(parked, NOT_YET)
