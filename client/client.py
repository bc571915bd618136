"""The async client (on anyio: under asyncio and trio alike): locks that survive node failures.

    async with await sluicegate.client.connect(["ws://n1:8000", "ws://n2:8000"]) as client:
        async with client.lock("A", count=2, timeout=10) as lease:
            ...  # lease.fencing_token

The client keeps one connection, to the first node that answers (the next URL when it breaks,
with backoff). Each task's outermost lock takes a peer of the client's (nested locks in the same
task share it, so their levels are checked), so any number of tasks lock at once, and their
requests share frames. Peers heartbeat at a third of their expiry, and a peer a node forgot is
restored with exactly the locks it holds. If no node confirms a peer's heartbeat before the peer
could expire, its leases are lost: the body of each of its `async with client.lock()` is
cancelled and `LeaseLost` raised from it, `lease.lost` is set, and the peer is not reused. An
acquire that returns no lease is withdrawn. A node that keeps answering
`unavailable` is left for the next URL: after half a second if it is cut off from most members,
after the takeover bound its answer gives if it is not (`client/recovery.py`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import random
import ssl
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, overload
from urllib.parse import unquote, urlsplit

import anyio

from .connection import CONNECT_TIMEOUT, PROTOCOL_VERSION, Connection
from .recovery import CALL_PATIENCE, CallRecovery, ConnectionLost, GiveUp, NodeChoice, RestorePeer
from .session import (
    Deadlock,
    Forbidden,
    LeaseLost,
    LimitReached,
    LockTimeout,
    Peer,
    RateDecision,
    RateLimited,
    RequestRefused,
    Session,
    SluicegateError,
    Unavailable,
    UnknownPeer,
    UnknownSemaphore,
)
from .slices import Ask, KeySlices
from .websocket import OpenWebSocket, extra_headers, open_websocket

log = logging.getLogger("sluicegate.client")

DEFAULT_EXPIRES_IN = 30.0
# Waits longer than this are split, so a lost connection is noticed and the wait resumed.
WAIT_SLICE = 20.0
# A timeout with less than this left is over. A node whose clock runs fast answers a wait a
# little early, and asking again for what is left, again and again, would never end where a
# round trip takes no time (a simulation: a node 1% fast turned a 0.1 s wait into an endless
# series of ever shorter ones).
SHORTEST_WAIT = 0.001
# Heartbeats of one peer on their way at once, at most. A beat is a third of an expiry, and
# each stalled node left sends another, half a beat after the one before it at the soonest: up
# to nine while the peer lives.
HEARTBEATS_IN_FLIGHT = 9
# How many times a beat the heartbeat task looks for a node that stalls.
STALL_CHECKS = 8
# How long an acquire that returned no lease is withdrawn for, shielded from cancellation.
WITHDRAW_PATIENCE = 2.0
# Past this many keys of lease-mode limiters, the idle ones are forgotten.
MAX_SLICED_KEYS = 4096


@dataclass(eq=False)
class Lease:
    """A held lock. `lost` turns True if the client could not keep it (see the module doc)."""

    semaphore: str
    count: int
    fencing_token: int | None
    # The peer that holds it (the cluster's name for the lock hierarchy it belongs to).
    peer_id: int = 0
    lost: bool = False
    _scope: anyio.CancelScope | None = field(default=None, repr=False)


async def connect(
    urls: str | Sequence[str],
    *,
    expires_in: float | timedelta = DEFAULT_EXPIRES_IN,
    ssl_context: ssl.SSLContext | None = None,
    headers: Mapping[str, str] | Sequence[tuple[str, str]] = (),
    token: str | None = None,
) -> Client:
    """A client for the nodes at `urls` (`ws://host:port` or `wss://host:port`, `/ws`
    implied); enter it with `async with` to connect.

    `ssl_context` verifies `wss://` nodes (default: the system's certificate authorities).
    `headers` go with every WebSocket handshake (for a proxy, say), and `token` (the secret of
    one of the nodes' `[auth]` tokens) with every hello. URLs may carry the token as
    throttle-client's do, `wss://NAME:SECRET@host:port`."""
    if isinstance(urls, str):
        urls = [urls]
    if not urls:
        raise ValueError("at least one node URL")
    extra = extra_headers(headers)
    if token is not None and not isinstance(token, str):
        raise TypeError("the token is the secret, a string")
    named = ({_secret_in(url) for url in urls} | {token}) - {None}
    if len(named) > 1:
        raise ValueError("the URLs and `token` name different tokens")
    token = next(iter(named), None)
    opener = open_websocket
    if ssl_context is not None or extra:
        opener = functools.partial(open_websocket, ssl_context=ssl_context, headers=extra)
    return Client(
        [_ws_url(url) for url in urls],
        expires_in=seconds(expires_in),
        open_websocket=opener,
        token=token,
    )


# A decision made here, without the named tuple's own __new__ (a Python call per check).
_decision = tuple.__new__


def event_loop_clock() -> Callable[[], float]:
    """The running event loop's clock, as `anyio.current_time` reads it: asyncio's, or else
    trio's (an asyncio application need not have trio)."""
    try:
        return asyncio.get_running_loop().time
    except RuntimeError:
        import trio

        return trio.lowlevel.current_clock().current_time


@overload
def seconds(interval: float | timedelta) -> float: ...
@overload
def seconds(interval: float | timedelta | None) -> float | None: ...
def seconds(interval: float | timedelta | None) -> float | None:
    """A time interval in seconds, given in seconds or as a `timedelta` (as throttle-client's)."""
    return interval.total_seconds() if isinstance(interval, timedelta) else interval


def _secret_in(url: str) -> str | None:
    """The token's secret a URL carries (`wss://NAME:SECRET@host`), if any."""
    password = urlsplit(url).password
    return unquote(password) if password else None


def _ws_url(url: str) -> str:
    """`url` as a `/ws` URL, without credentials (they go in the hello, not the handshake)."""
    parts = urlsplit(url.rstrip("/"))
    url = parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()
    if url.startswith("http://"):
        url = "ws://" + url[len("http://") :]
    elif url.startswith("https://"):
        url = "wss://" + url[len("https://") :]
    return url if url.endswith("/ws") else url + "/ws"


class Client:
    def __init__(
        self,
        urls: list[str],
        *,
        expires_in: float,
        rng: random.Random | None = None,
        open_websocket: OpenWebSocket = open_websocket,
        token: str | None = None,
    ) -> None:
        """`rng` and `open_websocket` are seams for the simulations, which run clients over
        memory streams with one seeded random source."""
        self._session = Session(expires_in)
        self._connection: Connection | None = None
        self._connecting = anyio.Lock()
        self._leases: set[Lease] = set()
        self._tasks: anyio.abc.TaskGroup | None = None
        self._rng = rng or random.Random()
        self._open_websocket = open_websocket
        self._hello = (
            {"hello": PROTOCOL_VERSION}
            if token is None
            else {
                "hello": PROTOCOL_VERSION,
                "token": token,
            }
        )
        self._nodes = NodeChoice(urls, self._rng)
        # Lease mode (client/slices.py): the limiters in it, this client's holder id, and its
        # slices of each key it checked.
        self._lease_terms: dict[str, float] = {}
        self._holder = self._rng.getrandbits(63)
        self._slices: dict[tuple[str, str], KeySlices] = {}
        self._asked: dict[tuple[str, str], anyio.Event] = {}
        # The event loop's clock (`anyio.current_time` finds the loop on every call).
        self._now: Callable[[], float] = anyio.current_time
        # The peer of the current task's outermost lock (each task has a context of its own).
        self._task_peer: ContextVar[Peer | None] = ContextVar("sluicegate_peer", default=None)

    @property
    def node(self) -> str | None:
        """The node this client talks to now."""
        return self._connection.node if self._connection is not None else None

    @property
    def connection(self) -> Connection | None:
        """The current connection (its `frames_sent` and `requests_sent` show the batching)."""
        return self._connection

    def _running(self) -> anyio.abc.TaskGroup:
        """The client's task group, while it is entered (`async with`)."""
        if self._tasks is None:
            raise RuntimeError("the client is not entered: use `async with` around it")
        return self._tasks

    async def __aenter__(self) -> Client:
        self._now = event_loop_clock()
        self._tasks = anyio.create_task_group()
        await self._tasks.__aenter__()
        try:
            await self._connected(anyio.current_time() + CALL_PATIENCE)
        except BaseException:
            self._tasks.cancel_scope.cancel()
            await self._tasks.__aexit__(None, None, None)
            raise
        self._tasks.start_soon(self._heartbeats)
        return self

    async def __aexit__(self, *exc_info) -> bool | None:
        try:
            if self._connection is not None and not self._connection.closed:
                # Shielded (and bounded): a cancel from outside must not raise in here, where
                # the client's own task group is still to be exited with `exc_info`.
                with anyio.move_on_after(2, shield=True):
                    async with anyio.create_task_group() as releases:
                        for peer_id in list(self._session.peers):
                            request = self._session.request("release_peer", peer=peer_id)
                            releases.start_soon(self._quietly, self._connection.call, request)
                        now = self._now()
                        for (limiter, key), slices in self._slices.items():
                            reports = slices.closing_reports(now)
                            if not reports:
                                continue
                            request = self._session.lease(
                                limiter, key, self._holder, reports, 0, self._rng.getrandbits(64)
                            )
                            releases.start_soon(self._quietly, self._connection.call, request)
        finally:
            tasks = self._running()
            tasks.cancel_scope.cancel()
        return await tasks.__aexit__(*exc_info)

    # -- the API -----------------------------------------------------------------------------

    def lock(
        self, semaphore: str, count: int = 1, timeout: float | timedelta | None = None
    ) -> Locking:
        """Hold `count` of `semaphore` for the body of `async with`; wait at most `timeout`
        seconds for it (forever if None). Locks nested in one task must go down in level, as on
        HTTP. Also a decorator of async functions (each call holds the lock)."""
        return Locking(self, semaphore, count, seconds(timeout))

    async def remainder(self, semaphore: str) -> int:
        return await self._call(None, self._session.remainder, semaphore)

    def check(self, limiter: str, key: str = "", n: int = 1) -> Awaitable[RateDecision]:
        """`await client.check(...)`: go or sorry now, for `n` of `key` (none: the limiter is
        global). A limiter in lease mode is decided here, from a slice of the key's budget,
        without a round trip while the slice lasts (`remaining` is then the slice's). (Not
        `async def`: one coroutine less per check, which is most of its cost.)"""
        if self._lease_terms and limiter in self._lease_terms:
            return self._check_leased(limiter, key, n)
        retry_id = self._rng.getrandbits(64)
        return self._call(
            None, self._session.check, limiter, key, n, retry_id, then=RateDecision.from_answer
        )

    def rate_limited(
        self, limiter: str, key: str = "", n: int = 1, timeout: float | timedelta | None = None
    ) -> RateGate:
        """`async with client.rate_limited("api", key="u1"):` enters once the limiter says go
        (waiting in line at the node that decides, first come first served); `RateLimited`
        after `timeout` seconds (None: no limit). Also a decorator of async functions."""
        return RateGate(self, limiter, key, n, seconds(timeout))

    async def _check_leased(self, limiter: str, key: str, n: int) -> RateDecision:
        slices = self._slices.get((limiter, key))
        if slices is None:
            slices = self._new_slices(limiter, key)
        now = self._now()
        left = slices.spend(n, now)
        if left is None:
            if now < slices.not_before:
                return RateDecision(False, 0, slices.not_before - now)
            if slices.asking is None:
                await self._ask_slice(
                    limiter, key, slices, self._begin_ask(limiter, key, slices, n)
                )
            else:
                await self._asked[limiter, key].wait()
            now = self._now()
            left = slices.spend(n, now)
            if left is None:
                return RateDecision(False, 0, max(slices.not_before - now, SHORTEST_WAIT))
        if (left <= slices.renew_left or now >= slices.renew_at) and slices.due(now):
            ask = self._begin_ask(limiter, key, slices, 1)
            self._running().start_soon(self._renew_slice, limiter, key, slices, ask)
        return _decision(RateDecision, (True, left, 0.0))

    async def _admit_leased(
        self, limiter: str, key: str, n: int, timeout: float | None, deadline: float
    ) -> RateDecision:
        """Wait here, checking again when the slice or the owner's sorry says, until go."""
        while True:
            decision = await self._check_leased(limiter, key, n)
            if decision.go:
                return decision
            left = deadline - anyio.current_time()
            if left < SHORTEST_WAIT:
                raise RateLimited(f"{limiter!r} did not admit {n} within {timeout} s")
            await anyio.sleep(min(decision.retry_after, left))

    def _new_slices(self, limiter: str, key: str) -> KeySlices:
        if len(self._slices) >= MAX_SLICED_KEYS:
            now = self._now()
            for which in [w for w, s in self._slices.items() if s.idle(now)]:
                del self._slices[which]
        slices = self._slices[limiter, key] = KeySlices()
        return slices

    def _begin_ask(self, limiter: str, key: str, slices: KeySlices, n: int) -> Ask:
        """An ask for the key's next slice, from now (its term counts from here); the checks
        that find nothing left meanwhile wait for its answer."""
        self._asked[limiter, key] = anyio.Event()
        return slices.ask(self._now(), n)

    async def _ask_slice(self, limiter: str, key: str, slices: KeySlices, ask: Ask) -> None:
        """Send `ask` to the key's owner, and take its answer."""
        asked = self._asked[limiter, key]
        ask_id = self._rng.getrandbits(64)
        try:
            answer = await self._call(
                None, self._session.lease, limiter, key, self._holder, ask.reports, ask.want, ask_id
            )
        except BaseException:
            slices.failed()
            raise
        else:
            slices.granted(
                answer["slice"],
                answer["tokens"],
                answer["term"],
                answer["retry_after"],
                self._now(),
            )
        finally:
            del self._asked[limiter, key]
            asked.set()

    async def _renew_slice(self, limiter: str, key: str, slices: KeySlices, ask: Ask) -> None:
        try:
            await self._ask_slice(limiter, key, slices, ask)
        except (SluicegateError, ConnectionLost) as error:
            # The next check that finds nothing left asks again, and raises what is wrong.
            log.info("renewing a slice of %r failed: %s", limiter, error)

    async def _admit(self, limiter: str, key: str, n: int, timeout: float | None) -> RateDecision:
        deadline = math.inf if timeout is None else anyio.current_time() + timeout
        if self._lease_terms and limiter in self._lease_terms:
            return await self._admit_leased(limiter, key, n, timeout, deadline)
        while True:
            wait = min(max(deadline - anyio.current_time(), 0.0), WAIT_SLICE)
            retry_id = self._rng.getrandbits(64)
            answer = await self._call(None, self._session.wait, limiter, key, n, wait, retry_id)
            decision = RateDecision.from_answer(answer)
            if decision.go:
                return decision
            if deadline - anyio.current_time() < SHORTEST_WAIT:
                raise RateLimited(f"{limiter!r} did not admit {n} within {timeout} s")

    # -- internals ---------------------------------------------------------------------------

    # The steps of `lock`, also driven one by one from other threads (`client/blocking.py`).

    async def _take_peer(self) -> Peer:
        return self._session.idle_peer() or await self._new_peer()

    async def _let_go(self, peer: Peer, semaphore: str, lease: Lease) -> None:
        """Release a lease. Not shielded (a cancel scope per release costs much): if the task
        is cancelled meanwhile, or no node answers, the release may not have happened, so the
        peer stays marked unsettled and is dropped rather than reused (its expiry frees it)."""
        lease._scope = None
        self._leases.discard(lease)
        await self._release(peer, semaphore)

    async def _put_back(self, peer: Peer) -> None:
        self._session.put_back(peer)

    async def _new_peer(self) -> Peer:
        peer_id, sent_at = await self._renewing(None, self._session.new_peer)
        return self._session.created(peer_id, sent_at)

    async def _acquire(
        self, peer: Peer, semaphore: str, count: int, timeout: float | None
    ) -> Lease:
        deadline = math.inf if timeout is None else anyio.current_time() + timeout
        while True:
            now = anyio.current_time()
            wait = min(max(deadline - now, 0.0), WAIT_SLICE)
            seq = self._session.next_op(peer)
            try:
                result, sent_at = await self._renewing(
                    peer, self._session.acquire, peer, semaphore, count, wait, seq
                )
            except (UnknownSemaphore, Deadlock, LimitReached, Forbidden):
                raise  # refused: nothing waits
            except BaseException:
                # Cancelled, or given up on: the acquire may wait at the owner still, or have
                # been granted there unknown to us. Kept, the peer would hold that lock idle.
                # (An unsettled peer is not reused anyway.)
                if not peer.unsettled:
                    await self._withdraw(peer, semaphore)
                raise
            # An acquire prolongs its peer too, from when the try that was answered was sent.
            self._session.renewed(peer, sent_at)
            if self._session.acquired(peer, semaphore, count, result):
                lease = Lease(semaphore, count, peer.held[semaphore].token, peer.peer_id)
                self._leases.add(lease)
                return lease
            if deadline - anyio.current_time() < SHORTEST_WAIT:
                await self._withdraw(peer, semaphore)
                raise LockTimeout(f"{semaphore!r} not granted within {timeout} s")

    async def _withdraw(self, peer: Peer, semaphore: str) -> None:
        """Withdraw an acquire that returned no lease, shielded from cancellation for at most
        `WITHDRAW_PATIENCE` seconds. Unconfirmed, it leaves the peer unsettled: not reused once
        its task's locks are over (docs/cluster.md, "Keeping a lease")."""
        with anyio.move_on_after(WITHDRAW_PATIENCE, shield=True):
            try:
                await self._release(peer, semaphore)
            except (ConnectionLost, SluicegateError):
                pass

    async def _release(self, peer: Peer, semaphore: str) -> None:
        """Release or withdraw a lock. A release no node confirmed leaves the peer unsettled
        for good: the cluster may still count that lock, so the peer is not reused (its expiry
        frees it)."""
        self._session.released(peer, semaphore)
        settled = not peer.unsettled
        peer.unsettled = True
        seq = self._session.next_op(peer)
        try:
            await self._call(peer, self._session.release, peer, semaphore, seq)
        except Unavailable:
            return
        peer.unsettled = not settled

    async def _call(
        self,
        peer: Peer | None,
        build: Callable[..., dict],
        *args: object,
        then: Callable[[Any], Any] | None = None,
    ) -> Any:
        """Run the request `build(*args)` makes on some node: reconnect (to the next URL) when
        the connection breaks, restore `peer` when a node forgot it, retry while the cluster is
        unavailable, for at most `CALL_PATIENCE` seconds. Every request is idempotent (an
        operation on a peer's locks by its number, a rate-limit request by its retry id), so a
        retry after a broken connection is safe, and a copy that waited somewhere is refused.
        (The usual case, one request and its answer, comes first and without the retry
        machinery: it is the hot path of every call.)"""
        connection = self._connection
        if connection is not None and not connection.closed:
            try:
                result = await connection.call(build(*args))
            except (ConnectionLost, UnknownPeer, Unavailable) as failure:
                result = await self._call_patiently(lambda: build(*args), peer, failure, connection)
        else:
            result = await self._call_patiently(lambda: build(*args), peer, None, connection)
        return result if then is None else then(result)

    async def _call_patiently(
        self,
        build: Callable[[], dict],
        peer: Peer | None,
        failure: Exception | None,
        connection: Connection | None,
    ) -> Any:
        """`_call` after its first try on `connection`, which failed with `failure` (None: not
        made)."""
        recovery = CallRecovery(anyio.current_time(), self._rng, has_peer=peer is not None)
        while True:
            if failure is not None:
                # (The connection the failed try went on: another call may have moved this
                # client to another node while this one waited to try again.)
                decision = recovery.after(failure, anyio.current_time(), connection)
                if isinstance(decision, GiveUp):
                    raise decision.error
                if isinstance(decision, RestorePeer):
                    assert peer is not None  # only a call about a peer restores it
                    await self._restore(peer)
                else:
                    if decision.elsewhere:
                        self._leave(connection, f"it keeps answering unavailable ({failure})")
                    await anyio.sleep(decision.wait)
            try:
                connection = await self._connected(recovery.give_up_at)
                return await connection.call(build())
            except (ConnectionLost, UnknownPeer, Unavailable) as error:
                failure = error

    def _leave(self, connection: Connection | None, why: str) -> None:
        """Leave the node of `connection` for the next one (if no other call did already); its
        heartbeats on their way still wait for their answers there."""
        if connection is not None and connection is self._connection and not connection.closed:
            log.warning("leaving node %s for the next one: %s", connection.node, why)
            self._nodes.skip(anyio.current_time())
            connection.retire()

    async def _restore(self, peer: Peer) -> None:
        log.info(
            "restoring peer %d, which the node forgot, with %d locks", peer.peer_id, len(peer.held)
        )
        _, sent_at = await self._renewing(None, self._session.restore, peer)
        self._session.renewed(peer, sent_at)

    async def _renewing(
        self, peer: Peer | None, build: Callable[..., dict], *args: object
    ) -> tuple[Any, float]:
        """`_call` a request that sets a peer's expiry; its result, and when the request that
        was answered was sent (the peer lives at least its expiry from then)."""
        sent_at = -math.inf

        def stamped(*args: object) -> dict:
            nonlocal sent_at
            sent_at = anyio.current_time()
            return build(*args)

        result = await self._call(peer, stamped, *args)
        return result, sent_at

    async def _connected(self, give_up_at: float) -> Connection:
        connection = self._connection
        if connection is not None and not connection.closed:
            return connection
        async with self._connecting:
            if self._connection is not None and not self._connection.closed:
                return self._connection
            while True:
                try:
                    self._connection = await Connection.open(
                        self._running(),
                        self._nodes.url,
                        self._open_websocket,
                        # A node that takes long (paused) must not hold every call up for a
                        # good part of a peer's expiry.
                        min(CONNECT_TIMEOUT, self._session.expires_in / 5),
                        self._hello,
                    )
                except ConnectionLost as error:
                    log.warning("%s", error)
                    decision = self._nodes.failed(anyio.current_time(), give_up_at)
                    if isinstance(decision, GiveUp):
                        raise decision.error from None
                    await anyio.sleep(decision.wait)
                else:
                    if connection is not None:
                        log.info(
                            "connected to node %s (%s)", self._connection.node, self._nodes.url
                        )
                    self._nodes.connected()
                    self._lease_terms = self._connection.leases
                    return self._connection

    async def _heartbeats(self) -> None:
        """Every peer heartbeats at a third of its expiry (all of them in one frame), each
        until it is answered or its peer may have expired. A beat unanswered for half a beat on
        the current connection means that the node, or its way to the peers' homes, stalls
        with the connection open (a paused node, a clogged link between two nodes): the client
        leaves that node at once and beats again on the next. Looked for `STALL_CHECKS` times a
        beat, not only when the next beat is due: a beat that is due finds a node that stalled
        just after the last one, and the next node may stall too (docs/cluster.md, "Keeping a
        lease")."""
        beat = self._session.expires_in / 3
        next_beat = anyio.current_time() + beat
        while True:
            with anyio.CancelScope(
                deadline=min(next_beat, anyio.current_time() + beat / STALL_CHECKS)
            ):
                await anyio.sleep_forever()
            now = anyio.current_time()
            connection = self._connection
            stalled = (
                connection is not None
                and not connection.closed
                and connection.stalled(now - beat / 2)
            )
            if stalled:
                self._leave(connection, "a heartbeat there is unanswered for half a beat")
            if now >= next_beat:
                next_beat = now + beat
            elif not stalled:
                continue
            for peer in list(self._session.peers.values()):
                # A beat each time, even while earlier ones are on their way: with answers
                # slower than a beat, waiting for them would space renewals out beyond expiry.
                if len(peer.heartbeats_sent) < HEARTBEATS_IN_FLIGHT:
                    self._running().start_soon(self._heartbeat, peer)

    async def _heartbeat(self, peer: Peer) -> None:
        session = self._session
        now = anyio.current_time()
        # Until the peer may expire; one whose leases are lost already keeps trying a while.
        deadline = session.expires_at(peer)
        if deadline <= now:
            deadline = now + session.expires_in
        peer.heartbeats_sent.append(now)
        try:
            with anyio.CancelScope(deadline=deadline):
                _, sent_at = await self._renewing(peer, session.heartbeat, peer)
                session.renewed(peer, sent_at)
        except (Unavailable, UnknownPeer):
            pass  # tried until the peer may have expired, or a node forgot it twice
        except RequestRefused:
            # (A restore that raced another one of this peer: the node has it already.) A
            # background task must not take the client down; the next beat asks again.
            pass
        finally:
            peer.heartbeats_sent.remove(now)
        if anyio.current_time() >= session.expires_at(peer):
            self._lose_leases(peer)

    def _lose_leases(self, peer: Peer) -> None:
        """No node confirmed the peer before it could expire: its leases may be gone."""
        for lease in [lease for lease in self._leases if lease.peer_id == peer.peer_id]:
            if lease.lost:
                continue  # (another of the peer's beats found it lost first)
            log.error(
                "lost the lease on %r (peer %d): no node confirmed its heartbeat before it "
                "could expire",
                lease.semaphore,
                peer.peer_id,
            )
            lease.lost = True
            if lease._scope is not None:
                lease._scope.cancel()
        self._session.lost(peer)

    @staticmethod
    async def _quietly(call, request: dict) -> None:
        try:
            await call(request)
        except (ConnectionLost, UnknownPeer, Unavailable):
            pass


class Locking:
    """`async with client.lock(...) as lease:` (a class rather than a generator: this is the
    hot path of every lock)."""

    __slots__ = (
        "_client",
        "_semaphore",
        "_count",
        "_timeout",
        "_peer",
        "_outer",
        "_context",
        "_lease",
    )

    def __init__(self, client: Client, semaphore: str, count: int, timeout: float | None) -> None:
        self._client = client
        self._semaphore = semaphore
        self._count = count
        self._timeout = timeout

    async def __aenter__(self) -> Lease:
        client = self._client
        peer = client._task_peer.get()
        # The task's outermost lock takes a peer; the nested ones share it.
        self._outer = peer is None
        if peer is None:
            peer = await client._take_peer()
        self._peer = peer
        self._context = client._task_peer.set(peer)
        try:
            lease = await client._acquire(peer, self._semaphore, self._count, self._timeout)
        except BaseException:
            await self._leave()
            raise
        # A lost lease cancels the body through this scope.
        lease._scope = anyio.CancelScope()
        lease._scope.__enter__()
        self._lease = lease
        return lease

    async def __aexit__(self, etype, exc, tb) -> bool:
        lease = self._lease
        assert lease._scope is not None  # entered in `__aenter__`
        try:
            # True if the scope swallowed the cancellation it raised itself: the lease was lost.
            swallowed = lease._scope.__exit__(etype, exc, tb)
        finally:
            try:
                await self._client._let_go(self._peer, self._semaphore, lease)
            finally:
                await self._leave()
        if lease.lost and (etype is None or swallowed):
            raise LeaseLost(f"the lease on {self._semaphore!r} was lost: its peer expired")
        return swallowed

    async def _leave(self) -> None:
        self._client._task_peer.reset(self._context)
        if self._outer:
            await self._client._put_back(self._peer)

    def __call__(self, function):
        client, args = self._client, (self._semaphore, self._count, self._timeout)

        @functools.wraps(function)
        async def locked(*args_, **kwargs):
            async with Locking(client, *args):
                return await function(*args_, **kwargs)

        return locked


class RateGate:
    """`client.rate_limited(...)`: an async context manager, and a decorator of async
    functions (each call waits for go first)."""

    __slots__ = ("_client", "_limiter", "_key", "_n", "_timeout")

    def __init__(
        self, client: Client, limiter: str, key: str, n: int, timeout: float | None
    ) -> None:
        self._client = client
        self._limiter = limiter
        self._key = key
        self._n = n
        self._timeout = timeout

    async def __aenter__(self) -> RateDecision:
        return await self._client._admit(self._limiter, self._key, self._n, self._timeout)

    async def __aexit__(self, *exc_info) -> None:
        return None

    def __call__(self, function):
        @functools.wraps(function)
        async def admitted(*args, **kwargs):
            async with self:
                return await function(*args, **kwargs)

        return admitted
