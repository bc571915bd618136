"""One `/ws` connection: the hello, then requests in and answers out, batched both ways.

The requests of a frame that this node serves are applied at once, in the task that read the
frame, and their answers leave in one frame from that task: no other task wakes on the way. A
waiting acquire is answered later, by a callback, and requests that belong to other nodes run as
tasks that forward them; those answers leave from a sender task, whatever is ready when it wakes
in one frame. At most `MAX_IN_FLIGHT` requests of one connection run at once, and at most
`MAX_UNSENT` answers wait for a send that is under way; beyond either, the connection is not read
until some finish, so a flood, or a client that does not read its answers, slows its sender down
(TCP pushes back) and nobody else. A client that reads nothing for `SEND_TIMEOUT` is let go.

The connections of a node take `FrameTurns`: one decodes a frame or applies a step of it while
the others wait, so the node looks at its sockets between any two steps, however many send.
"""

from __future__ import annotations

import itertools
import logging

import trio
from trio_websocket import ConnectionClosed

from sluicegate.cluster.auth import Credentials, Token, admit
from sluicegate.cluster.errors import (
    Forbidden,
    QuotaFull,
    RateLimitError,
    SemaphoreError,
    UnknownPeer,
)
from sluicegate.cluster.rate_limits import (
    RateCheck,
    RateChecks,
    RateLease,
    RateOperation,
    RateWait,
)
from sluicegate.cluster.semaphore_ops import (
    Acquire,
    Heartbeat,
    IsAcquired,
    NewPeer,
    ReleaseLock,
    ReleasePeer,
    Remainder,
    Restore,
)

from . import ws_protocol as protocol
from .latencies import Latencies
from .links import MessageConnection
from .rate_limit_service import RateLimitService
from .rpc import Unavailable, Unreachable
from .semaphore_service import Semaphores
from .websocket import WebSocket

log = logging.getLogger("sluicegate.ws")

MAX_IN_FLIGHT = 10_000
# Requests of one frame handled in one step of the node at most; the rest after other tasks had
# their turn. A frame of 5,000 new peers held the whole node up for 300 ms in one step, and a
# step of 256 waiting acquires took 40 to 70 ms on a cluster node.
FRAME_STEP = 64
MAX_UNSENT = 10_000
HELLO_TIMEOUT = 10.0
IDLE_TIMEOUT = 60.0
SEND_TIMEOUT = 30.0
CLOSE_TIMEOUT = 1.0
CLOSE_NOT_READING = 1008
# The label of each operation in `sluicegate_ws_request_duration_seconds`: its name on the wire.
_OP_NAMES = {
    NewPeer: "new_peer",
    Heartbeat: "heartbeat",
    ReleasePeer: "release_peer",
    Acquire: "acquire",
    ReleaseLock: "release",
    IsAcquired: "is_acquired",
    Remainder: "remainder",
    Restore: "restore",
    RateCheck: "check",
    RateChecks: "check",
    RateLease: "lease",
    RateWait: "wait",
}
# Operations whose answers tell of a peer's life: made, restored, released, or unknown.
_PEER_LIFE = frozenset(
    _OP_NAMES[op]
    for op in (NewPeer, Restore, ReleasePeer, Acquire, ReleaseLock, Heartbeat, IsAcquired)
)


class FrameTurns:
    """Whose turn it is to decode a frame or apply a step of one, among a node's `/ws`
    connections: first come, first served. Trio runs every task that is ready before it looks at
    the sockets again, so 20 connections sending frames of 1,000 acquires each held the node up
    for hundreds of ms at a time, 20 steps in a row. A turn is kept while its holder yields
    between two steps of its frame, and is handed to the next connection waiting: that one runs
    only after the node has looked at its sockets. Taking a free turn does not yield (a frame of
    one request costs no extra step)."""

    def __init__(self) -> None:
        self._lock = trio.Lock()

    async def take(self) -> None:
        try:
            self._lock.acquire_nowait()
        except trio.WouldBlock:
            await self._lock.acquire()

    def give_back(self) -> None:
        """End this task's turn, if it has one (a wait for it may have been cancelled)."""
        if self._lock.statistics().owner is trio.lowlevel.current_task():
            self._lock.release()

    async def yield_turn(self) -> None:
        """Between two steps of a frame: let whoever waits go first, then go on."""
        self._lock.release()
        await self._lock.acquire()


class WsConnection:
    def __init__(
        self,
        websocket: MessageConnection,
        semaphores: Semaphores,
        rate_limits: RateLimitService,
        node_id: str,
        latencies: Latencies,
        idle_timeout: float = IDLE_TIMEOUT,
        peers_per_connection: int = 1_000,
        turns: FrameTurns | None = None,  # the node's; its own otherwise
        credentials: Credentials | None = None,  # a node with tokens: the hello names one
    ) -> None:
        self._ws = websocket
        self._credentials = credentials
        self._token: Token | None = None
        self._turns = FrameTurns() if turns is None else turns
        self._semaphores = semaphores
        self._rate_limits = rate_limits
        self._node_id = node_id
        self._latencies = latencies
        self._idle_timeout = idle_timeout
        self._answers: list[dict] = []
        self._answers_ready = trio.Event()
        # While a frame is applied, its answers wait for the end of the frame.
        self._applying = False
        self._sending = False
        # When the send under way began (while one is), and set at the end of every send.
        self._send_started = 0.0
        self._sent = trio.Event()
        self._in_flight = trio.Semaphore(MAX_IN_FLIGHT)
        self._last_frame = trio.current_time()
        # Peers this connection made (or restored) and has not seen the end of, and requests
        # that may make one, in flight. A dict of ints, which the garbage collector does not
        # track, not a set, which it walks at every full collection.
        self._peers: dict[int, None] = {}
        self._making_peers = 0
        self._most_peers = peers_per_connection
        # Requests in flight, by a key of the connection's own: (request id, operation's name,
        # its peer or None, arrival). Plain values, which the garbage collector stops walking
        # once it has seen them, however many acquires wait.
        self._pending: dict[int, tuple[int, str, int | None, float]] = {}
        self._keys = itertools.count()

    async def run(self) -> None:
        try:
            await self._serve_requests()
        finally:
            # Acquires still waiting for this connection are forgotten: nobody would read their
            # answers.
            self._semaphores.withdraw(self)

    async def _serve_requests(self) -> None:
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._send_answers)
                nursery.start_soon(self._watch_idleness)
                await self._receive_requests(nursery)
                nursery.cancel_scope.cancel()
        except* protocol.ProtocolViolation as violations:
            violation = violations.exceptions[0]
            assert isinstance(violation, protocol.ProtocolViolation)
            log.info("Closing a /ws connection: %s", violation.reason)
            await self._close(violation.code, violation.reason)
        except* ConnectionClosed:
            pass

    async def _receive_requests(self, nursery: trio.Nursery) -> None:
        with trio.move_on_after(HELLO_TIMEOUT) as waited:
            frame = await self._ws.get_message()
        if waited.cancelled_caught:
            raise protocol.ProtocolViolation(protocol.CLOSE_NO_HELLO, "no hello in time")
        hello = protocol.decode(frame, expect_hello=True)
        if self._credentials is not None:
            self._token = self._credentials.from_secret(_text(hello.get("token")))
            if self._token is None:
                raise protocol.ProtocolViolation(
                    protocol.CLOSE_UNAUTHORIZED, "this node needs a token in the hello"
                )
        await self._ws.send_message(
            protocol.welcome(self._node_id, self._idle_timeout, self._rate_limits.lease_terms())
        )
        while True:
            frame = await self._ws.get_message()
            arrived = self._last_frame = trio.current_time()
            await self._run_frame(frame, nursery, arrived)
            if not self._sending:
                await self._send_answers_now()
            while self._sending and len(self._answers) >= MAX_UNSENT:
                await self._sent.wait()

    async def _watch_idleness(self) -> None:
        """Close the connection after `idle_timeout` without a frame, or when one send has
        waited `SEND_TIMEOUT` for the client to read. (A watchdog, not a timeout around each
        read and send: a cancel scope per frame costs more than the rest of a frame.)"""
        while True:
            idle_from = self._last_frame + self._idle_timeout
            now = trio.current_time()
            if self._sending and now >= self._send_started + SEND_TIMEOUT:
                raise protocol.ProtocolViolation(CLOSE_NOT_READING, "the client reads no answers")
            if now < idle_from:
                wake = idle_from
                if self._sending:
                    wake = min(wake, self._send_started + SEND_TIMEOUT)
                await trio.sleep_until(min(wake, now + SEND_TIMEOUT))
            elif self._in_flight.value < MAX_IN_FLIGHT:
                self._last_frame = trio.current_time()  # waiting acquires keep a connection busy
            else:
                raise protocol.ProtocolViolation(protocol.CLOSE_IDLE, "idle timeout")

    async def _run_frame(self, frame: bytes | str, nursery: trio.Nursery, arrived: float) -> None:
        # Decoded in its turn too: 20 connections decoding frames of 5,000 requests between
        # two looks at the sockets held the node up for 270 ms.
        await self._turns.take()
        try:
            await self._apply_frame(protocol.decode(frame, expect_hello=False), nursery, arrived)
        finally:
            self._turns.give_back()

    async def _apply_frame(
        self,
        requests: list[protocol.Request | protocol.Rejected],
        nursery: trio.Nursery,
        arrived: float,
    ) -> None:
        here: list = []
        for position, item in enumerate(requests, 1):
            if position % FRAME_STEP == 0:
                self._apply(here)
                here = []
                await self._turns.yield_turn()
            if isinstance(item, protocol.Rejected):
                self._answers.append(protocol.error(item.request_id, item.code, item.message))
                self._latencies.ws_answered("rejected", trio.current_time() - arrived)
                continue
            if self._token is not None:
                try:
                    op = admit(self._token, item.op)
                except Forbidden as forbidden:
                    self._answers.append(protocol.domain_error(item.request_id, forbidden))
                    self._latencies.ws_answered(_OP_NAMES[type(item.op)], 0.0)
                    continue
                if op is not item.op:
                    item = protocol.Request(item.request_id, op)
            if isinstance(item.op, (RateCheck, RateChecks)) and self._check_now(
                item.request_id, item.op
            ):
                self._latencies.ws_answered("check", trio.current_time() - arrived)
                continue
            if isinstance(item.op, (NewPeer, Restore)):
                if len(self._peers) + self._making_peers >= self._most_peers:
                    refusal = QuotaFull(
                        "peers_per_connection",
                        f"this connection made {len(self._peers)} peers that are still live",
                    )
                    self._answers.append(self._refusal(item.request_id, refusal))
                    self._latencies.ws_answered(_OP_NAMES[type(item.op)], 0.0)
                    continue
                self._making_peers += 1
            try:
                self._in_flight.acquire_nowait()
            except trio.WouldBlock:
                self._apply(here)
                here = []
                self._turns.give_back()
                await self._in_flight.acquire()
                await self._turns.take()
            key = next(self._keys)
            op = item.op
            self._pending[key] = (
                item.request_id,
                _OP_NAMES[type(op)],
                getattr(op, "peer_id", None),
                arrived,
            )
            if isinstance(op, RateOperation):
                nursery.start_soon(self._serve, op, key, self._rate_limits.call)
            elif self._semaphores.serves_here(op):
                here.append((op, key))
            else:
                nursery.start_soon(self._serve, op, key, self._semaphores.call)
        self._apply(here)

    def _check_now(self, request_id: int, op: RateCheck | RateChecks) -> bool:
        """Answer a rate-limit check this node decides, at once; False if another node's key."""
        try:
            if not self._rate_limits.serves_here(op):
                return False
            if isinstance(op, RateCheck):
                answer = protocol.decision(request_id, self._rate_limits.check_here(op))
            else:
                answer = protocol.decisions(request_id, self._rate_limits.checks_here(op))
        except (RateLimitError, Unavailable) as failure:
            answer = self._refusal(request_id, failure)
        self._answers.append(answer)
        return True

    def _apply(self, requests: list) -> None:
        if not requests:
            return
        self._applying = True
        try:
            self._semaphores.submit(requests, self)
        finally:
            self._applying = False

    def answered(self, key: int, result: object, failure: BaseException | None) -> None:
        """The outcome of request `key` (`Answers`): answer it."""
        request_id, name, peer_id, arrived = self._pending.pop(key)
        if name in _PEER_LIFE:
            self._follow_peers(name, peer_id, result, failure)
        if failure is None:
            self._answer(protocol.ok(request_id, result))
        else:
            self._answer(self._refusal(request_id, failure))
        self._in_flight.release()
        self._latencies.ws_answered(name, trio.current_time() - arrived)

    def _follow_peers(
        self, name: str, peer_id: int | None, result: object, failure: BaseException | None
    ) -> None:
        """Note the peers this connection made, and the end of those it hears of."""
        if name == "new_peer" or name == "restore":
            self._making_peers -= 1
            made = result if name == "new_peer" else peer_id
            if failure is None and isinstance(made, int):
                self._peers[made] = None
        elif peer_id is not None and (name == "release_peer" or isinstance(failure, UnknownPeer)):
            self._peers.pop(peer_id, None)

    def _refusal(self, request_id: int, failure: BaseException) -> dict:
        """The error answer; a 503 says how long to keep asking here (docs/protocol.md), unless
        this node cannot reach the one that serves the request."""
        answer = protocol.domain_error(request_id, failure)
        if answer["error"] == "unavailable" and not isinstance(failure, Unreachable):
            retry_here_for = self._semaphores.retry_here_for()
            if retry_here_for:
                answer["retry_here_for"] = retry_here_for
        return answer

    async def _serve(self, op: object, key: int, call) -> None:
        """A request for another node, or a rate-limit wait: answered when done, like the rest."""
        try:
            result = await call(op)
        except (SemaphoreError, RateLimitError, Unavailable) as failure:
            self.answered(key, None, failure)
        else:
            self.answered(key, result, None)

    def answered_together(self, outcomes: list[tuple[int, object, BaseException | None]]) -> None:
        """Outcomes that came at once (`Answers`): their answers leave in one frame."""
        applying, self._applying = self._applying, True
        try:
            for outcome in outcomes:
                self.answered(*outcome)
        finally:
            self._applying = applying
        if not applying and self._answers and not self._sent_from_here():
            self._answers_ready.set()

    def _answer(self, answer: dict) -> None:
        self._answers.append(answer)
        if not self._applying:
            self._answers_ready.set()

    def _sent_from_here(self) -> bool:
        """Send the answers ready in this task, if the connection takes them without waiting
        and no send is under way: the answer to a forwarded lock then leaves from the task
        that read the owner's, without waking `_send_answers`. Whether they went."""
        ws = self._ws
        if self._sending or not isinstance(ws, WebSocket):
            return False
        frames = protocol.encode_answers(self._answers)
        try:
            if len(frames) > 1 or not ws.send_message_nowait(frames[0]):
                return False
        except ConnectionClosed:
            return False  # the reading task finds it closed
        self._answers = []
        if ws.draining:
            self._answers_ready.set()  # `_send_answers` writes the rest
        return True

    async def _send_answers(self) -> None:
        """Answers that come later (granted waits, forwarded requests)."""
        while True:
            await self._answers_ready.wait()
            self._answers_ready = trio.Event()
            if not self._sending:
                await self._send_answers_now()

    async def _send_answers_now(self) -> None:
        """Send what is ready, and what gets ready meanwhile (then nobody else sends)."""
        self._sending = True
        try:
            if isinstance(self._ws, WebSocket) and self._ws.draining:
                self._send_started = trio.current_time()
                await self._ws.drain()
            while self._answers:
                answers, self._answers = self._answers, []
                for frame in protocol.encode_answers(answers):
                    self._send_started = trio.current_time()
                    await self._ws.send_message(frame)
                    self._sent.set()
                    self._sent = trio.Event()
        finally:
            self._sending = False

    async def _close(self, code: int, reason: str) -> None:
        try:
            # The close frame waits behind what the client has not read.
            with trio.move_on_after(CLOSE_TIMEOUT):
                await self._ws.aclose(code, reason)
        except (ConnectionClosed, trio.BrokenResourceError, trio.ClosedResourceError):
            pass


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None
