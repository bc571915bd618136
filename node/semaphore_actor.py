"""The semaphore actor: one trio task owns the semaphore core's time and its mailbox.

Operations are applied in the task that asks, synchronously: trio runs synchronous code
atomically between awaits, so no lock is needed and nothing can interleave, and a request is
answered without waking another task (a WebSocket frame's requests are applied and answered in
the task that read it). Each carries a callback that gets its answer. The actor's own task sleeps
until the core's next deadline or the next parked acquire's, and takes messages from other
nodes and control messages from its memory channel, draining what is queued into one batch per
wake-up. After operations are applied elsewhere, it is told its next deadline (a cancel scope's,
so without a wake-up).

Acquires with `block_for` park here, in the actor, and are answered the moment their peer holds
all its locks, fails (peer deleted or expired), or the time is up.

The core is a `SemaphoreCore` on a single node, or a `ShardCore` in a cluster. Then messages from
other nodes come in through `deliver`, the core's outbox goes out through `send` after every
batch, and an acquire whose semaphore is owned elsewhere parks until the owner's answer arrives
(at most `DECISION_TIMEOUT`, after which "not yet" is a true answer: the lock is pending).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import random
from collections.abc import Callable

import trio

from sluicegate.cluster.errors import SemaphoreError, UnknownPeer
from sluicegate.cluster.semaphore_ops import Acquire, AcquireOutcome, Operation, Restore, apply
from sluicegate.cluster.semaphores import LockGranted, PeerRemoved, SemaphoreCore, SemaphoreStats
from sluicegate.cluster.shard import LockQueued, PeerMoved, ShardCore

log = logging.getLogger("sluicegate.semaphores")

INBOX_SIZE = 4096
NOT_YET = AcquireOutcome(False)
# How long an acquire waits for a remote owner's first answer before answering "not yet".
DECISION_TIMEOUT = 5.0


# Called with (result, None) or (None, error) when a submitted request is answered.
Answered = Callable[[object, BaseException | None], None]


class _Request:
    __slots__ = ("op", "answered", "finished", "undecided")

    def __init__(self, op: Operation, answered: Answered) -> None:
        self.op = op
        self.answered = answered
        self.finished = False
        # Parked only until the owner decides (no `block_for`): "queued" answers it.
        self.undecided = False

    def succeed(self, result: object) -> None:
        self.finished = True
        self.answered(result, None)

    def fail(self, error: BaseException) -> None:
        self.finished = True
        self.answered(None, error)


class _StopBlocking:
    """Control message: answer every parked acquire now and park no more (used at shutdown)."""

    def __init__(self) -> None:
        self.done = trio.Event()


class _Delivered:
    """A message from another node, for the core."""

    __slots__ = ("sender", "message")

    def __init__(self, sender: str, message: object) -> None:
        self.sender = sender
        self.message = message


class _MembersChanged:
    def __init__(
        self, members: dict[str, int], epoch: int, cold: bool, majority: bool, left: set[str]
    ) -> None:
        self.members = members
        self.left = left
        self.epoch = epoch
        self.cold = cold
        self.majority = majority
        self.done = trio.Event()


class _Replicate:
    """Control message: stream what changed to the other members (cluster only)."""

    def __init__(self) -> None:
        self.done = trio.Event()


class _Stats:
    def __init__(self) -> None:
        self.done = trio.Event()
        self.result: list[SemaphoreStats] = []


_Message = _Delivered | _MembersChanged | _StopBlocking | _Replicate | _Stats


class SemaphoreActor:
    def __init__(
        self,
        core: SemaphoreCore | ShardCore,
        *,
        rng: random.Random | None = None,
        send: Callable[[str, object, int | None], None] | None = None,
    ) -> None:
        self._core = core
        self._send_out = send
        self._rng = rng if rng is not None else random.Random()
        self._send, self._inbox = trio.open_memory_channel(INBOX_SIZE)
        self._parked: dict[int, list[_Request]] = {}
        self._park_deadlines: list[tuple[float, int, _Request]] = []
        self._sequence = itertools.count()
        self._blocking = True
        # The scope the actor sleeps in, while it sleeps (see `submit`).
        self._sleep: trio.CancelScope | None = None
        # A cluster's watch (`watch`): when it last looked, and after how long without a look
        # this node counts as frozen (as by SIGSTOP).
        self._watched_at: float | None = None
        self._frozen_after = math.inf
        self.freezes = 0

    async def call(self, op: Operation) -> object:
        """Apply `op` and return its answer (once decided), raising its `SemaphoreError`."""
        done = trio.Event()
        outcome: list = []

        def answered(result: object, error: BaseException | None) -> None:
            outcome.append((result, error))
            done.set()

        self.submit([(op, answered)])
        await done.wait()
        result, error = outcome[0]
        if error is not None:
            raise error
        return result

    def submit(self, requests: list[tuple[Operation, Answered]]) -> None:
        """Apply each operation now, in order; each callback gets its result or its
        `SemaphoreError`, now or (a parked acquire) later, from the actor's task."""
        now = trio.current_time()
        self._step_down_if_frozen(now)
        sleep = self._sleep
        # While the actor sleeps, nothing is due before its wake-up.
        if sleep is None or now >= sleep.deadline:
            self._expire(now)
        for op, answered in requests:
            self._apply(_Request(op, answered), now)
        self._flush_outbox()
        if sleep is not None:
            wakeup = self._next_wakeup()
            if wakeup != sleep.deadline:
                sleep.deadline = wakeup

    async def stats(self) -> list[SemaphoreStats]:
        message = _Stats()
        await self._send.send(message)
        await message.done.wait()
        return message.result

    async def deliver(self, sender: str, message: object) -> None:
        """A message from node `sender` for the core (cluster only)."""
        await self._send.send(_Delivered(sender, message))

    async def members_changed(
        self,
        members: dict[str, int],
        epoch: int,
        cold: bool,
        majority: bool,
        left: set[str] = frozenset(),
    ) -> None:
        """The live members (id -> generation) changed (cluster only); those in `left` said
        goodbye."""
        message = _MembersChanged(members, epoch, cold, majority, set(left))
        await self._send.send(message)
        await message.done.wait()

    async def replicate(self) -> None:
        """Stream what changed to the other members (`ShardCore.replicate`); returns once the
        messages are queued on the links."""
        message = _Replicate()
        await self._send.send(message)
        await message.done.wait()

    async def stop_blocking(self) -> None:
        message = _StopBlocking()
        await self._send.send(message)
        await message.done.wait()

    @property
    def core(self) -> SemaphoreCore | ShardCore:
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
                self._answer_all_parked()
                return
            finally:
                self._sleep = None
            while True:
                try:
                    batch.append(inbox.receive_nowait())
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
            now = trio.current_time()
            self._step_down_if_frozen(now)
            self._expire(now)
            for message in batch:
                self._handle(message, now)
            self._flush_outbox()

    def watch(self, now: float, frozen_after: float) -> None:
        """The cluster's watch looks in (every `WATCH_INTERVAL`): if it could not for
        `frozen_after`, the whole process was frozen, and the other members may have taken this
        node's share over meanwhile (the caller passes `down_after` less a gossip interval)."""
        self._frozen_after = frozen_after
        if self._watched_at is not None and now - self._watched_at > frozen_after:
            # Left as it was, for the actor to see the gap and step down before anything else.
            if self._sleep is not None:
                self._sleep.deadline = now
            return
        self._watched_at = now

    # -- internals ---------------------------------------------------------------------------

    def _step_down_if_frozen(self, now: float) -> None:
        """Before anything else on waking from a freeze (timers due, requests, messages that
        waited), drop this node's share and serve nothing: acting on state the others took
        over meanwhile would expire peers renewed elsewhere, grant from stale queues, and give
        tokens below theirs. The watch sees the step-down (`freezes`) and rejoins, pulling."""
        if self._watched_at is None or now - self._watched_at <= self._frozen_after:
            return
        log.warning(
            "Frozen for %.1f s: serving nothing until this node rejoins.", now - self._watched_at
        )
        self._watched_at = now
        self.freezes += 1
        self._core.change_members({}, now, 0, majority=False)
        self._dispatch_events()

    def _next_wakeup(self) -> float:
        deadline = self._core.next_deadline()
        deadlines = self._park_deadlines
        while deadlines and deadlines[0][2].finished:
            heapq.heappop(deadlines)
        if deadlines:
            deadline = deadlines[0][0] if deadline is None else min(deadline, deadlines[0][0])
        return math.inf if deadline is None else deadline

    def _expire(self, now: float) -> None:
        expired = self._core.expire(now)
        if expired:
            log.warning("Removed %d peers due to expiration.", len(expired))
        self._dispatch_events()
        deadlines = self._park_deadlines
        while deadlines and deadlines[0][0] <= now:
            _, _, request = heapq.heappop(deadlines)
            if not request.finished:
                # Out of patience: the lock stays pending, the answer is "not yet".
                self._unpark(request)
                request.succeed(NOT_YET)

    def _handle(self, message: _Message, now: float) -> None:
        if isinstance(message, _Delivered):
            self._core.on_message(message.sender, message.message, now)
            self._dispatch_events()
            return
        if isinstance(message, _MembersChanged):
            self._core.change_members(
                message.members, now, message.epoch, message.cold, message.majority, message.left
            )
            self._dispatch_events()
        elif isinstance(message, _Stats):
            message.result = self._core.stats(now)
        elif isinstance(message, _Replicate):
            self._core.replicate(now)
            self._flush_outbox()
        elif isinstance(message, _StopBlocking):
            self._blocking = False
            self._answer_all_parked()
        message.done.set()

    def _apply(self, request: _Request, now: float) -> None:
        op = request.op
        try:
            result = apply(self._core, op, now, self._rng)
        except SemaphoreError as error:
            request.fail(error)
        else:
            if not isinstance(op, Acquire):
                request.succeed(result)
            elif result:
                request.succeed(self._granted(op))
            elif op.block_for and op.block_for > 0 and self._blocking:
                self._park(request, now + op.block_for)
            elif result is None and self._blocking:
                request.undecided = True
                self._park(request, now + DECISION_TIMEOUT)
            else:
                request.succeed(NOT_YET)
            if isinstance(op, Restore):
                # Throttle warns about revenants too: frequent ones mean expiries are too short.
                log.warning(
                    "Revenant peer %d restored with locks %s.", op.peer_id, dict(op.acquired)
                )
        self._dispatch_events()

    def _park(self, request: _Request, deadline: float) -> None:
        self._parked.setdefault(request.op.peer_id, []).append(request)
        heapq.heappush(self._park_deadlines, (deadline, next(self._sequence), request))

    def _flush_outbox(self) -> None:
        if self._send_out is not None:
            for node_id, generation, message in self._core.outbox():
                self._send_out(node_id, message, generation)

    def _dispatch_events(self) -> None:
        for event in self._core.events():
            if isinstance(event, LockGranted):
                for request in self._parked.pop(event.peer_id, ()):
                    request.succeed(self._granted(request.op))
            elif isinstance(event, PeerRemoved):
                for request in self._parked.pop(event.peer_id, ()):
                    request.fail(UnknownPeer(event.peer_id))
            elif isinstance(event, PeerMoved):
                for request in self._parked.pop(event.peer_id, ()):
                    request.succeed(NOT_YET)
            elif isinstance(event, LockQueued):
                for request in list(self._parked.get(event.peer_id, ())):
                    if request.undecided:
                        self._unpark(request)
                        request.succeed(NOT_YET)

    def _granted(self, op: Acquire) -> AcquireOutcome:
        return AcquireOutcome(True, self._core.fencing_token(op.peer_id, op.semaphore))

    def _unpark(self, request: _Request) -> None:
        peer_id = request.op.peer_id
        waiting = self._parked.get(peer_id)
        if waiting is not None:
            waiting.remove(request)
            if not waiting:
                del self._parked[peer_id]

    def _answer_all_parked(self) -> None:
        parked, self._parked = self._parked, {}
        self._park_deadlines.clear()
        for requests in parked.values():
            for request in requests:
                request.succeed(NOT_YET)
