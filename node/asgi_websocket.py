"""An ASGI WebSocket (hypercorn's) behind trio-websocket's interface.

The node's port hands WebSocket handshakes to `node/websocket.py` (`node/listener.py`), except one
that comes after a request on a kept-alive HTTP connection: hypercorn serves that one, and this
adapter gives it the same `send_message` / `get_message` / `aclose`, raising the same
`ConnectionClosed`, so the `/ws` shell and the node links see one kind of connection.
"""

from __future__ import annotations

from trio_websocket import CloseReason, ConnectionClosed


class AsgiWebSocket:
    def __init__(self, receive, send) -> None:
        self._receive = receive
        self._send = send
        self.closed: CloseReason | None = None

    async def accept(self) -> bool:
        """Complete the opening handshake; False if the client went away first."""
        message = await self._receive()
        if message["type"] != "websocket.connect":
            return False
        await self._send({"type": "websocket.accept"})
        return True

    async def send_message(self, message: bytes | str) -> None:
        if self.closed is not None:
            raise ConnectionClosed(self.closed)
        key = "bytes" if isinstance(message, bytes) else "text"
        await self._send({"type": "websocket.send", key: message})

    async def get_message(self) -> bytes | str:
        if self.closed is not None:
            raise ConnectionClosed(self.closed)
        message = await self._receive()
        if message["type"] == "websocket.disconnect":
            self.closed = CloseReason(message.get("code", 1005), message.get("reason"))
            raise ConnectionClosed(self.closed)
        data = message.get("bytes")
        return data if data is not None else message.get("text", "")

    async def aclose(self, code: int = 1000, reason: str | None = None) -> None:
        if self.closed is None:
            self.closed = CloseReason(code, reason)
            await self._send({"type": "websocket.close", "code": code, "reason": reason or ""})
