"""One WebSocket to one node: requests go out batched, answers come back to whoever asked.

A request made while nothing else is in flight goes out at once, from the task that makes it.
Otherwise it is queued, and a sender task sends everything queued in one frame, so many tasks
calling at once share frames (and round trips) without waiting for each other: the tasks that
one answer frame wakes run before the sender does, and their next requests leave together.
"""

from __future__ import annotations

import asyncio
import functools
import sys
from collections import deque
from typing import Any

import anyio
import msgpack

from .recovery import ConnectionLost
from .session import Unauthorized, error_from
from .websocket import (
    HandshakeRefused,
    OpenWebSocket,
    WebSocket,
    WebSocketClosed,
    open_websocket,
)

PROTOCOL_VERSION = 1
CONNECT_TIMEOUT = 5.0
# How a node closes a hello whose token it does not know (docs/protocol.md).
CLOSE_UNAUTHORIZED = 4401
# A batch this big, sent while nothing else is in flight, goes out as two frames (see `_send`).
SPLIT_AT = 32


_BROKEN = (WebSocketClosed, anyio.BrokenResourceError, anyio.ClosedResourceError)


class _Slot:
    """A call waiting for its answer. Its caller sleeps (`sleep`) until woken (`wake`): when
    the answer came, or when it is to read the socket for everyone. Each event loop's own
    parking primitive, as an `anyio.Event` per call costs more (a subclass per loop)."""

    __slots__ = ("request_id", "answer", "sleeper", "lost")

    def __init__(self, request_id: int) -> None:
        self.request_id = request_id
        self.answer: dict | None = None
        # Given up with the connection retired (`Connection.retire`): the caller asks elsewhere.
        self.lost = False
        # While the caller sleeps: its task (trio), or a future (asyncio).
        self.sleeper: Any = None

    async def sleep(self) -> None:
        raise NotImplementedError

    def wake(self) -> None:
        raise NotImplementedError


class _AsyncioSlot(_Slot):
    __slots__ = ()

    async def sleep(self) -> None:
        self.sleeper = asyncio.get_running_loop().create_future()
        try:
            await self.sleeper
        finally:
            self.sleeper = None

    def wake(self) -> None:
        if self.sleeper is not None and not self.sleeper.done():
            self.sleeper.set_result(None)
        self.sleeper = None


@functools.cache
def _trio_slot() -> type[_Slot]:
    import trio  # (here: an asyncio application need not have trio)

    class _TrioSlot(_Slot):
        __slots__ = ()

        async def sleep(self) -> None:
            self.sleeper = trio.lowlevel.current_task()
            await trio.lowlevel.wait_task_rescheduled(self._abort)

        def _abort(self, raise_cancel) -> trio.lowlevel.Abort:
            self.sleeper = None
            return trio.lowlevel.Abort.SUCCEEDED

        def wake(self) -> None:
            if self.sleeper is not None:
                trio.lowlevel.reschedule(self.sleeper)
                self.sleeper = None

    return _TrioSlot


def _slot_class() -> type[_Slot]:
    """The slot for the event loop that runs now."""
    trio = sys.modules.get("trio")
    if trio is not None and trio.lowlevel.in_trio_run():
        return _trio_slot()
    return _AsyncioSlot


class Connection:
    """Whoever waits for an answer reads the socket, one caller at a time: when the reader's
    own answer comes, it hands reading over to another waiting caller. So the answer to a lone
    request wakes only its caller, and an answer frame wakes the callers it answers."""

    def __init__(
        self,
        ws,
        node: str,
        tasks: anyio.abc.TaskGroup,
        check_times: bool = False,
        leases: dict[str, float] | None = None,
    ) -> None:
        self._ws = ws
        self._tasks = tasks
        self._slot = _slot_class()
        self.node = node
        # The node's rate limiters in lease mode, and their terms (its welcome says).
        self.leases = leases or {}
        # Does the node take `times` on a check? Then runs of equal checks go as one request,
        # and `_groups` maps such a request's id to the ids of the calls it stands for.
        self._check_times = check_times
        self._groups: dict[int, list[int]] = {}
        self._outbox: list[dict] = []
        self._ready = anyio.Event()
        self._sending = False
        self._waiting: dict[int, _Slot] = {}
        self._reading = False
        # Callers asleep while another reads, the longest asleep first (some may be answered).
        self._sleepers: deque[_Slot] = deque()
        self._broken = False
        self._retired = False
        # The slot of the caller reading the socket, and the scope of its read.
        self._reader: _Slot | None = None
        self._read_scope: anyio.CancelScope | None = None
        # Heartbeats on their way on this connection: request id -> when sent.
        self._beats: dict[int, float] = {}
        self.frames_sent = 0
        self.requests_sent = 0

    @property
    def closed(self) -> bool:
        return self._broken or self._retired or self._ws.closed is not None

    @classmethod
    async def open(
        cls,
        tasks: anyio.abc.TaskGroup,
        url: str,
        open_websocket: OpenWebSocket = open_websocket,
        timeout: float = CONNECT_TIMEOUT,
        hello: dict | None = None,
    ) -> Connection:
        """Connect to `url` (a node's `/ws`) and say `hello` (with the client's token, say),
        within `timeout`; the connection's tasks run in `tasks`."""
        ws: WebSocket | None = None
        try:
            with anyio.fail_after(timeout):
                ws = await open_websocket(url)
                await ws.send_message(msgpack.packb(hello or {"hello": PROTOCOL_VERSION}))
                welcome = msgpack.unpackb(await ws.get_message())
        except (OSError, HandshakeRefused, *_BROKEN, TimeoutError) as error:
            if ws is not None and getattr(ws, "close_code", None) == CLOSE_UNAUTHORIZED:
                raise Unauthorized(f"{url} refused the client's token: {ws.closed}") from None
            raise ConnectionLost(f"cannot connect to {url}: {error!r}") from None
        connection = cls(
            ws,
            welcome.get("node", url),
            tasks,
            welcome.get("check_times", False),
            welcome.get("leases"),
        )
        tasks.start_soon(connection._send_loop)
        return connection

    async def call(self, request: dict) -> object:
        """Send `request` and wait for its answer; its result, or the error it carries."""
        if self._broken or self._retired:  # (the client asks `closed` first)
            raise ConnectionLost("the connection is closed")
        slot = self._waiting[request["id"]] = self._slot(request["id"])
        self._outbox.append(request)
        if request["op"] == "heartbeat":
            self._beats[request["id"]] = anyio.current_time()
        try:
            if len(self._waiting) == 1 and not self._sending:
                # Alone: no frame to share, so no reason to wake the sender.
                await self._send_alone()
            else:
                self._ready.set()
            while slot.answer is None and not self._broken and not slot.lost:
                if self._reading:
                    self._sleepers.append(slot)
                    await slot.sleep()
                else:
                    await self._read_until(slot)
        finally:
            del self._waiting[request["id"]]
            self._beats.pop(request["id"], None)
            if not self._reading:
                # This caller may have been handed reading just as it was cancelled.
                self._hand_over_reading()
            if self._retired and not self._beats and not self._broken:
                self.abandon()
        if slot.answer is None:
            raise ConnectionLost(f"the connection to {self.node} broke")
        if "error" in slot.answer:
            raise error_from(slot.answer)
        return slot.answer.get("ok")

    def stalled(self, before: float) -> bool:
        """Is a heartbeat sent on this connection before `before` still unanswered? (The node,
        or its way to the peers' homes, stalls with the connection open, as if paused.)"""
        return any(sent < before for sent in self._beats.values())

    async def aclose(self) -> None:
        self._fail_all()
        await self._ws.aclose()

    def abandon(self) -> None:
        """Leave the connection now (its callers get `ConnectionLost`); it closes in the
        background."""
        self._fail_all()
        self._tasks.start_soon(anyio.aclose_forcefully, self._ws)

    def retire(self) -> None:
        """Leave the connection for new calls, and its calls on their way (they get
        `ConnectionLost`, and go to another node), but its heartbeats: they wait for their
        answers (each until its peer may expire), and then it closes. A node that is slow
        rather than stopped may answer a renewal just after the client gave up on it, and a
        beat sent again elsewhere takes as long to reach the same home."""
        if not self._beats:
            self.abandon()
            return
        self._retired = True
        self._outbox = [request for request in self._outbox if request["id"] in self._beats]
        for slot in self._waiting.values():
            if slot.request_id not in self._beats:
                slot.lost = True
                slot.wake()
        if self._reader is not None and self._reader.lost and self._read_scope is not None:
            self._read_scope.cancel()

    async def _send_loop(self) -> None:
        while not self._broken:
            await self._ready.wait()
            self._ready = anyio.Event()
            if not self._sending:
                await self._send()

    async def _send(self) -> None:
        """Send what is queued, and what gets queued meanwhile.

        A big batch with nothing else in flight leaves as two frames: the node answers each
        frame as a whole, so while it works on the second this side handles the first's
        answers, and the two halves stay apart in later rounds. One frame would keep both sides
        taking turns, each idle half the time."""
        self._sending = True
        try:
            while self._outbox:
                batch, self._outbox = self._outbox, []
                frames = [batch]
                if len(batch) >= SPLIT_AT and len(self._waiting) == len(batch):
                    half = len(batch) // 2
                    frames = [batch[:half], batch[half:]]
                for frame in frames:
                    self.requests_sent += len(frame)
                    if self._check_times:
                        frame = self._coalesce(frame)
                    await self._ws.send_message(msgpack.packb(frame))
                    self.frames_sent += 1
        except _BROKEN:
            self._fail_all()
        finally:
            self._sending = False

    def _coalesce(self, frame: list[dict]) -> list[dict]:
        """Each run of checks with the same limiter, key and weight, as one check asked `times`
        times (the node decides them one after another, as it would the run): many callers of
        one limiter cost the node and this side one request and one answer per frame."""
        coalesced: list[dict] = []
        head: dict | None = None  # the check the current run started with
        for request in frame:
            if request["op"] != "check":
                head = None
            elif (
                head is not None
                and request["limiter"] == head["limiter"]
                and request.get("key") == head.get("key")
                and request.get("n") == head.get("n")
            ):
                ids = self._groups.get(head["id"])
                if ids is None:
                    ids = self._groups[head["id"]] = [head["id"]]
                    if "retry_id" in head:
                        head["retry_ids"] = [head.pop("retry_id")]
                ids.append(request["id"])
                head["times"] = len(ids)
                if "retry_ids" in head:
                    head["retry_ids"].append(request["retry_id"])
                continue
            else:
                head = request
            coalesced.append(request)
        return coalesced

    async def _send_alone(self) -> None:
        """`_send` from a caller's task, which may be cancelled. A cancel already pending leaves
        before anything is sent; one that comes while the socket is full may leave half a
        frame on the wire, so then the connection is dropped (the client makes another). A
        shielding cancel scope would cost more than the rest of a call."""
        await anyio.lowlevel.checkpoint_if_cancelled()
        try:
            await self._send()
        except anyio.get_cancelled_exc_class():
            self.abandon()
            raise

    async def _read_until(self, slot: _Slot) -> None:
        """Read answer frames, waking whoever they answer, until `slot` is answered."""
        self._reading, self._reader = True, slot
        try:
            # `retire` cancels a reader whose call it gave up; only the read awaits, so no frame
            # is left half handled.
            with anyio.CancelScope() as self._read_scope:
                while slot.answer is None and not slot.lost:
                    frame = await self._ws.get_message()
                    for answer in msgpack.unpackb(frame, strict_map_key=False):
                        if self._groups and answer.get("id") in self._groups:
                            self._answer_group(answer)
                            continue
                        waiting = self._waiting.get(answer.get("id"))
                        if waiting is not None:
                            waiting.answer = answer
                            waiting.wake()
        except _BROKEN:
            self._fail_all()
        finally:
            self._reading, self._reader, self._read_scope = False, None, None
            self._hand_over_reading()

    def _answer_group(self, answer: dict) -> None:
        """The answer to a check asked `times` times: a decision for each call, in order (or
        one error for all)."""
        ids = self._groups.pop(answer["id"])
        results = answer.get("ok") or []
        for position, request_id in enumerate(ids):
            waiting = self._waiting.get(request_id)
            if waiting is not None:
                waiting.answer = {"ok": results[position]} if "ok" in answer else answer
                waiting.wake()

    def _hand_over_reading(self) -> None:
        """Wake the caller asleep the longest that still waits: it reads next."""
        while self._sleepers:
            slot = self._sleepers.popleft()
            if slot.sleeper is not None and self._waiting.get(slot.request_id) is slot:
                slot.wake()
                return

    def _fail_all(self) -> None:
        self._broken = True
        self._ready.set()
        for slot in self._waiting.values():
            slot.wake()
