"""The HTTP shell: Throttle's API, byte for byte, as one ASGI application.

Only bytes and errors live here: routing, decoding, and the single table that maps domain errors to
statuses and bodies. Every decision is the semaphore core's, reached through the actor.
The contract this file keeps is THROTTLE_API.md in the team's shared documents.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import math
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from importlib import resources
from importlib.metadata import PackageNotFoundError, version
from typing import Any, TypeVar
from urllib.parse import parse_qs, unquote_to_bytes

import trio

from sluicegate.cluster import errors
from sluicegate.cluster.auth import Credentials, Token, admit
from sluicegate.cluster.rate_limits import RateCheck, retry_after_header
from sluicegate.cluster.semaphore_ops import (
    LAST_PEER_ID,
    Acquire,
    Heartbeat,
    IsAcquired,
    NewPeer,
    Operation,
    ReleaseLock,
    ReleasePeer,
    Remainder,
    Restore,
)

from . import serde_compat as serde
from .cluster_admin import ClusterAdmin, refusal
from .cluster_status import MemberStatuses
from .config import whole_number
from .latencies import OTHER, Latencies
from .logs import clip
from .rate_limit_service import RateLimitService
from .rpc import Unavailable
from .semaphore_service import Semaphores
from .throttle_metrics import render as render_throttle_metrics

T = TypeVar("T")

log = logging.getLogger("sluicegate.http")

TEXT = "text/plain; charset=utf-8"
JSON = "application/json"
HTML = "text/html; charset=utf-8"
# Peers of `GET /peers/` encoded in one step.
ENCODE_CHUNK = 10_000

NOT_FOUND_PAGE = (
    b'<!DOCTYPE html>\n<html>\n\n<head>\n    <meta charset="UTF-8">\n'
    b"    <title>404 - Not Found</title>\n</head>\n\n<body>\n"
    b"    Sorry, the requested page does not exist.\n</body>\n\n</html>"
)

try:
    VERSION = version("sluicegate")
except PackageNotFoundError:  # running from a source tree that was never installed
    VERSION = "0.0.0"

_FAVICON = resources.files("sluicegate.node").joinpath("static/favicon.ico").read_bytes()
_STATUS_PAGE = resources.files("sluicegate.node").joinpath("static/status.html").read_bytes()


def _inline_hashes(page: bytes, tag: bytes) -> str:
    """The CSP sources that let `page`'s own inline `<tag>` elements in, by their SHA-256 (worked
    out here, so the page is edited without touching its policy)."""
    return " ".join(
        f"'sha256-{base64.b64encode(hashlib.sha256(body).digest()).decode()}'"
        for body in re.findall(rb"<" + tag + rb">(.*?)</" + tag + rb">", page, re.DOTALL)
    )


# The page may run only its own inline script and style, and talk only to this node: nothing
# a name in the data could smuggle in would load or run.
_STATUS_PAGE_POLICY = (
    f"default-src 'none'; script-src {_inline_hashes(_STATUS_PAGE, b'script')}; "
    f"style-src {_inline_hashes(_STATUS_PAGE, b'style')}; connect-src 'self'; img-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
).encode()


@dataclass
class Response:
    status: int
    body: bytes = b""
    content_type: str | None = None
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)


def text(body: str, status: int = 200) -> Response:
    return Response(status, body.encode(), TEXT)


def json_response(value: object, status: int = 200) -> Response:
    return Response(status, json.dumps(value, separators=(",", ":")).encode(), JSON)


class Rejection(Exception):
    """An extractor refused the request; the response says why."""

    def __init__(self, response: Response) -> None:
        super().__init__(response.status)
        self.response = response


def domain_error(error: errors.SemaphoreError) -> Response:
    """The one place that turns a domain error into Throttle's status and body (no Content-Type)."""
    match error:
        case errors.UnknownSemaphore():
            return Response(400, b"Unknown semaphore")
        case errors.UnknownPeer():
            return Response(400, b"Unknown peer")
        case errors.InvalidLockCount(count=count):
            return Response(400, f"Lock count must be a positive number. Found: {count}.".encode())
        case errors.LockNeverAcquirable(asked=asked, max=max_):
            return Response(
                409,
                f"Lock can never be acquired. Lock asks for count {asked} yet full count is only "
                f"{max_}.".encode(),
            )
        case errors.LockHierarchyViolation(current=current, requested=requested):
            return Response(
                409,
                "Lock hierachy violation. This may deadlock. The current lock level is "
                f"{current} the\n        requested lock level was {requested}.".encode(),
            )
        case errors.AlreadyPending():
            return Response(409, b"Already pending. Only one pendig lock per peer is allowed.")
        case errors.RestoreConflict():
            return Response(409, b"Restore is not allowed to change existing peers.")
        case errors.ShrinkingLockCount():
            return Response(
                501, b"Shrinking the count of an existing lock is currently not implemented."
            )
    raise TypeError(f"unmapped domain error {error!r}")


# -- requests and extractors ------------------------------------------------------------------


class Request:
    def __init__(
        self, scope: dict, receive: Callable[[], Awaitable[dict]], most: int = 1024 * 1024
    ) -> None:
        """`most`: the largest body read (413 past it)."""
        self.method: str = scope["method"]
        raw_path = scope.get("raw_path") or scope["path"].encode("utf-8")
        self.raw_path: bytes = raw_path.split(b"?", 1)[0]
        self.query: bytes = scope.get("query_string", b"")
        self.headers: list[tuple[bytes, bytes]] = scope.get("headers", [])
        self._receive = receive
        self._most = most
        self._body_read = trio.Event()
        # The token the request's credentials name, on a node with tokens (`handle`).
        self.token: Token | None = None

    def header(self, name: bytes) -> bytes | None:
        for key, value in self.headers:
            if key.lower() == name:
                return value
        return None

    async def body(self) -> bytes:
        length = self.header(b"content-length")
        declared = (
            None if length is None else whole_number(length.decode("latin-1"), self._most + 1)
        )
        if declared is not None and declared > self._most:
            raise Rejection(text("Failed to buffer the request body: length limit exceeded", 413))
        chunks, size = [], 0
        while True:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                raise Rejection(text("Client disconnected", 400))
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self._most:
                raise Rejection(
                    text("Failed to buffer the request body: length limit exceeded", 413)
                )
            chunks.append(chunk)
            if not message.get("more_body", False):
                self._body_read.set()
                return b"".join(chunks)

    async def cancel_when_gone(self, scope: trio.CancelScope) -> None:
        """Cancel `scope` when the client goes away (once the body is read: the handler reads
        it, and a handler that reads none answers at once)."""
        await self._body_read.wait()
        while (await self._receive())["type"] != "http.disconnect":
            pass
        scope.cancel()

    async def json(self) -> Any:
        content_type = (self.header(b"content-type") or b"").split(b";", 1)[0].strip().lower()
        if not (content_type == b"application/json" or content_type.endswith(b"+json")):
            raise Rejection(text("Expected request with `Content-Type: application/json`", 415))
        body = await self.body()
        try:
            return serde.parse_json(body)
        except serde.JsonSyntaxError as error:
            raise Rejection(
                text(f"Failed to parse the request body as JSON: {error}", 400)
            ) from None


def _shaped(convert: Callable[[], T]) -> T:
    try:
        return convert()
    except serde.ShapeError as error:
        raise Rejection(
            text(f"Failed to deserialize the JSON body into the target type: {error}", 422)
        ) from None


def _count(text: str) -> int:
    """A whole number of at most 20 digits (`?limit=` of `GET /peers/`, ours), with serde's
    wording for what is not one."""
    count = whole_number(text, LAST_PEER_ID + 1)
    if count is None:
        raise serde.ShapeError("invalid digit found in string")
    if count > LAST_PEER_ID:
        raise serde.ShapeError("number too large to fit in target type")
    return count


def _yes_or_no(text: str) -> bool:
    if text in ("1", "true"):
        return True
    if text in ("0", "false"):
        return False
    raise serde.ShapeError(f"expected 1, true, 0 or false, not {clip(text)!r}")


def _query(request: Request, fields: dict, required=()) -> dict:
    try:
        return serde.parse_query(request.query, fields, required)
    except serde.ShapeError as error:
        raise Rejection(text(f"Failed to deserialize query string: {error}", 400)) from None


def _path_text(segment: bytes, name: str) -> str:
    try:
        return unquote_to_bytes(segment).decode("utf-8")
    except UnicodeDecodeError:
        raise Rejection(text(f"Invalid URL: Invalid UTF-8 in `{name}`", 400)) from None


def _peer_id(segment: bytes, *, in_tuple: bool = False) -> int:
    value = _path_text(segment, "id")
    digits = value[1:] if value.startswith("+") else value
    peer_id = whole_number(digits, 2**64)
    if peer_id is not None and peer_id < 2**64:
        return peer_id
    # axum words it differently when the id is the first of two path parameters.
    where = f"value at index 0 with value `{value}`" if in_tuple else f"`{value}`"
    raise Rejection(text(f"Invalid URL: Cannot parse {where} to a `u64`", 400))


def _semaphore_name(segment: bytes) -> str:
    # Throttle decodes semaphore names twice: once in the router, once more in its handler.
    return unquote_to_bytes(_path_text(segment, "semaphore")).decode("utf-8", errors="replace")


def _expires_in_body(value: object) -> float:
    return _shaped(lambda: serde.struct(value, "ExpiresIn", {"expires_in": serde.duration}))[
        "expires_in"
    ]


# -- handlers ---------------------------------------------------------------------------------


class ThrottleApi:
    """Handlers for every Throttle route, bound to where semaphores are served."""

    def __init__(
        self,
        semaphores: Semaphores,
        rate_limits: RateLimitService,
        extra_metrics=lambda: "",
        member_statuses: MemberStatuses | None = None,
        cluster_admin: ClusterAdmin | None = None,
    ) -> None:
        """`member_statuses`: how the other members' statuses are asked (by default over
        plain HTTP); `cluster_admin`: a cluster node's, for `POST /drain` and `POST /forget`
        (node/cluster_admin.py)."""
        self.semaphores = semaphores
        self.rate_limits = rate_limits
        self.extra_metrics: Callable[[], str] = extra_metrics
        self.member_statuses = member_statuses or MemberStatuses()
        self.cluster_admin = cluster_admin

    async def index(self, request: Request) -> Response:
        return text("Hello from Throttle!")

    async def health(self, request: Request) -> Response:
        return text("Ok")

    async def ready(self, request: Request) -> Response:
        # Ours: 200 once this node can serve semaphores (a cluster node after joining).
        if self.semaphores.ready:
            return text("Ok")
        return text("Not ready", 503)

    async def version(self, request: Request) -> Response:
        return text(VERSION)

    async def favicon(self, request: Request) -> Response:
        return Response(200, _FAVICON, "image/x-icon")

    async def status(self, request: Request) -> Response:
        """Ours: this node, its members, the semaphores it owns and its rate limiters, as JSON
        for `sluicegate` (node/admin.py) and the status page. `?all=1` adds `member_status`:
        every other up member's own answer, or why there is none (node/cluster_status.py)."""
        query = _query(request, {"all": _yes_or_no})
        stats = await self.semaphores.stats()
        body = {
            "version": VERSION,
            **self.semaphores.status(),
            "semaphores": [
                {
                    "name": s.name,
                    "max": s.max,
                    "acquired": s.acquired,
                    "pending": s.pending,
                    "longest_pending": round(s.longest_pending, 3),
                }
                for s in stats
            ],
            "rate_limiters": self.rate_limits.status(),
        }
        if query.get("all"):
            body["member_status"] = (
                await self.member_statuses.get(
                    body["members"], body["node"], request.header(b"authorization")
                )
                if body["cluster"]
                else []
            )
        return json_response(body)

    def _proven(self, request: Request, action: str, node_id: str | None = None) -> ClusterAdmin:
        """The cluster node's admin, once `request` proves the cluster secret for `action` on
        `node_id` (None: this node; node/cluster_admin.py)."""
        admin = self.cluster_admin
        if admin is None:
            raise Rejection(text(f"Not a cluster node: nothing to {action}", 409))
        node_id = admin.node_id if node_id is None else node_id
        header = request.header(b"authorization")
        header_text = None if header is None else header.decode("latin-1")
        why = refusal(header_text, admin.secret, action, node_id, time.time())
        if why is not None:
            raise Rejection(text(why, 401))
        return admin

    async def drain_node(self, request: Request) -> Response:
        """Ours: the graceful leave SIGTERM starts, asked by someone who proves the cluster
        secret (`sluicegate drain`)."""
        admin = self._proven(request, "drain")
        keeps, live, counted = admin.majority_after()
        if not keeps and not admin.drain_asked.is_set():
            return text(
                f"Refused: {live - 1} live of {counted - 1} members counted would be left, no "
                "majority, and the cluster would stop serving. Bring the members that are down "
                "back first.",
                409,
            )
        if not admin.drain_asked.is_set():
            log.info("Asked to drain %s: handing its slots on, then stopping.", admin.node_id)
            admin.drain_asked.set()
        return text(f"Draining {admin.node_id}: its slots move to the others, then it stops.", 202)

    async def forget_member(self, request: Request) -> Response:
        """Ours: `?node=ID`, a member dead for good, stops counting for the quorum; asked by
        someone who proves the cluster secret (`sluicegate forget`)."""
        node_id = _query(request, {"node": str}, required=("node",))["node"]
        admin = self._proven(request, "forget", node_id)
        refused = admin.forget(node_id)
        if refused is None:
            return text(f"Forgot {node_id}: it no longer counts for the quorum.", 200)
        answer = text(f"Refused: {refused.reason}.", 409)
        if refused.retry_after:
            answer.headers.append((b"retry-after", str(math.ceil(refused.retry_after)).encode()))
        return answer

    async def status_page(self, request: Request) -> Response:
        """Ours: the status page for people (node/static/status.html), which polls
        `/status.json?all=1`."""
        headers = [
            (b"content-security-policy", _STATUS_PAGE_POLICY),
            (b"x-content-type-options", b"nosniff"),
            (b"cache-control", b"no-cache"),
        ]
        return Response(200, _STATUS_PAGE, HTML, headers)

    async def metrics(self, request: Request) -> Response:
        throttle = render_throttle_metrics(await self.semaphores.stats())
        return text(throttle + self.extra_metrics())

    async def _call(self, request: Request, op: Operation) -> Any:
        """`op` on the semaphores, if the request's token may make it."""
        if request.token is not None:
            op = admit(request.token, op)
        return await self.semaphores.call(op)

    async def new_peer(self, request: Request) -> Response:
        expires_in = _expires_in_body(await request.json())
        return json_response(await self._call(request, NewPeer(expires_in)))

    async def list_peers(self, request: Request) -> Response:
        """Every peer, or with a token that is not an admin's, the token's own."""
        limit = _query(request, {"limit": _count}).get("limit")
        token = request.token
        if token is None or token.admin:
            peer_ids = await self.semaphores.list_peers(limit)
        else:
            peer_ids = await self._own_peers(token, limit)
        # Encoded a chunk at a time, letting others in between (300,000 peers: 70 ms at once).
        parts = []
        for start in range(0, len(peer_ids), ENCODE_CHUNK):
            chunk = peer_ids[start : start + ENCODE_CHUNK]
            parts.append(",".join([f'{{"id":{peer_id}}}' for peer_id in chunk]))
            await trio.lowlevel.checkpoint()
        return Response(200, f"[{','.join(parts)}]".encode(), JSON)

    async def _own_peers(self, token: Token, limit: int | None) -> list[int]:
        own: list[int] = []
        every = await self.semaphores.list_peers()
        for start in range(0, len(every), ENCODE_CHUNK):
            own.extend(p for p in every[start : start + ENCODE_CHUNK] if token.owns(p))
            if limit is not None and len(own) >= limit:
                return own[:limit]
            await trio.lowlevel.checkpoint()
        return own

    async def heartbeat(self, request: Request, peer: bytes) -> Response:
        peer_id = _peer_id(peer)
        expires_in = _expires_in_body(await request.json())
        await self._call(request, Heartbeat(peer_id, expires_in))
        return text("Ok")

    async def release_peer(self, request: Request, peer: bytes) -> Response:
        released = await self._call(request, ReleasePeer(_peer_id(peer)))
        return json_response("Peer released" if released else "Peer not found")

    async def acquire(self, request: Request, peer: bytes, semaphore: bytes) -> Response:
        peer_id = _peer_id(peer, in_tuple=True)
        name = _semaphore_name(semaphore)
        query = _query(
            request, {"expires_in": serde.query_duration, "block_for": serde.query_duration}
        )
        body = await request.json()
        count = _shaped(lambda: serde.integer(body, serde.I64, "i64"))
        outcome = await self._call(
            request, Acquire(peer_id, name, count, query.get("expires_in"), query.get("block_for"))
        )
        response = json_response(peer_id, 200 if outcome.acquired else 202)
        if outcome.fencing_token is not None:
            # Our own addition, in a header so that Throttle's bytes stay as they are.
            response.headers.append((b"sluicegate-fencing-token", b"%d" % outcome.fencing_token))
        return response

    async def release_lock(self, request: Request, peer: bytes, semaphore: bytes) -> Response:
        peer_id = _peer_id(peer, in_tuple=True)
        await self._call(request, ReleaseLock(peer_id, _semaphore_name(semaphore)))
        return text("Ok")

    async def is_acquired(self, request: Request, peer: bytes) -> Response:
        return json_response(await self._call(request, IsAcquired(_peer_id(peer))))

    async def remainder(self, request: Request) -> Response:
        query = _query(request, {"semaphore": str}, required=("semaphore",))
        return json_response(await self._call(request, Remainder(query["semaphore"])))

    async def restore(self, request: Request) -> Response:
        body = await request.json()

        def acquired_map(value: object, path: str) -> dict[str, int]:
            if not isinstance(value, dict):
                raise serde.ShapeError(
                    f"{path}: invalid type: {serde.describe(value)}, expected a map"
                )
            return {
                name: serde.integer(count, serde.I64, "i64", f"{path}.{name}")
                for name, count in value.items()
            }

        fields = _shaped(
            lambda: serde.struct(
                body,
                "Restore",
                {
                    "expires_in": serde.duration,
                    "peer_id": lambda v, p: serde.integer(v, serde.U64, "u64", p),
                    "acquired": acquired_map,
                },
            )
        )
        await self._call(
            request, Restore(fields["peer_id"], fields["expires_in"], fields["acquired"])
        )
        return text("Ok")

    # -- ours: rate limits (docs/rate_limits.md) ---------------------------------------------

    async def rate_limit_check(self, request: Request, name: bytes) -> Response:
        limiter = _path_text(name, "name")
        key, n = _rate_limit_query(request.query)
        retry_id = _retry_id(request.header(b"idempotency-key"))
        check = RateCheck(limiter, key, n, retry_id)
        if request.token is not None:
            check = admit(request.token, check)
        decision = await self.rate_limits.call(check)
        body = {
            "go": decision.go,
            "remaining": decision.remaining,
            "retry_after": round(decision.retry_after, 6),
        }
        if decision.go:
            return json_response(body)
        response = json_response(body, 429)
        response.headers.append((b"retry-after", retry_after_header(decision.retry_after).encode()))
        return response


def _retry_id(idempotency_key: bytes | None) -> int | None:
    """The retry id of a check's `Idempotency-Key` header (any string the client picked, the
    same on every try): its first 64 bits of BLAKE2b."""
    if idempotency_key is None:
        return None
    return int.from_bytes(hashlib.blake2b(idempotency_key, digest_size=8).digest(), "big")


def _rate_limit_query(query: bytes) -> tuple[str, int]:
    """`key` (default: none, "") and `n` (default 1) of a rate-limit check."""
    try:
        fields = parse_qs(query.decode("utf-8"), keep_blank_values=True, strict_parsing=False)
    except UnicodeDecodeError:
        raise Rejection(rate_limit_error("bad_request", "the query is not UTF-8", 400)) from None
    key = fields.get("key", [""])[-1]
    n_text = fields.get("n", ["1"])[-1]
    # Any weight above a limiter's largest is refused alike.
    n = whole_number(n_text, 2**64)
    if n is None:
        raise Rejection(
            rate_limit_error("invalid_weight", f"n must be a whole number: {clip(n_text)!r}", 400)
        )
    return key, n


def rate_limit_error(code: str, message: str, status: int) -> Response:
    return json_response({"error": code, "message": message}, status)


def rate_limit_domain_error(error: errors.RateLimitError) -> Response:
    match error:
        case errors.UnknownLimiter(limiter=limiter):
            return rate_limit_error("unknown_limiter", f"Unknown rate limiter {limiter!r}", 404)
        case errors.InvalidWeight(weight=weight, max_weight=most):
            return rate_limit_error(
                "invalid_weight", f"Weight must be from 1 to {most}, not {weight}", 400
            )
    return rate_limit_error("internal", type(error).__name__, 500)


# -- routing ----------------------------------------------------------------------------------

GET = ("GET", "HEAD")


class Router:
    """Maps a raw (still percent-encoded) path to its handlers by method."""

    def __init__(self, api: ThrottleApi, latencies: Latencies) -> None:
        self.api = api
        self.latencies = latencies
        # A node with tokens (`[auth]`): who may use which route (`handle`).
        self.credentials: Credentials | None = None
        self.static = {
            b"/": {"GET": api.index},
            b"/health": {"GET": api.health},
            b"/ready": {"GET": api.ready},
            b"/version": {"GET": api.version},
            b"/favicon.ico": {"GET": api.favicon},
            b"/metrics": {"GET": api.metrics},
            b"/status": {"GET": api.status_page},
            b"/status.json": {"GET": api.status},
            b"/drain": {"POST": api.drain_node},
            b"/forget": {"POST": api.forget_member},
            b"/new_peer": {"POST": api.new_peer},
            b"/peers/": {"GET": api.list_peers},
            b"/remainder": {"GET": api.remainder},
            b"/restore": {"POST": api.restore},
        }

    def route(self, path: bytes) -> tuple[str, dict[str, Callable]] | None:
        """The route's template (`/peers/{id}`, say) and its handlers by method, partially
        applied to the path's parameters; None if no route."""
        static = self.static.get(path)
        if static is not None:
            return path.decode(), static
        parts = path.split(b"/")
        if len(parts) == 4 and parts[:2] == [b"", b"rate_limits"] and parts[3] == b"check":
            if not parts[2]:
                return None
            api, name = self.api, parts[2]
            return "/rate_limits/{name}/check", {"POST": lambda r: api.rate_limit_check(r, name)}
        if len(parts) not in (3, 4) or parts[0] != b"" or parts[1] != b"peers":
            return None
        if not all(parts[2:]):
            return None
        api, peer = self.api, parts[2]
        if len(parts) == 3:
            return "/peers/{id}", {
                "PUT": lambda r: api.heartbeat(r, peer),
                "DELETE": lambda r: api.release_peer(r, peer),
            }
        if parts[3] == b"is_acquired":  # the static segment wins over {semaphore}
            return "/peers/{id}/is_acquired", {"GET": lambda r: api.is_acquired(r, peer)}
        semaphore = parts[3]
        return "/peers/{id}/{semaphore}", {
            "PUT": lambda r: api.acquire(r, peer, semaphore),
            "DELETE": lambda r: api.release_lock(r, peer, semaphore),
        }


def allow_header(methods: dict[str, Callable]) -> bytes:
    # As axum writes it: GET brings HEAD along, methods joined by a bare comma.
    allowed: list[str] = []
    for method in methods:
        allowed.extend(GET if method == "GET" else (method,))
    return ",".join(allowed).encode()


async def handle(router: Router, request: Request) -> Response | None:
    """The response to `request`; None if its client went away first (a long poll it gave up,
    say): whatever the handler waited for is withdrawn."""
    arrived = trio.current_time()
    method = "GET" if request.method == "HEAD" else request.method
    route = router.route(request.raw_path)
    if route is None:
        response: Response | None = Response(404, NOT_FOUND_PAGE, HTML)
        template = method = OTHER
    else:
        template, handlers = route
        handler = handlers.get(method)
        if handler is None:
            response = Response(405, headers=[(b"allow", allow_header(handlers))])
            method = OTHER
        elif router.credentials is not None and not _open(router.credentials, template):
            response = _unauthorized(router.credentials, request, template)
            if response is None:
                response = await _served(handler, request)
        else:
            response = await _served(handler, request)
    if response is not None:
        router.latencies.http_answered(method, template, trio.current_time() - arrived)
    return response


# On a node with tokens: the routes that act on the cluster prove its secret instead of a token,
# and those that need an admin token. The others need a token (but the open ones of
# `INFO_ROUTES`), and the operations they make are held against its scopes (`ThrottleApi._call`).
CLUSTER_ROUTES = frozenset(("/drain", "/forget"))
ADMIN_ROUTES = frozenset(("/status", "/status.json"))


def _open(credentials: Credentials, template: str) -> bool:
    return template in credentials.open_routes or template in CLUSTER_ROUTES


def _unauthorized(credentials: Credentials, request: Request, template: str) -> Response | None:
    """The refusal of a request whose credentials name no token (401), or a token that may
    not use `template` (403); None if it may, with `request.token` set."""
    token = credentials.from_header(request.header(b"authorization"))
    if token is None:
        body = "Unauthorized: this node needs a token (Authorization: Bearer, or Basic)"
        challenge = (b"www-authenticate", b'Bearer, Basic realm="sluicegate"')
        return Response(401, body.encode(), TEXT, [challenge])
    if template in ADMIN_ROUTES and not token.admin:
        return text(f"Forbidden: {template} needs an admin token, not {token.name!r}", 403)
    request.token = token
    return None


async def _served(
    handler: Callable[[Request], Awaitable[Response]], request: Request
) -> Response | None:
    with trio.CancelScope() as gone:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(request.cancel_when_gone, gone)
            response = await _answer(handler, request)
            nursery.cancel_scope.cancel()
        return response
    return None


async def _answer(handler: Callable[[Request], Awaitable[Response]], request: Request) -> Response:
    try:
        return await handler(request)
    except Rejection as rejection:
        return rejection.response
    except errors.Forbidden as forbidden:
        if request.raw_path.startswith(b"/rate_limits/"):
            return rate_limit_error("forbidden", f"Forbidden: {forbidden}", 403)
        return text(f"Forbidden: {forbidden}", 403)
    except errors.LimitError as error:
        if request.raw_path.startswith(b"/rate_limits/"):
            return rate_limit_error(error.code, str(error), error.status)
        return text(str(error), error.status)
    except errors.SemaphoreError as error:
        return domain_error(error)
    except errors.RateLimitError as error:
        return rate_limit_domain_error(error)
    except Unavailable as unavailable:
        # The stock client retries 503; this is never a wrong answer, only a later one.
        log.info("503 for %s %s: %s", request.method, request.raw_path, unavailable)
        return text("Service Unavailable: no node can serve this request now; retry.", 503)
