"""The WebSocket API's bytes (`/ws`, documented in docs/protocol.md): frames in, operations out,
answers back to frames. Nothing here does I/O; `node/ws_shell.py` runs a connection with it.

A request frame is a msgpack array of request maps, each with an `id` the answer quotes and an
`op`. An answer frame is an array of answer maps: `{"id": N, "ok": RESULT}` or
`{"id": N, "error": CODE, "message": TEXT}`. The operations are the HTTP API's, as the same
`cluster/semaphore_ops.py` values, so both ways in share one core and one set of rules.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, overload

import msgpack

from sluicegate.cluster import errors
from sluicegate.cluster.quota_leases import MAX_OPEN_PER_HOLDER, Grant, SliceReport
from sluicegate.cluster.rate_algorithms import Decision
from sluicegate.cluster.rate_limits import RateCheck, RateChecks, RateLease, RateOperation, RateWait
from sluicegate.cluster.semaphore_ops import (
    Acquire,
    AcquireOutcome,
    Heartbeat,
    IsAcquired,
    NewPeer,
    Operation,
    ReleaseLock,
    ReleasePeer,
    Remainder,
    Restore,
)

from .rpc import Unavailable
from .wire import MAX_FRAME

T = TypeVar("T")
D = TypeVar("D")

PROTOCOL_VERSION = 1
MAX_REQUESTS_PER_FRAME = 10_000
# Peer ids are unsigned 64-bit, as in the HTTP API.
MAX_PEER_ID = 2**64 - 1
# So are a rate-limit request's retry ids (the client picks them at random).
MAX_RETRY_ID = 2**64 - 1

# Close codes (RFC 6455 and the 4000-4999 private range).
CLOSE_TEXT_FRAME = 1003
CLOSE_UNDECODABLE = 1007
CLOSE_IDLE = 1001
CLOSE_NO_HELLO = 4000
CLOSE_VERSION = 4001
CLOSE_UNAUTHORIZED = 4401  # (as a node link refused)


class ProtocolViolation(Exception):
    """The connection cannot go on: close it with `code`."""

    def __init__(self, code: int, reason: str) -> None:
        # A close frame's reason has room for 123 bytes of UTF-8, and parts of it come from
        # the client.
        if len(reason.encode()) > 123:
            reason = reason.encode()[:120].decode(errors="ignore") + "..."
        super().__init__(code, reason)
        self.code = code
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Request:
    request_id: int
    op: Operation | RateOperation


@dataclass(frozen=True, slots=True)
class Rejected:
    """A request that cannot run: it is answered at once with this error."""

    request_id: int | None
    code: str
    message: str


class _BadRequest(Exception):
    pass


_MISSING = object()


@overload
def decode(frame: bytes | str, expect_hello: Literal[True]) -> dict: ...
@overload
def decode(frame: bytes | str, expect_hello: Literal[False]) -> list[Request | Rejected]: ...
def decode(frame: bytes | str, expect_hello: bool) -> dict | list[Request | Rejected]:
    """Decode one client frame: the hello (a map) first, then arrays of requests."""
    if isinstance(frame, str):
        raise ProtocolViolation(CLOSE_TEXT_FRAME, "binary frames only")
    try:
        value = msgpack.unpackb(frame, raw=False, strict_map_key=False)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as error:
        raise ProtocolViolation(CLOSE_UNDECODABLE, f"undecodable msgpack: {error}") from None
    except TypeError:
        # A map keyed by a map or an array: msgpack allows it, Python's dict does not.
        raise ProtocolViolation(
            CLOSE_UNDECODABLE, "undecodable msgpack: a map key is a container"
        ) from None
    if expect_hello:
        if not isinstance(value, dict) or "hello" not in value:
            raise ProtocolViolation(CLOSE_NO_HELLO, 'the first frame must be {"hello": VERSION}')
        if value["hello"] != PROTOCOL_VERSION:
            raise ProtocolViolation(
                CLOSE_VERSION, f"protocol version {PROTOCOL_VERSION} only, not {value['hello']!r}"
            )
        return value
    if not isinstance(value, list) or not value:
        raise ProtocolViolation(CLOSE_UNDECODABLE, "a frame is a non-empty array of requests")
    if len(value) > MAX_REQUESTS_PER_FRAME:
        raise ProtocolViolation(
            CLOSE_UNDECODABLE, f"at most {MAX_REQUESTS_PER_FRAME} requests per frame"
        )
    requests = [_request(item) for item in value]
    # A check asked `times` times counts as that many requests.
    repeated = sum(
        r.op.times - 1 for r in requests if type(r) is Request and type(r.op) is RateChecks
    )
    if len(value) + repeated > MAX_REQUESTS_PER_FRAME:
        raise ProtocolViolation(
            CLOSE_UNDECODABLE, f"at most {MAX_REQUESTS_PER_FRAME} requests per frame"
        )
    return requests


def welcome(node_id: str, idle_timeout: float, leases: Mapping[str, float]) -> bytes:
    """`leases`: the term of each rate limiter in lease mode (a client decides its checks from
    slices it asks for with `lease`)."""
    message = {
        "welcome": PROTOCOL_VERSION,
        "node": node_id,
        "max_frame": MAX_FRAME,
        "idle_timeout": idle_timeout,
        "check_times": True,  # a `check` may carry `times` (older nodes do not say so)
    }
    if leases:
        message["leases"] = dict(leases)
    return msgpack.packb(message)


def encode_answers(answers: list[dict]) -> list[bytes]:
    """Answers in as few frames as fit in `MAX_FRAME` bytes each (one frame, but for
    thousands of answers at once)."""
    frame = msgpack.packb(answers)
    if len(frame) <= MAX_FRAME or len(answers) == 1:
        return [frame]
    half = len(answers) // 2
    return encode_answers(answers[:half]) + encode_answers(answers[half:])


def decision(request_id: int, result: Decision) -> dict:
    """A rate limiter's answer (the hot path of `check`: built directly)."""
    return {
        "id": request_id,
        "ok": {"go": result.go, "remaining": result.remaining, "retry_after": result.retry_after},
    }


def decisions(request_id: int, results: list[Decision]) -> dict:
    """The answer to a check asked `times` times: its decisions, in order."""
    return {
        "id": request_id,
        "ok": [
            {"go": d.go, "remaining": d.remaining, "retry_after": d.retry_after} for d in results
        ],
    }


def ok(request_id: int, result: object) -> dict:
    if isinstance(result, Decision):
        return decision(request_id, result)
    if isinstance(result, list) and result and isinstance(result[0], Decision):
        return decisions(request_id, result)
    if isinstance(result, AcquireOutcome):
        result = (
            {"acquired": True, "token": result.fencing_token}
            if result.acquired
            else {"acquired": False}
        )
    elif isinstance(result, Grant):
        result = {
            "slice": result.slice_id,
            "tokens": result.tokens,
            "term": result.term,
            "retry_after": result.retry_after,
        }
    return {"id": request_id, "ok": result}


# The most characters of an error message: many quote what the client sent.
LONGEST_MESSAGE = 200


def error(request_id: int | None, code: str, message: str) -> dict:
    if len(message) > LONGEST_MESSAGE:
        message = message[:LONGEST_MESSAGE] + "..."
    return {"id": request_id, "error": code, "message": message}


def domain_error(request_id: int, failure: BaseException) -> dict:
    """The one place that turns an error of the core (or the cluster) into a stable code."""
    match failure:
        case errors.LimitError(code=code):
            return error(request_id, code, str(failure))
        case errors.Forbidden(reason=reason):
            return error(request_id, "forbidden", reason)
        case errors.UnknownSemaphore(semaphore=name):
            return error(request_id, "unknown_semaphore", f"Unknown semaphore {name!r}")
        case errors.UnknownPeer(peer_id=peer_id):
            return error(request_id, "unknown_peer", f"Unknown peer {peer_id}")
        case errors.InvalidLockCount(count=count):
            return error(request_id, "invalid_count", f"Lock count must be positive, not {count}")
        case errors.LockNeverAcquirable(asked=asked, max=max_):
            return error(
                request_id,
                "never_acquirable",
                f"Lock asks for count {asked} yet full count is only {max_}",
            )
        case errors.LockHierarchyViolation(current=current, requested=requested):
            return error(
                request_id,
                "deadlock",
                f"Lock level {requested} while holding level {current} could deadlock",
            )
        case errors.AlreadyPending():
            return error(request_id, "already_pending", "Only one pending lock per peer")
        case errors.RestoreConflict():
            return error(request_id, "restore_conflict", "A restore may not change a peer")
        case errors.ShrinkingLockCount():
            return error(request_id, "shrinking_count", "A held lock's count cannot shrink")
        case errors.StaleOperation(op=op, applied=applied):
            return error(request_id, "stale", f"Operation {op} is older than {applied}, applied")
        case errors.UnknownLimiter(limiter=limiter):
            return error(request_id, "unknown_limiter", f"Unknown rate limiter {limiter!r}")
        case errors.NotLeased(limiter=limiter):
            return error(request_id, "not_leased", f"Rate limiter {limiter!r} is not in lease mode")
        case errors.InvalidWeight(weight=weight, max_weight=most):
            return error(
                request_id, "invalid_weight", f"Weight must be from 1 to {most}, not {weight}"
            )
        case errors.NotServing(reason=reason) | Unavailable(args=(reason,)):
            return error(request_id, "unavailable", f"Unavailable, retry: {reason}")
    # Never raised: every error of the core is mapped above (and tested so).
    return error(request_id, "internal", type(failure).__name__)


# -- requests ----------------------------------------------------------------------------------


def _request(item: object) -> Request | Rejected:
    if not isinstance(item, dict):
        return Rejected(None, "bad_request", "a request is a map")
    request_id = item.get("id")
    if not isinstance(request_id, int) or isinstance(request_id, bool):
        return Rejected(None, "bad_request", "a request needs an integer id")
    op_name = item.get("op")
    build = _OPERATIONS.get(op_name) if isinstance(op_name, str) else None
    if build is None:
        return Rejected(request_id, "unknown_op", f"unknown op {op_name!r}")
    try:
        return Request(request_id, build(item))
    except _BadRequest as bad:
        return Rejected(request_id, "bad_request", str(bad))


@overload
def _field(item: dict, name: str, kind: type[T]) -> T: ...
@overload
def _field(item: dict, name: str, kind: type[T], default: D) -> T | D: ...
def _field(item: dict, name: str, kind: type, default: object = ...) -> Any:
    value = item.get(name, _MISSING)
    if type(value) is kind:  # the usual case, first (and bool is not int here)
        return value
    if value is _MISSING:
        if default is ...:
            raise _BadRequest(f"missing field {name!r}")
        return default
    if kind is float and type(value) is int:
        return float(value)
    if kind is dict and isinstance(value, dict):
        return value
    raise _BadRequest(f"field {name!r} must be {kind.__name__}")


def _peer(item: dict) -> int:
    peer_id = _field(item, "peer", int)
    if not 0 <= peer_id <= MAX_PEER_ID:
        raise _BadRequest("field 'peer' must be an unsigned 64-bit integer")
    return peer_id


@overload
def _seconds(item: dict, name: str) -> float: ...
@overload
def _seconds(item: dict, name: str, default: None) -> float | None: ...
def _seconds(item: dict, name: str, default: Any = ...) -> float | None:
    seconds: float | None = _field(item, name, float, default)
    if seconds is not None and not (math.isfinite(seconds) and seconds >= 0):
        raise _BadRequest(f"field {name!r} must be a finite number of seconds, 0 or more")
    return seconds


def _acquire(item: dict) -> Acquire:
    return Acquire(
        _peer(item),
        _field(item, "semaphore", str),
        _field(item, "count", int, 1),
        _seconds(item, "expires_in", None),
        _seconds(item, "wait", None),
        _seq(item),
    )


def _restore(item: dict) -> Restore:
    acquired = _field(item, "acquired", dict, {})
    for name, count in acquired.items():
        if not isinstance(name, str) or not isinstance(count, int) or isinstance(count, bool):
            raise _BadRequest("field 'acquired' maps semaphore names to counts")
    return Restore(_peer(item), _seconds(item, "expires_in"), acquired, _seq(item))


def _seq(item: dict) -> int | None:
    """The client's number for an operation on a peer (docs/protocol.md), if it gives one."""
    seq = _field(item, "seq", int, None)
    if seq is not None and not 0 < seq <= MAX_PEER_ID:
        raise _BadRequest("field 'seq' must be a positive 64-bit integer")
    return seq


def _check(item: dict) -> RateCheck | RateChecks:
    limiter, key, n = item.get("limiter"), item.get("key", ""), item.get("n", 1)
    if not (type(limiter) is str and type(key) is str and type(n) is int):
        limiter = _field(item, "limiter", str)  # raises the error that names the field
        key, n = _field(item, "key", str, ""), _field(item, "n", int, 1)
    times = item.get("times", 1)
    if times == 1 and type(times) is int:
        retry_id = item.get("retry_id")
        if retry_id is not None and not _is_retry_id(retry_id):
            retry_id = _retry_id(item)  # raises what is wrong
        return RateCheck(limiter, key, n, retry_id)  # the usual case
    times = _field(item, "times", int)
    if not 1 <= times <= MAX_REQUESTS_PER_FRAME:
        raise _BadRequest(f"field 'times' must be 1 to {MAX_REQUESTS_PER_FRAME}")
    listed = _field(item, "retry_ids", list, None)
    if listed is not None and (len(listed) != times or not all(_is_retry_id(r) for r in listed)):
        raise _BadRequest("field 'retry_ids' must hold one unsigned 64-bit integer per time asked")
    return RateChecks(limiter, key, n, times, None if listed is None else tuple(listed))


def _wait(item: dict) -> RateWait:
    return RateWait(
        _field(item, "limiter", str),
        _field(item, "key", str, ""),
        _field(item, "n", int, 1),
        _seconds(item, "timeout"),
        _retry_id(item),
    )


def _lease(item: dict) -> RateLease:
    holder = _field(item, "holder", int)
    if not 0 <= holder <= MAX_RETRY_ID:
        raise _BadRequest("field 'holder' must be an unsigned 64-bit integer")
    ask_id = _retry_id(item, "ask_id")
    if ask_id is None:
        raise _BadRequest("missing field 'ask_id'")
    want = _field(item, "want", int)
    if not 0 <= want <= MAX_RETRY_ID:
        raise _BadRequest("field 'want' must be an unsigned 64-bit integer")
    listed = _field(item, "reports", list, [])
    if len(listed) > 2 * MAX_OPEN_PER_HOLDER:
        raise _BadRequest(f"field 'reports' holds at most {2 * MAX_OPEN_PER_HOLDER} reports")
    reports = []
    for report in listed:
        if not (
            isinstance(report, list)
            and len(report) == 3
            and _is_retry_id(report[0])
            and _is_retry_id(report[1])
            and type(report[2]) is bool
        ):
            raise _BadRequest("each report must be [slice, spent, closed]")
        reports.append(SliceReport(report[0], report[1], report[2]))
    return RateLease(
        _field(item, "limiter", str),
        _field(item, "key", str, ""),
        holder,
        tuple(reports),
        want,
        ask_id,
    )


def _retry_id(item: dict, name: str = "retry_id") -> int | None:
    retry_id = item.get(name)
    if retry_id is None or _is_retry_id(retry_id):
        return retry_id
    raise _BadRequest(f"field {name!r} must be an unsigned 64-bit integer")


def _is_retry_id(value: object) -> bool:
    return type(value) is int and 0 <= value <= MAX_RETRY_ID


_OPERATIONS: dict[str, Callable[[dict], Operation | RateOperation]] = {
    "new_peer": lambda item: NewPeer(_seconds(item, "expires_in")),
    "heartbeat": lambda item: Heartbeat(_peer(item), _seconds(item, "expires_in")),
    "release_peer": lambda item: ReleasePeer(_peer(item), _seq(item)),
    "acquire": _acquire,
    "release": lambda item: ReleaseLock(_peer(item), _field(item, "semaphore", str), _seq(item)),
    "is_acquired": lambda item: IsAcquired(_peer(item)),
    "remainder": lambda item: Remainder(_field(item, "semaphore", str)),
    "restore": _restore,
    "check": _check,
    "wait": _wait,
    "lease": _lease,
}
OPERATION_NAMES = sorted(_OPERATIONS)
