"""An ASGI WebSocket (hypercorn's, on the node's one port) behind trio-websocket's interface.

Node links dial out with trio-websocket and accept through hypercorn; this adapter gives the
accepted side the same `send_message` / `get_message` / `aclose`, raising the same
`ConnectionClosed`, so the link code sees one kind of connection.
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
