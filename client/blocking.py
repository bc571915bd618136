"""The blocking API, shaped like throttle-client's, for threads, scripts and asyncio code (via
threads):

    from sluicegate.client import lock
    with lock("ws://host:8000", "A", count=4, timeout=10) as lease:
        ...  # lease.fencing_token

Each `BlockingClient` runs the async client in a trio loop of its own, on a daemon thread; calls
from any thread go there and wait for the answer. Every thread's outermost lock takes a peer,
and its nested locks share it, as tasks do in the async API. `lock(url, ...)` uses one client
per set of URLs, started on first use.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import trio

from .client import DEFAULT_EXPIRES_IN, Client, Lease, connect
from .session import LeaseLost, RateDecision

START_TIMEOUT = 30.0


class BlockingClient:
    def __init__(
        self, urls: str | Sequence[str], *, expires_in: float = DEFAULT_EXPIRES_IN
    ) -> None:
        self._urls = urls
        self._expires_in = expires_in
        self._token: trio.lowlevel.TrioToken | None = None
        self._client: Client | None = None
        self._stop: trio.Event | None = None
        self._started = threading.Event()
        self._failure: BaseException | None = None
        self._local = threading.local()
        self._thread = threading.Thread(target=self._run, name="sluicegate-client", daemon=True)
        self._thread.start()
        if not self._started.wait(START_TIMEOUT):
            raise TimeoutError("the client's loop did not start")
        if self._failure is not None:
            raise self._failure

    @contextmanager
    def lock(self, semaphore: str, count: int = 1, timeout: float | None = None) -> Iterator[Lease]:
        """Hold `count` of `semaphore` for the body; `LockTimeout` after `timeout` seconds;
        `LeaseLost` on exit if the lease could not be kept (and `lease.lost`)."""
        peer = getattr(self._local, "peer", None)
        outermost = peer is None
        if outermost:
            peer = self._run_in_loop(self._client._take_peer)
            self._local.peer = peer
        try:
            lease = self._run_in_loop(self._client._acquire, peer, semaphore, count, timeout)
            try:
                yield lease
            finally:
                self._run_in_loop(self._client._let_go, peer, semaphore, lease)
            if lease.lost:
                raise LeaseLost(f"the lease on {semaphore!r} was lost: its peer expired")
        finally:
            if outermost:
                self._local.peer = None
                self._run_in_loop(self._client._put_back, peer)

    def remainder(self, semaphore: str) -> int:
        return self._run_in_loop(self._client.remainder, semaphore)

    def check(self, limiter: str, key: str = "", n: int = 1) -> RateDecision:
        """Go or sorry now (see `Client.check`)."""
        return self._run_in_loop(self._client.check, limiter, key, n)

    def rate_limited(
        self, limiter: str, key: str = "", n: int = 1, timeout: float | None = None
    ) -> BlockingRateGate:
        """`with client.rate_limited("api", key="u1"):` enters once the limiter says go;
        `RateLimited` after `timeout` seconds. Also a decorator of functions."""
        return BlockingRateGate(self, limiter, key, n, timeout)

    def close(self) -> None:
        if self._token is not None and self._thread.is_alive():
            trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
            self._thread.join(10)

    def __enter__(self) -> BlockingClient:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _run_in_loop(self, afn, *args):
        return trio.from_thread.run(afn, *args, trio_token=self._token)

    def _run(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as failure:  # reported to the thread that started us
            self._failure = failure
            self._started.set()

    async def _main(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._stop = trio.Event()
        async with await connect(self._urls, expires_in=self._expires_in) as client:
            self._client = client
            self._started.set()
            await self._stop.wait()


class BlockingRateGate:
    def __init__(
        self, client: BlockingClient, limiter: str, key: str, n: int, timeout: float | None
    ) -> None:
        self._client = client
        self._args = (limiter, key, n, timeout)

    def __enter__(self) -> RateDecision:
        client = self._client
        return client._run_in_loop(client._client._admit, *self._args)

    def __exit__(self, *exc_info) -> None:
        return None

    def __call__(self, function):
        @functools.wraps(function)
        def admitted(*args, **kwargs):
            with self:
                return function(*args, **kwargs)

        return admitted


_clients: dict[tuple[str, ...], BlockingClient] = {}
_clients_lock = threading.Lock()


@contextmanager
def lock(
    urls: str | Sequence[str],
    semaphore: str,
    count: int = 1,
    timeout: float | None = None,
) -> Iterator[Lease]:
    """`with lock("ws://host:8000", "A", count=2, timeout=10) as lease:`; one client per set of
    URLs, shared by every thread of the process."""
    key = (urls,) if isinstance(urls, str) else tuple(urls)
    with _clients_lock:
        client = _clients.get(key)
        if client is None:
            client = _clients[key] = BlockingClient(list(key))
    with client.lock(semaphore, count, timeout) as lease:
        yield lease


__all__ = ["BlockingClient", "lock"]
