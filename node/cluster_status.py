"""Every other up member's own `GET /status.json`, asked by this node for `?all=1`.

The status page (node/static/status.html) shows the whole cluster, but each member answers only
for what it holds itself: its share of the slots, the semaphores it owns, the rate-limit checks it
decided. A browser reaches the node it talks to, and not always the others (their advertised
addresses may be inside a private network), so this node asks them over HTTP, all at once, each
within `MEMBER_TIMEOUT`: a member that does not answer in time is named with the reason, and the
page is as slow as that bound, never slower. Members this node believes down are not asked.

Any client may ask, so what one answer costs is shared: requests that come while the members are
being asked wait for that round, and an answer younger than `FRESH` is given again. However many
pages are open, a node asks each member at most once a `FRESH`, one connection at a time.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Callable

import h11
import trio

# How long one member may take to answer before it is reported as not answering.
MEMBER_TIMEOUT = 2.0
# The largest answer read from a member (its status lists every semaphore it owns).
MOST = 4 * 1024 * 1024
# How long the members' answers are given again before they are asked anew.
FRESH = 1.0


class NoAnswer(Exception):
    """A member's status could not be had; the message says why."""


async def get_json(
    address: str,
    path: str,
    timeout: float,
    most: int = MOST,
    tls: Callable[[], ssl.SSLContext] | None = None,
    authorization: bytes | None = None,
) -> object:
    """GET `path` from `address` (host:port) over HTTP/1.1, within `timeout` (over TLS with
    the context `tls()` gives, if given; with an `Authorization` header, if given): the JSON
    of a 200 answer; `NoAnswer` otherwise."""
    host, _, port = address.rpartition(":")
    try:
        with trio.fail_after(timeout):
            stream: trio.abc.Stream
            if tls is None:
                stream = await trio.open_tcp_stream(host.strip("[]"), int(port))
            else:
                stream = await trio.open_ssl_over_tcp_stream(
                    host.strip("[]"), int(port), ssl_context=tls(), https_compatible=True
                )
            async with stream:
                return json.loads(await _exchange(stream, address, path, most, authorization))
    except trio.TooSlowError:
        raise NoAnswer(f"no answer within {timeout:g} s") from None
    except (OSError, ValueError, h11.ProtocolError) as error:
        raise NoAnswer(str(error) or type(error).__name__) from None


async def _exchange(
    stream: trio.abc.Stream, address: str, path: str, most: int, authorization: bytes | None
) -> bytes:
    connection = h11.Connection(h11.CLIENT)
    headers = [("host", address), ("connection", "close")]
    if authorization is not None:
        headers.append(("authorization", authorization.decode("latin-1")))
    request = h11.Request(method="GET", target=path, headers=headers)
    await stream.send_all(connection.send(request) + connection.send(h11.EndOfMessage()))
    status, body = 0, bytearray()
    while True:
        event = connection.next_event()
        if event is h11.NEED_DATA:
            connection.receive_data(bytes(await stream.receive_some(65536)))
        elif isinstance(event, h11.Response):
            status = event.status_code
        elif isinstance(event, h11.Data):
            body += event.data
            if len(body) > most:
                raise NoAnswer(f"answer larger than {most} bytes")
        elif isinstance(event, h11.EndOfMessage):
            if status != 200:
                raise NoAnswer(f"HTTP {status}: {bytes(body[:200]).decode(errors='replace')}")
            return bytes(body)
        elif isinstance(event, h11.ConnectionClosed):
            raise NoAnswer("connection closed before the answer ended")


async def members_status(
    members: list[dict],
    me: str,
    authorization: bytes | None = None,
    timeout: float = MEMBER_TIMEOUT,
    tls: Callable[[], ssl.SSLContext] | None = None,
) -> list[dict]:
    """For every member of `members` (`MembershipActor.report` rows) that is up, other than
    `me`, by id: `{"id", "status"}` with its answer, or `{"id", "error"}` saying why there is
    none. `authorization`: the asker's credentials, passed on (on a node with tokens, every
    member knows the same); `tls`: as for `get_json`."""
    asked = sorted(m["id"] for m in members if m["state"] == "up" and m["id"] != me)
    address = {m["id"]: m["address"] for m in members}
    found: dict[str, dict] = {}

    async def ask(node_id: str) -> None:
        try:
            answer = await get_json(
                address[node_id], "/status.json", timeout, tls=tls, authorization=authorization
            )
            found[node_id] = {"id": node_id, "status": answer}
        except NoAnswer as error:
            found[node_id] = {"id": node_id, "error": str(error)}

    async with trio.open_nursery() as nursery:
        for node_id in asked:
            nursery.start_soon(ask, node_id)
    return [found[node_id] for node_id in asked]


class MemberStatuses:
    """`members_status`, asked at most once a `FRESH` and by one request at a time."""

    def __init__(self, ask=members_status, fresh: float = FRESH) -> None:
        self._ask = ask
        self._fresh = fresh
        self._lock = trio.Lock()
        self._answer: list[dict] = []
        self._asked_at = -float("inf")

    async def get(
        self, members: list[dict], me: str, authorization: bytes | None = None
    ) -> list[dict]:
        """The members' answers; `authorization` as for `members_status` (only admins ask on a
        node with tokens, so one's answer may be given to another)."""
        async with self._lock:
            if trio.current_time() >= self._asked_at + self._fresh:
                self._answer = await self._ask(members, me, authorization)
                self._asked_at = trio.current_time()
            return self._answer
