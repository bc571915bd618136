"""The blocking API, shaped like throttle-client's, for threads and scripts:

    from sluicegate.client import lock
    with lock("ws://host:8000", "A", count=4, timeout=10) as lease:
        ...  # lease.fencing_token

Each `BlockingClient` runs the async client in an asyncio loop of its own, on a daemon thread;
calls from any thread go there and wait for the answer. The outermost lock of each context (a
thread, an asyncio task: whatever has a `contextvars` context of its own) takes a peer, and the
locks nested in it share that peer, as tasks do in the async API. `lock(url, ...)` and `lock`
used as a decorator share one client per set of URLs, started on first use.

After `os.fork()` the child has none of the parent's loop threads: each client starts a new loop
there on its next call, with peers of its own (the parent's stay the parent's)."""

from __future__ import annotations

import functools
import os
import threading
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import timedelta

import anyio
from anyio.from_thread import BlockingPortal

from .client import DEFAULT_EXPIRES_IN, Client, Lease, connect, seconds
from .session import LeaseLost, Peer, RateDecision

START_TIMEOUT = 30.0


class _Loop:
    """An asyncio loop on a daemon thread, running one async client until closed."""

    def __init__(self, urls: str | Sequence[str], expires_in: float, options: dict) -> None:
        self._client: Client | None = None
        self._portal: BlockingPortal | None = None
        self._started = threading.Event()
        self._failure: BaseException | None = None
        # A daemon: a process that never closes its clients (as `lock` never does) still exits.
        self._thread = threading.Thread(
            target=self._run,
            args=(urls, expires_in, options),
            name="sluicegate-client",
            daemon=True,
        )
        self._thread.start()
        if not self._started.wait(START_TIMEOUT):
            raise TimeoutError("the client's loop did not start")
        if self._failure is not None:
            raise self._failure

    @property
    def client(self) -> Client:
        assert self._client is not None  # set before `__init__` returns
        return self._client

    def run(self, afn, *args):
        assert self._portal is not None
        return self._portal.call(afn, *args)

    def close(self) -> None:
        if self._portal is not None and self._thread.is_alive():
            self._portal.call(self._portal.stop)
            self._thread.join(10)

    def _run(self, urls, expires_in: float, options: dict) -> None:
        try:
            anyio.run(self._main, urls, expires_in, options, backend="asyncio")
        except BaseException as failure:  # reported to the thread that started us
            self._failure = failure
            self._started.set()

    async def _main(self, urls, expires_in: float, options: dict) -> None:
        async with BlockingPortal() as portal:
            async with await connect(urls, expires_in=expires_in, **options) as client:
                self._portal, self._client = portal, client
                self._started.set()
                await portal.sleep_until_stopped()


class BlockingClient:
    """`connect`'s client for code that blocks; the same options (`connect`)."""

    def __init__(
        self,
        urls: str | Sequence[str],
        *,
        expires_in: float | timedelta = DEFAULT_EXPIRES_IN,
        **options,
    ) -> None:
        self._args = (urls, seconds(expires_in), options)
        # The peer of this context's outermost lock, and the loop it belongs to.
        self._peer: ContextVar[tuple[_Loop, Peer] | None] = ContextVar(
            "sluicegate_blocking_peer", default=None
        )
        self._starting = threading.Lock()
        self._loop: _Loop | None = _Loop(*self._args)
        _live.add(self)

    @contextmanager
    def lock(
        self, semaphore: str, count: int = 1, timeout: float | timedelta | None = None
    ) -> Iterator[Lease]:
        """Hold `count` of `semaphore` for the body; `LockTimeout` after `timeout` seconds;
        `LeaseLost` on exit if the lease could not be kept (and `lease.lost`). Also a
        decorator of functions (each call holds the lock)."""
        loop = self._running()
        client = loop.client
        held = self._peer.get()
        # (A peer of a loop left behind by a fork is the parent's.)
        outermost = held is None or held[0] is not loop
        if held is not None and not outermost:
            peer = held[1]
        else:
            peer = loop.run(client._take_peer)
            context = self._peer.set((loop, peer))
        try:
            lease = loop.run(client._acquire, peer, semaphore, count, seconds(timeout))
            try:
                yield lease
            finally:
                loop.run(client._let_go, peer, semaphore, lease)
            if lease.lost:
                raise LeaseLost(f"the lease on {semaphore!r} was lost: its peer expired")
        finally:
            if outermost:
                self._peer.reset(context)
                loop.run(client._put_back, peer)

    def remainder(self, semaphore: str) -> int:
        loop = self._running()
        return loop.run(loop.client.remainder, semaphore)

    def check(self, limiter: str, key: str = "", n: int = 1) -> RateDecision:
        """Go or sorry now (see `Client.check`)."""
        loop = self._running()
        return loop.run(loop.client.check, limiter, key, n)

    def rate_limited(
        self, limiter: str, key: str = "", n: int = 1, timeout: float | timedelta | None = None
    ) -> BlockingRateGate:
        """`with client.rate_limited("api", key="u1"):` enters once the limiter says go;
        `RateLimited` after `timeout` seconds. Also a decorator of functions."""
        return BlockingRateGate(self, limiter, key, n, seconds(timeout))

    def close(self) -> None:
        loop, self._loop = self._loop, None
        if loop is not None:
            loop.close()

    def __enter__(self) -> BlockingClient:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _running(self) -> _Loop:
        loop = self._loop
        if loop is None:
            with self._starting:
                if self._loop is None:
                    self._loop = _Loop(*self._args)
                loop = self._loop
        return loop

    def _forked(self) -> None:
        """In a child after `os.fork()`: the loop's thread stayed with the parent."""
        self._loop = None
        self._starting = threading.Lock()


class BlockingRateGate:
    def __init__(
        self, client: BlockingClient, limiter: str, key: str, n: int, timeout: float | None
    ) -> None:
        self._client = client
        self._args = (limiter, key, n, timeout)

    def __enter__(self) -> RateDecision:
        loop = self._client._running()
        return loop.run(loop.client._admit, *self._args)

    def __exit__(self, *exc_info) -> None:
        return None

    def __call__(self, function):
        @functools.wraps(function)
        def admitted(*args, **kwargs):
            with self:
                return function(*args, **kwargs)

        return admitted


_live: weakref.WeakSet[BlockingClient] = weakref.WeakSet()
_clients: dict[tuple[str, ...], BlockingClient] = {}
_clients_lock = threading.Lock()


def _after_fork_in_child() -> None:
    global _clients_lock
    # Another thread of the parent may have held it at the fork; none of them is here.
    _clients_lock = threading.Lock()
    for client in list(_live):
        client._forked()


os.register_at_fork(after_in_child=_after_fork_in_child)


@contextmanager
def lock(
    urls: str | Sequence[str],
    semaphore: str,
    count: int = 1,
    timeout: float | timedelta | None = None,
) -> Iterator[Lease]:
    """`with lock("ws://host:8000", "A", count=2, timeout=10) as lease:`; one client per set of
    URLs, shared by every thread of the process. Also a decorator of functions."""
    key = (urls,) if isinstance(urls, str) else tuple(urls)
    with _clients_lock:
        client = _clients.get(key)
        if client is None:
            client = _clients[key] = BlockingClient(list(key))
    with client.lock(semaphore, count, timeout) as lease:
        yield lease


__all__ = ["BlockingClient", "lock"]
