"""Calls between nodes: an operation goes to another node over its link, and the answer comes back.

`Rpc.call` sends a `Call` with a fresh id and waits for its `Reply` (the result) or `Failure` (a
domain error, rebuilt here from its class name and arguments, so callers see the same exception
they would see locally). A call that cannot get an answer, because there is no link, the time ran
out, or the other node cannot serve it, raises `Unavailable`, which the HTTP shell answers with 503:
the stock client retries it, and no wrong answer is ever given.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import trio

from sluicegate.cluster import errors
from sluicegate.cluster.quota_leases import Grant
from sluicegate.cluster.rate_algorithms import Decision
from sluicegate.cluster.rate_limits import RateOperation
from sluicegate.cluster.semaphore_ops import (
    AcquireOutcome,
    Operation,
)

from .clock import TRIO_CLOCK, Clock
from .links import STALL_AFTER, Link

log = logging.getLogger("sluicegate.rpc")


class Unavailable(Exception):
    """No node can serve this request right now (HTTP 503); trying again later may work."""


class Unreachable(Unavailable):
    """This node cannot reach the one that serves the request, though others may: there is no
    link to it, or the link is stalled while others still hear from it. The client had better
    ask elsewhere."""


@dataclass(frozen=True, slots=True)
class Call:
    call_id: int
    op: Operation | RateOperation


@dataclass(frozen=True, slots=True)
class Reply:
    call_id: int
    result: AcquireOutcome | Decision | list[Decision] | Grant | bool | int | list[int] | None


@dataclass(frozen=True, slots=True)
class Failure:
    call_id: int
    error: str  # a SemaphoreError or RateLimitError class name, or "Unavailable"
    args: list[int | str]


_ERRORS: dict[str, type[Exception]] = {
    cls.__name__: cls
    for cls in (
        errors.UnknownSemaphore,
        errors.UnknownPeer,
        errors.LockNeverAcquirable,
        errors.LockHierarchyViolation,
        errors.AlreadyPending,
        errors.InvalidLockCount,
        errors.RestoreConflict,
        errors.ShrinkingLockCount,
        errors.StaleOperation,
        errors.NotServing,
        errors.NotServingCutOff,
        errors.UnknownLimiter,
        errors.InvalidWeight,
        Unavailable,
        Unreachable,
    )
}


class _Slot:
    __slots__ = ("node_id", "done", "message")

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self.done = trio.Event()
        self.message: Reply | Failure | None = None


class CallLinks(Protocol):
    """What calls need of the node's links (node/links.py): the link to a node, to tell whether
    it is up and whether it stalls, and a message sent on it."""

    def find(self, remote_id: str) -> Link | None: ...

    def send(self, remote_id: str, message: object) -> object: ...


class Rpc:
    def __init__(
        self,
        links: CallLinks,
        clock: Clock = TRIO_CLOCK,
        news_twice_at: Callable[[str], float | None] = lambda node_id: None,
    ) -> None:
        """`clock` times the calls' timeouts, in the node's time; `news_twice_at(node_id)` is when
        this node had had news of that node's life twice from anyone, as of now (its gossip
        heartbeat advanced twice: `Membership.advanced_twice_at`), or None."""
        self._links = links
        self._clock = clock
        self._news_twice_at = news_twice_at
        self._ids = itertools.count(1)
        self._waiting: dict[int, _Slot] = {}

    async def call(self, node_id: str, op: Operation | RateOperation, timeout: float) -> Any:
        """Run `op` on node `node_id`; its result, its domain error, or `Unavailable`.

        `Unreachable` at once if the link is down or stalled while others still hear from
        `node_id`: a fault between the two, which waiting out `timeout` would only make the
        client wait out too. Down or stalled to a node nobody hears from, it may be that node's
        fault: `Unavailable` at once if the link is down, and a stalled one is waited on; that
        node is counted down soon (`link_down` ends the wait) and its slots move on."""
        link = self._links.find(node_id)
        if link is None:
            raise Unavailable(f"no link to {node_id}")
        if self._cut_off(node_id, link):
            state = "stalled" if link.connected else "down"
            raise Unreachable(f"the link to {node_id} is {state}, while others hear from it")
        if not link.connected:
            raise Unavailable(f"no link to {node_id}")
        call_id = next(self._ids)
        slot = self._waiting[call_id] = _Slot(node_id)
        try:
            number = link.send(Call(call_id, op))
            with self._clock.move_on_after(timeout):
                while not link.acknowledged(number):
                    with self._clock.move_on_after(STALL_AFTER):
                        await slot.done.wait()
                    if slot.done.is_set():
                        break
                    if self._cut_off(node_id, link):
                        raise Unreachable(
                            f"the link to {node_id} stalled before it took the call, "
                            "while others hear from it"
                        )
                await slot.done.wait()
        finally:
            del self._waiting[call_id]
        message = slot.message
        if message is None:
            if slot.done.is_set():
                raise Unavailable(f"{node_id} went down (or its link broke) before it answered")
            raise Unavailable(f"{node_id} did not answer within {timeout:g} s")
        if isinstance(message, Reply):
            return message.result
        raise _ERRORS[message.error](*message.args)

    def _cut_off(self, node_id: str, link: Link) -> bool:
        """Is `link` down or stalled, with news of `node_id` twice since it went down or last
        made progress? News came from others, then: `node_id` lives, and only this link fails
        it. Once is not enough: a heartbeat it sent the others just before it froze or died,
        and this link never carried, comes through them after the stall."""
        since = link.stalled_since() if link.connected else link.down_since
        heard = self._news_twice_at(node_id)
        return since is not None and heard is not None and heard > since

    def link_down(self, node_id: str) -> None:
        """The link to `node_id` broke, or the node is counted down (a node that is frozen,
        as by SIGSTOP, keeps its link open): its answers can no longer come, or come too late
        to matter (its share is taken over), so stop waiting; the caller answers 503 and its
        client asks again, by then of the new home."""
        for slot in self._waiting.values():
            if slot.node_id == node_id:
                slot.done.set()

    def answered(self, message: Reply | Failure) -> None:
        """A `Reply` or `Failure` arrived; late answers (the caller gave up) are dropped."""
        slot = self._waiting.get(message.call_id)
        if slot is not None:
            slot.message = message
            slot.done.set()

    async def serve(
        self,
        remote_id: str,
        call: Call,
        handler: Callable[[Any], Awaitable[Any]],
    ) -> None:
        """Answer a `Call` from `remote_id` with what `handler` makes of its operation."""
        try:
            result = await handler(call.op)
        except (errors.SemaphoreError, errors.RateLimitError, Unavailable) as error:
            answer: Reply | Failure = Failure(call.call_id, type(error).__name__, list(error.args))
        else:
            answer = Reply(call.call_id, result)
        self._links.send(remote_id, answer)
