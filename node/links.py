"""Node links: one authenticated WebSocket per pair of nodes, carrying batched message frames.

* `Link` is everything this node has to say to one other node: an outbox that fills while the
  connection is down and drains, whole, into one frame per wake-up while it is up, plus a receiver
  that hands every decoded frame to the node. Messages are numbered, and each stays in the outbox
  until the other end acknowledges it: a connection that breaks or is replaced (the two nodes
  dialled each other at once) loses what was in flight on it, and the next one sends that again.
  The receiver drops what it already had, so each message reaches one life of the remote node
  once, in order.
* `Links` keeps the links of one node: the node with the smaller id dials (redialling with
  exponential backoff and jitter), the other accepts; either way the connection ends up carrying
  its `Link`.
* The handshake proves both ends know the cluster secret without sending it: the accepting node
  sends a random challenge; the dialer answers with HMAC-SHA256(secret, its role, the challenge,
  both ids) and a challenge of its own; the acceptor's welcome answers that one likewise. Neither
  end believes a message from the other before its proof has checked out.

Connections are anything with `send_message`/`get_message`/`aclose` (trio-websocket's
interface): a real WebSocket (`node/websocket.py`), or one over in-memory streams in tests and
simulations. The dialer is injected.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import math
import random
import ssl
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from itertools import islice
from typing import Protocol, TypeVar

import trio
from trio_websocket import ConnectionClosed, HandshakeError

from .clock import TRIO_CLOCK, Clock
from .logs import Sparse
from .websocket import WebSocket, dial
from .wire import MAX_FRAME, Codec, WireError

log = logging.getLogger("sluicegate.links")

HANDSHAKE_TIMEOUT = 5.0
CLOSE_TIMEOUT = 0.5
# An acknowledgement with nothing to carry it waits this long for a message going back (the
# answer to a forwarded call usually is one), rather than take a frame of its own.
ACK_DELAY = 0.05
BACKOFF_FIRST = 0.1
BACKOFF_MAX = 5.0
OUTBOX_LIMIT = 100_000
# A link with messages to deliver whose other end has acknowledged none of them for this long
# is stalled (`Link.stalled_since`).
STALL_AFTER = 0.5
# How often a refused link is logged at most (with how many there were).
REFUSAL_LOG_INTERVAL = 10.0
# Close code for a link whose other end does not know the secret (4000-4999: private use).
CLOSE_UNAUTHORIZED = 4401


class MessageConnection(Protocol):
    async def send_message(self, message: bytes) -> None: ...

    async def get_message(self) -> bytes | str: ...

    async def aclose(self, code: int = 1000, reason: str | None = None) -> None: ...


# Connect to `address` and return the open connection; it lives as long as `nursery`.
Dialer = Callable[[trio.Nursery, str], Awaitable[MessageConnection]]
# Hands the messages of each frame received from node `remote_id` to the node, all at once. The
# node takes them before it awaits anything: a newer connection that cancelled this one in
# between would count none of them as arrived, and the other end would send them again.
Deliver = Callable[[str, list[object]], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Challenge:
    server_id: str
    nonce: bytes


@dataclass(frozen=True, slots=True)
class Hello:
    node_id: str
    generation: int
    proof: bytes
    nonce: bytes


@dataclass(frozen=True, slots=True)
class Welcome:
    node_id: str
    generation: int
    proof: bytes


@dataclass(frozen=True, slots=True)
class Sequenced:
    """Heads every frame on a link: its first message is number `first` of the sender's
    messages to this life of the receiver, and the sender has received `received` of the
    receiver's (an acknowledgement)."""

    first: int
    received: int


@dataclass(frozen=True, slots=True)
class Skipped:
    """Stands in a frame for a message meant for an earlier life of the receiver (it keeps the
    numbering)."""


SKIPPED = Skipped()


@dataclass(frozen=True, slots=True)
class Linked:
    """The other end of a link that passed the handshake: which node, in which life."""

    node_id: str
    generation: int


# Tags of the handshake and of frame headers; a node's own message tags must stay clear of them.
HANDSHAKE_MESSAGES = {1000: Challenge, 1001: Hello, 1002: Welcome, 1003: Sequenced, 1004: Skipped}


NONCE_BYTES = 16

M = TypeVar("M")


class LinkRefused(Exception):
    """The other end failed the handshake (wrong secret, wrong node, or nonsense)."""


# Whose proof it is: a dialer's proof can never pass for an acceptor's, or the other way round.
DIALER, ACCEPTOR = b"dialer", b"acceptor"


def proof_of_secret(secret: bytes, role: bytes, nonce: bytes, prover: str, verifier: str) -> bytes:
    message = b"\x00".join((role, nonce, prover.encode(), verifier.encode()))
    return hmac.new(secret, message, hashlib.sha256).digest()


async def _receive_one(
    conn: MessageConnection, codec: Codec, expected: type[M], clock: Clock = TRIO_CLOCK
) -> M:
    with clock.fail_after(HANDSHAKE_TIMEOUT):
        data = await conn.get_message()
    if not isinstance(data, bytes):
        raise LinkRefused("text frame during the handshake")
    try:
        messages = codec.decode(data)
    except WireError as error:
        raise LinkRefused(f"bad handshake frame: {error}") from None
    if len(messages) != 1 or not isinstance(messages[0], expected):
        raise LinkRefused(f"expected {expected.__name__} during the handshake")
    return messages[0]


async def dialer_handshake(
    conn: MessageConnection,
    codec: Codec,
    node_id: str,
    generation: int,
    secret: bytes,
    rng: random.Random,
    clock: Clock = TRIO_CLOCK,
) -> Linked:
    """Answer the challenge and challenge back; returns the accepting node once it has proven
    the secret too (else closes with 4401 and raises LinkRefused)."""
    nonce = rng.randbytes(NONCE_BYTES)
    try:
        challenge = await _receive_one(conn, codec, Challenge, clock)
        proof = proof_of_secret(secret, DIALER, challenge.nonce, node_id, challenge.server_id)
        await conn.send_message(codec.encode([Hello(node_id, generation, proof, nonce)]))
        welcome = await _receive_one(conn, codec, Welcome, clock)
    except ConnectionClosed as closed:
        raise LinkRefused(f"closed during the handshake: {closed.reason}") from None
    if welcome.node_id != challenge.server_id:
        await conn.aclose(CLOSE_UNAUTHORIZED, "bad handshake")
        raise LinkRefused("the welcome came from another node than the challenge")
    expected = proof_of_secret(secret, ACCEPTOR, nonce, welcome.node_id, node_id)
    if not hmac.compare_digest(welcome.proof, expected):
        await conn.aclose(CLOSE_UNAUTHORIZED, "not a member of this cluster")
        raise LinkRefused(f"{welcome.node_id!r} does not know the cluster secret")
    return Linked(welcome.node_id, welcome.generation)


async def acceptor_handshake(
    conn: MessageConnection,
    codec: Codec,
    node_id: str,
    generation: int,
    secret: bytes,
    rng: random.Random,
    clock: Clock = TRIO_CLOCK,
) -> Linked:
    """Challenge the dialer and answer its challenge; returns it, or closes with 4401 and
    raises LinkRefused."""
    nonce = rng.randbytes(NONCE_BYTES)
    try:
        await conn.send_message(codec.encode([Challenge(node_id, nonce)]))
        hello = await _receive_one(conn, codec, Hello, clock)
    except ConnectionClosed as closed:
        raise LinkRefused(f"closed during the handshake: {closed.reason}") from None
    except LinkRefused:
        await conn.aclose(CLOSE_UNAUTHORIZED, "bad handshake")
        raise
    expected = proof_of_secret(secret, DIALER, nonce, hello.node_id, node_id)
    if not hmac.compare_digest(hello.proof, expected) or hello.node_id == node_id:
        await conn.aclose(CLOSE_UNAUTHORIZED, "not a member of this cluster")
        raise LinkRefused(f"{hello.node_id!r} does not know the cluster secret")
    proof = proof_of_secret(secret, ACCEPTOR, hello.nonce, node_id, hello.node_id)
    await conn.send_message(codec.encode([Welcome(node_id, generation, proof)]))
    return Linked(hello.node_id, hello.generation)


class Link:
    """What this node sends to one other node, and the connection carrying it, when there is one."""

    def __init__(
        self,
        remote_id: str,
        codec: Codec,
        deliver: Deliver,
        on_down: Callable[[str], None] = lambda remote_id: None,
        clock: Clock = TRIO_CLOCK,
    ) -> None:
        self.remote_id = remote_id
        self._codec = codec
        self._deliver = deliver
        self._on_down = on_down
        self._clock = clock
        # Messages not acknowledged yet: (the life of the remote node the sender meant it for,
        # or None for any; the message). The first is number `_first` of this life's messages.
        self._outbox: deque[tuple[int | None, object]] = deque()
        self._first = 0
        # The number of the first message not sent on the current connection yet.
        self._unsent = 0
        self._wake = trio.Event()
        self._carrier: trio.CancelScope | None = None
        self._carrier_preferred = False
        self._carried = trio.Event()
        self._carried.set()
        self._remote_generation: int | None = None
        # How many of the remote life's messages this node has received (and handed on), and
        # when the send loop owes the other end a frame that says so (inf: it owes none). The
        # receiving task moves the deadline of the send loop's wait (`_idle`) instead of waking
        # it: the answer a received message causes usually carries the acknowledgement first.
        self._received = 0
        self._ack_due = math.inf
        self._idle: trio.CancelScope | None = None
        # When the other end last took a message (or the outbox last filled from empty);
        # None while there is nothing to deliver.
        self._waiting_since: float | None = None
        # When the last connection ended, while no other carries the link.
        self.down_since: float | None = None
        self.dropped = 0
        self.stale = 0
        self.frames_sent = 0
        self._sending = False
        # The connection carrying the link, if frames can be written to it from any task
        # (`push`), and the scope that ends it.
        self._quick: WebSocket | None = None
        self._stop: trio.CancelScope | None = None

    @property
    def connected(self) -> bool:
        return self._carrier is not None

    @property
    def remote_generation(self) -> int | None:
        """The life of the remote node this link carries to, or last did."""
        return self._remote_generation

    @property
    def unacknowledged(self) -> int:
        """Messages the other end has not acknowledged (sent or not)."""
        return len(self._outbox)

    @property
    def idle(self) -> bool:
        """Nothing queued and nothing being sent (sent messages may await acknowledgement)."""
        return self._unsent == self._first + len(self._outbox) and not self._sending

    def stalled_since(self) -> float | None:
        """When this link last made progress, if it has had messages to deliver since then and
        none acknowledged for `STALL_AFTER` seconds; else None. A healthy other end
        acknowledges within `ACK_DELAY` and a round trip; a stalled one is clogged, frozen or
        far behind."""
        since = self._waiting_since
        if since is None or self._clock.now() - since < STALL_AFTER:
            return None
        return since

    def acknowledged(self, number: int) -> bool:
        """Has the other end taken message `number` (as `send` numbered it)?"""
        return number < self._first

    def send(self, message: object, generation: int | None = None) -> int:
        """Queue a message, and return its number; it leaves with the next frame, or when the
        link is up again.

        A message meant for one life of the remote node (`generation`) is dropped if the link
        comes up to another: what a node said to a member that has since restarted (a hand-off
        of state, an answer) is stale for its next life, which starts from what it pulls."""
        number = self.queue(message, generation)
        self.wake()
        return number

    def wake(self) -> None:
        """Have the send loop send what is queued."""
        self._wake.set()

    def queue(self, message: object, generation: int | None = None) -> int:
        """`send`, but the message waits for `push`, or for a frame that leaves anyway."""
        if len(self._outbox) == OUTBOX_LIMIT:
            # A link down for long: the oldest messages are the least useful (their callers have
            # given up); drop them rather than grow without bound.
            self._outbox.popleft()
            self._first += 1
            self._unsent = max(self._unsent, self._first)
            self.dropped += 1
        if self._waiting_since is None:
            self._waiting_since = self._clock.now()
        self._outbox.append((generation, message))
        return self._first + len(self._outbox) - 1

    def push(self) -> None:
        """Send what is queued: from this task when the connection takes a frame without
        waiting and nothing else is being sent on it, which spares the send loop a wake-up and
        its scheduler passes (docs/benchmarks.md, "Frames written where they are made"); else
        the send loop wakes to send it."""
        conn = self._quick
        if conn is None or self._sending or not self._send_now(conn):
            self._wake.set()

    def _send_now(self, conn: WebSocket) -> bool:
        first = self._unsent
        if first == self._first + len(self._outbox):
            return True
        batch = self._batch(first)
        frames = self._frames(first, batch)
        try:
            if len(frames) > 1 or not conn.send_message_nowait(frames[0]):
                return False
        except ConnectionClosed:
            # Lost: the connection ends, and the next one sends everything unacknowledged.
            if self._stop is not None:
                self._stop.cancel()
            return True
        self._sent(first, batch)
        self.frames_sent += 1
        return not conn.draining

    async def carry(self, conn: MessageConnection, generation: int, preferred: bool = True) -> None:
        """Send and receive over `conn`, to the remote node's life `generation`, until it
        breaks; a newer connection replaces this one, unless this one is `preferred` (dialled
        by the node of the smaller id) and the newer one is not. Both ends apply the rule, so
        when two nodes dial each other at once they keep the same connection."""
        if (
            self._carrier is not None
            and self._carrier_preferred
            and not preferred
            and generation == self._remote_generation
        ):
            with self._clock.move_on_after(CLOSE_TIMEOUT):
                await conn.aclose()
            return
        replaced, replaced_done = self._carrier, self._carried
        carried = self._carried = trio.Event()
        with trio.CancelScope() as scope:
            self._carrier = scope
            self.down_since = None
            self._carrier_preferred = preferred
            if replaced is not None:
                replaced.cancel()
            # The replaced connection stops first: two must not hand on messages at once.
            with trio.CancelScope(shield=True):
                await replaced_done.wait()
            if generation != self._remote_generation:
                self._remote_generation = generation
                self._received = 0
            # What the last connection sent may not have arrived: send everything not
            # acknowledged again, and tell the other end what arrived here.
            self._unsent = self._first
            self._ack_due = -math.inf
            self._wake.set()
            try:
                async with trio.open_nursery() as nursery:
                    self._stop = nursery.cancel_scope
                    # Connections that cannot take a frame without waiting (over TLS, the
                    # simulator's) are written by the send loop alone.
                    self._quick = conn if isinstance(conn, WebSocket) else None
                    nursery.start_soon(self._send_loop, conn, nursery.cancel_scope)
                    await self._receive_loop(conn)
                    nursery.cancel_scope.cancel()
            finally:
                self._quick = self._stop = None
                # Closed here, replaced or broken: left open, a connection the other end still
                # carries would swallow what it sends until a timeout noticed.
                with trio.CancelScope(shield=True), self._clock.move_on_after(CLOSE_TIMEOUT):
                    await conn.aclose()
                carried.set()
                if self._carrier is scope:
                    # No newer connection took over: the link is down until one does.
                    self._carrier = None
                    self.down_since = self._clock.now()
                    self._on_down(self.remote_id)

    async def _send_loop(self, conn: MessageConnection, stop: trio.CancelScope) -> None:
        clock = self._clock
        try:
            while True:
                if not self._wake.is_set() and self._ack_due > clock.now():
                    with clock.move_on_at(self._ack_due) as self._idle:
                        await self._wake.wait()
                    self._idle = None
                self._wake = trio.Event()
                if self._quick is not None and self._quick.draining:
                    await self._quick.drain()
                if self._unsent == self._first + len(self._outbox):
                    if self._ack_due > clock.now():
                        continue
                first = self._unsent
                batch = self._batch(first)
                self._sent(first, batch)
                self._sending = True
                try:
                    for frame in self._frames(first, batch):
                        await conn.send_message(frame)
                        self.frames_sent += 1
                finally:
                    self._sending = False
        except (ConnectionClosed, trio.BrokenResourceError, trio.ClosedResourceError):
            stop.cancel()

    def _batch(self, first: int) -> list[object]:
        """The messages from number `first` on, those meant for another life skipped."""
        return [
            message if meant_for in (None, self._remote_generation) else SKIPPED
            for meant_for, message in islice(self._outbox, first - self._first, None)
        ]

    def _sent(self, first: int, batch: list[object]) -> None:
        """`batch`, from message `first` on, is (being) sent, with what this end received."""
        self.stale += sum(1 for message in batch if message is SKIPPED)
        self._unsent = first + len(batch)
        self._ack_due = math.inf

    def _frames(self, first: int, batch: list[object]) -> list[bytes]:
        """Encode a batch into as few frames as fit under the frame limit."""
        try:
            return [self._codec.encode([Sequenced(first, self._received), *batch])]
        except WireError:
            if len(batch) == 1:
                log.error("Dropped a message too large for one frame: %r", batch[0])
                return self._frames(first, [SKIPPED])
            half = len(batch) // 2
            return self._frames(first, batch[:half]) + self._frames(first + half, batch[half:])

    async def _receive_loop(self, conn: MessageConnection) -> None:
        while True:
            try:
                data = await conn.get_message()
            except ConnectionClosed:
                return
            if not isinstance(data, bytes):
                log.warning("Closing the link to %s: it sent a text frame.", self.remote_id)
                await conn.aclose(1003, "binary frames only")
                return
            try:
                header, *messages = self._codec.decode(data)
                if not isinstance(header, Sequenced):
                    raise WireError("a frame starts with its sequence header")
            except (WireError, ValueError) as error:
                log.warning("Closing the link to %s: %s", self.remote_id, error)
                await conn.aclose(1007, "malformed frame")
                return
            self._acknowledge(header.received)
            if not messages:
                continue
            # Messages before `_received` arrived over an earlier connection. A gap (the other
            # end dropped its oldest messages while the link was down) is accepted.
            self._received = max(self._received, header.first)
            fresh = messages[self._received - header.first :]
            kept = [message for message in fresh if not isinstance(message, Skipped)]
            if kept:
                await self._deliver(self.remote_id, kept)
            self._received += len(fresh)
            # Acknowledged once handed on: a frame that went out while they were being handed
            # on carried an older count, and the other end would take the link for stalled.
            if self._ack_due == math.inf:
                self._ack_due = due = self._clock.now() + ACK_DELAY
                # A wait that ends sooner is left be: frames written by `push` since it began
                # carried what was owed then, and the loop, woken for nothing, waits on for
                # this. Moving a deadline at every frame cost more than those wake-ups.
                idle = self._idle
                if idle is not None and self._clock.deadline_of(idle) > due:
                    self._clock.reschedule(idle, due)

    def _acknowledge(self, received: int) -> None:
        """The other end has received the first `received` messages: forget them."""
        if self._first >= received or not self._outbox:
            return
        while self._first < received and self._outbox:
            self._outbox.popleft()
            self._first += 1
        self._unsent = max(self._unsent, self._first)
        self._waiting_since = self._clock.now() if self._outbox else None


# What dialing and the handshake can fail with; anything else is a bug and propagates.
DIAL_ERRORS = (
    OSError,
    HandshakeError,
    ConnectionClosed,
    LinkRefused,
    trio.TooSlowError,
    trio.BrokenResourceError,
)


async def websocket_dialer(
    nursery: trio.Nursery, address: str, tls: Callable[[], ssl.SSLContext] | None = None
) -> MessageConnection:
    """Dial another node's `/cluster` route over a real socket (over TLS with the context
    `tls()` gives, if given)."""
    with trio.fail_after(HANDSHAKE_TIMEOUT):
        return await dial(address, "/cluster", None if tls is None else tls(), MAX_FRAME)


class Links:
    """All links of one node."""

    def __init__(
        self,
        node_id: str,
        secret: bytes,
        codec: Codec,
        dialer: Dialer,
        deliver: Deliver,
        rng: random.Random,
        generation: int,
        on_link_down: Callable[[str], None] = lambda remote_id: None,
        clock: Clock = TRIO_CLOCK,
        repeat: Callable[[str, object, int | None], bool] | None = None,
        life_of: Callable[[str], int | None] = lambda remote_id: None,
    ) -> None:
        """`generation` is this node's life, told to the other end of every link;
        `on_link_down(remote_id)` is called whenever the link to a node goes down; `clock`
        times backoffs, acknowledgements, handshakes and holds; `repeat(remote_id, message,
        life)`, if given, says to send a message twice (the simulations' duplicating network),
        `life` being the remote node's life it goes to (the one asked for, else the one the
        link carries to now, if any); `life_of(remote_id)` is the remote node's life as the
        membership knows it, if it does."""
        self.node_id = node_id
        self._repeat = repeat
        self._clock = clock
        self.generation = generation
        self._on_link_down = on_link_down
        self._secret = secret
        self._codec = codec
        self._dialer = dialer
        self._deliver = deliver
        self._life_of = life_of
        # Messages of a remote life older than the one the membership knows, dropped.
        self.from_dead_lives = 0
        self._rng = rng
        self._links: dict[str, Link] = {}
        # Set to end the backoff of a dial loop that waits to dial again (see `redial`).
        self._backing_off: dict[str, trio.Event] = {}
        # The links `send_together` sent to so far, in order, while it runs.
        self._gathered: dict[Link, None] | None = None
        self._refused_links = Sparse(REFUSAL_LOG_INTERVAL)

    def link(self, remote_id: str) -> Link:
        link = self._links.get(remote_id)
        if link is None:
            link = self._links[remote_id] = Link(
                remote_id, self._codec, self._deliver_current, self._on_link_down, self._clock
            )
        return link

    def send(self, remote_id: str, message: object, generation: int | None = None) -> int:
        """Send `message` to `remote_id`, or only to its life `generation` if one is given;
        its number on that link (twice, when `repeat` says so: the number of the first)."""
        link = self.link(remote_id)
        number = link.queue(message, generation)
        if self._repeat is not None:
            life = generation if generation is not None else link.remote_generation
            if self._repeat(remote_id, message, life):
                link.queue(message, generation)
        if self._gathered is None:
            link.wake()
        else:
            self._gathered[link] = None
        return number

    def send_together(self, messages: Iterable[tuple[str, object]]) -> None:
        """Send each (remote id, message), each link's in one frame, written from this task
        when its link is free (`Link.push`)."""
        gathered: dict[Link, None] = {}
        self._gathered = gathered
        try:
            for remote_id, message in messages:
                self.send(remote_id, message)
        finally:
            self._gathered = None
            for link in gathered:
                link.push()

    async def _deliver_current(self, remote_id: str, messages: list[object]) -> None:
        """Hand on what a link received, unless it is of a life of `remote_id` older than the
        one the membership knows: bytes a crashed process left in the network can still
        arrive after its next life was gossiped, and that life has not said any of it (a
        `Renew` of the old life would mark a new life ready that cannot serve)."""
        life = self._links[remote_id].remote_generation
        known = self._life_of(remote_id)
        if life is not None and known is not None and life < known:
            self.from_dead_lives += len(messages)
            return
        await self._deliver(remote_id, messages)

    def find(self, remote_id: str) -> Link | None:
        """The link to `remote_id`, if this node ever had one."""
        return self._links.get(remote_id)

    def dials(self, remote_id: str) -> bool:
        """Of each pair, the node with the smaller id dials, so a pair has one connection."""
        return self.node_id < remote_id

    async def keep_linked(self, remote_id: str, address: str) -> None:
        """Dial `address` and carry the link to `remote_id`, redialling whenever it breaks.

        Runs until cancelled (when the member leaves or goes down).
        """
        backoff = BACKOFF_FIRST
        while True:
            try:
                await self._dial_and_carry(remote_id, address)
                log.info("Link to %s broke; redialling.", remote_id)
                backoff = BACKOFF_FIRST
            except* DIAL_ERRORS as group:
                error = group.exceptions[0]
                log.info("Cannot link to %s at %s: %s", remote_id, address, error or type(error))
            woken = self._backing_off[remote_id] = trio.Event()
            try:
                with self._clock.move_on_after(backoff * self._rng.uniform(0.5, 1.0)):
                    await woken.wait()
            finally:
                if self._backing_off.get(remote_id) is woken:
                    del self._backing_off[remote_id]
            backoff = BACKOFF_FIRST if woken.is_set() else min(backoff * 2, BACKOFF_MAX)

    def redial(self, remote_id: str) -> None:
        """Dial `remote_id` now if its dial loop is waiting out a backoff: it is known to be up
        again. Until the dialer links, the link is carried by an introduction, which ends after
        its hold: the backoff of a long fault (up to `BACKOFF_MAX`) would leave the link down
        then, with the cluster whole again."""
        woken = self._backing_off.get(remote_id)
        if woken is not None:
            woken.set()

    async def _dial_and_carry(self, remote_id: str, address: str) -> None:
        async with trio.open_nursery() as connection:
            conn = await self._dialer(connection, address)
            remote = await self._dialer_handshake(conn)
            if remote.node_id != remote_id:
                await conn.aclose(CLOSE_UNAUTHORIZED, "unexpected node")
                raise LinkRefused(f"{address} is {remote.node_id!r}, not {remote_id!r}")
            log.info("Linked to %s at %s.", remote_id, address)
            await self.link(remote_id).carry(conn, remote.generation, self.dials(remote_id))
            connection.cancel_scope.cancel()

    async def introduce(
        self, address: str, hold: float, first_message: object | None = None
    ) -> str | None:
        """Contact `address` (a seed: its node id is not known yet), send `first_message`, and
        carry the link for `hold` seconds, long enough to swap gossip; then membership decides who
        dials whom for good.

        Returns the node id found there, or None if there was nobody to talk to.
        """
        try:
            async with trio.open_nursery() as connection:
                conn = await self._dialer(connection, address)
                remote = await self._dialer_handshake(conn)
                link = self.link(remote.node_id)
                if first_message is not None:
                    link.send(first_message)
                with self._clock.move_on_after(hold):
                    await link.carry(conn, remote.generation, self.dials(remote.node_id))
                connection.cancel_scope.cancel()
                return remote.node_id
        except* DIAL_ERRORS as group:
            log.info("Cannot reach seed %s: %s", address, group.exceptions[0])
        return None

    async def accept(self, conn: MessageConnection) -> None:
        """Serve a connection another node dialed, for as long as it lasts."""
        try:
            remote = await acceptor_handshake(
                conn,
                self._codec,
                self.node_id,
                self.generation,
                self._secret,
                self._rng,
                self._clock,
            )
        except (LinkRefused, trio.TooSlowError, ConnectionClosed) as error:
            # Anyone who reaches the port can make these: a line at most every 10 s.
            refused = self._refused_links.due(self._clock.now())
            if refused is not None:
                log.warning("Refused %d node link(s) since the last such line: %s", refused, error)
            return
        remote_dials = not self.dials(remote.node_id)
        await self.link(remote.node_id).carry(conn, remote.generation, remote_dials)

    async def _dialer_handshake(self, conn: MessageConnection) -> Linked:
        return await dialer_handshake(
            conn, self._codec, self.node_id, self.generation, self._secret, self._rng, self._clock
        )

    async def flush(self, timeout: float) -> None:
        """Wait until every connected link has sent what it has queued, at most `timeout`."""
        links = self._links.values()
        await _until(
            lambda: not any(link.connected and not link.idle for link in links),
            timeout,
            self._clock,
        )

    async def acknowledged(self, remote_ids: list[str], timeout: float) -> bool:
        """Wait until `remote_ids` acknowledged every message sent them, at most `timeout`;
        whether they all did."""
        links = [self.link(remote_id) for remote_id in remote_ids]
        return await _until(
            lambda: not any(link.unacknowledged for link in links), timeout, self._clock
        )

    def status(self) -> dict[str, bool]:
        """Which links are connected now, by remote node id."""
        return {remote_id: link.connected for remote_id, link in sorted(self._links.items())}


async def _until(condition: Callable[[], bool], timeout: float, clock: Clock) -> bool:
    """Poll `condition` until it holds, at most `timeout`; whether it did."""
    with clock.move_on_after(timeout):
        while not condition():
            await clock.sleep(0.005)
        return True
    return False
