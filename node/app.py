"""The node's one ASGI application (served by hypercorn's trio worker on the node's one port)."""

from __future__ import annotations

from .http_shell import Request, Response, Router, ThrottleApi, handle
from .semaphore_actor import SemaphoreActor


class NodeApp:
    def __init__(self, actor: SemaphoreActor) -> None:
        self.router = Router(ThrottleApi(actor))

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            request = Request(scope, receive)
            response = await handle(self.router, request)
            await _send(send, response, head=request.method == "HEAD")
        elif scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return


async def _send(send, response: Response, head: bool) -> None:
    headers = list(response.headers)
    if response.content_type is not None:
        headers.append((b"content-type", response.content_type.encode()))
    headers.append((b"content-length", str(len(response.body)).encode()))
    await send({"type": "http.response.start", "status": response.status, "headers": headers})
    await send({"type": "http.response.body", "body": b"" if head else response.body})
