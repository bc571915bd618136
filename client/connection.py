"""One WebSocket to one node: requests go out batched, answers come back to whoever asked.

Requests queued while a frame is being sent leave together in the next frame, so many tasks
calling at once share frames (and round trips) without waiting for each other.
"""

from __future__ import annotations

import msgpack
import trio
from trio_websocket import ConnectionClosed, HandshakeError, connect_websocket_url

from .session import error_from

PROTOCOL_VERSION = 1
CONNECT_TIMEOUT = 5.0


class ConnectionLost(Exception):
    """The connection broke before the answer came; the request may or may not have run."""


class _Slot:
    __slots__ = ("done", "answer")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.answer: dict | None = None


class Connection:
    def __init__(self, ws, node: str) -> None:
        self._ws = ws
        self.node = node
        self._outbox: list[dict] = []
        self._ready = trio.Event()
        self._waiting: dict[int, _Slot] = {}
        self.closed = False
        self.frames_sent = 0
        self.requests_sent = 0

    @classmethod
    async def open(cls, nursery: trio.Nursery, url: str) -> Connection:
        """Connect to `url` (a node's `/ws`) and say hello; the connection lives in `nursery`."""
        try:
            with trio.fail_after(CONNECT_TIMEOUT):
                ws = await connect_websocket_url(nursery, url)
                await ws.send_message(msgpack.packb({"hello": PROTOCOL_VERSION}))
                welcome = msgpack.unpackb(await ws.get_message())
        except (OSError, HandshakeError, ConnectionClosed, trio.TooSlowError) as error:
            raise ConnectionLost(f"cannot connect to {url}: {error!r}") from None
        connection = cls(ws, welcome.get("node", url))
        nursery.start_soon(connection._run)
        return connection

    async def call(self, request: dict) -> object:
        """Send `request` and wait for its answer; its result, or the error it carries."""
        if self.closed:
            raise ConnectionLost("the connection is closed")
        slot = self._waiting[request["id"]] = _Slot()
        self._outbox.append(request)
        self._ready.set()
        try:
            await slot.done.wait()
        finally:
            self._waiting.pop(request["id"], None)
        if slot.answer is None:
            raise ConnectionLost(f"the connection to {self.node} broke")
        if "error" in slot.answer:
            raise error_from(slot.answer)
        return slot.answer.get("ok")

    async def aclose(self) -> None:
        self._fail_all()
        await self._ws.aclose()

    async def _run(self) -> None:
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._send_loop)
                await self._receive_loop()
                nursery.cancel_scope.cancel()
        except* (ConnectionClosed, trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            self._fail_all()

    async def _send_loop(self) -> None:
        while True:
            await self._ready.wait()
            # Let every task that is ready to run queue its request first: they share the frame.
            await trio.sleep(0)
            self._ready = trio.Event()
            batch, self._outbox = self._outbox, []
            await self._ws.send_message(msgpack.packb(batch))
            self.frames_sent += 1
            self.requests_sent += len(batch)

    async def _receive_loop(self) -> None:
        while True:
            frame = await self._ws.get_message()
            for answer in msgpack.unpackb(frame, strict_map_key=False):
                slot = self._waiting.get(answer.get("id"))
                if slot is not None:
                    slot.answer = answer
                    slot.done.set()

    def _fail_all(self) -> None:
        self.closed = True
        for slot in self._waiting.values():
            slot.done.set()
