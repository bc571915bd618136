"""Throttle's HTTP API spoken raw against a real node process (see THROTTLE_API.md).

Every answer is checked byte for byte: status, the exact Content-Type (or its absence: domain
errors and 405 carry none), and the exact body. `http.client` is used on purpose, so nothing
between the test and the socket rewrites headers or bodies.
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import threading
import time
from importlib.metadata import version
from urllib.parse import quote

import pytest

from tests.nodes import NodeProcess

pytestmark = pytest.mark.process

TEXT = "text/plain; charset=utf-8"
JSON = "application/json"
HTML = "text/html; charset=utf-8"

U64_MAX = 2**64 - 1
ODD = "a/b&c%"  # max 2 in NODE_CONFIG
UNI = "ünï code"  # max 1 in NODE_CONFIG

DEADLOCK = (
    "Lock hierachy violation. This may deadlock. The current lock level is {} the\n"
    "        requested lock level was {}."
)
NEVER = "Lock can never be acquired. Lock asks for count {} yet full count is only {}."
COUNT = "Lock count must be a positive number. Found: {}."
ALREADY_PENDING = b"Already pending. Only one pendig lock per peer is allowed."
SHRINKING = b"Shrinking the count of an existing lock is currently not implemented."
RESTORE_CONFLICT = b"Restore is not allowed to change existing peers."
UNSUPPORTED = b"Expected request with `Content-Type: application/json`"
JSON_SYNTAX = b"Failed to parse the request body as JSON: "
JSON_SHAPE = b"Failed to deserialize the JSON body into the target type: "
QUERY = b"Failed to deserialize query string: "
TOO_LARGE = b"Failed to buffer the request body: length limit exceeded"


# -- raw HTTP -----------------------------------------------------------------------------------


def call(node, method, path, body=None, headers=None, timeout=10.0):
    """One request on a fresh connection: (status, lowercased headers, body bytes).

    `body` as bytes is sent as it is; any other value (int, dict, ...) is sent as compact JSON with
    `Content-Type: application/json` unless `headers` names a Content-Type of its own.
    """
    headers = dict(headers or {})
    if body is not None and not isinstance(body, bytes):
        body = json.dumps(body, separators=(",", ":")).encode()
        if not any(key.lower() == "content-type" for key in headers):
            headers["Content-Type"] = JSON
    conn = http.client.HTTPConnection("127.0.0.1", node.port, timeout=timeout)
    try:
        try:
            conn.request(method, path, body=body, headers=headers)
        except (BrokenPipeError, ConnectionResetError):
            # The server answered early (413 on Content-Length) and closed while the body was
            # still on its way; its answer is already in our receive buffer.
            pass
        response = conn.getresponse()
        data = response.read()
        pairs = response.getheaders()
    finally:
        conn.close()
    lowered: dict[str, str] = {}
    for key, value in pairs:
        key = key.lower()
        assert key not in lowered, f"duplicate header {key!r} in {pairs}"
        lowered[key] = value
    if method != "HEAD" and "content-length" in lowered:
        assert int(lowered["content-length"]) == len(data)
    return response.status, lowered, data


def expect(result, status, body, content_type):
    """Exact status, Content-Type (None: the header must be absent) and body."""
    got_status, headers, data = result
    if isinstance(body, str):
        body = body.encode()
    assert (got_status, headers.get("content-type"), data) == (status, content_type, body)


def expect_domain(result, status, body):
    """A domain error: the message as the body and no Content-Type header at all."""
    expect(result, status, body, None)


def expect_prefix(result, status, prefix, content_type=TEXT):
    got_status, headers, data = result
    assert (got_status, headers.get("content-type")) == (status, content_type), data
    assert data.startswith(prefix), data
    assert len(data) > len(prefix), data


def seg(name: str) -> str:
    """A semaphore name as the stock client puts it in a path segment (encoded once)."""
    return quote(name, safe="")


def new_peer(node, expires_in="5m") -> int:
    status, headers, body = call(node, "POST", "/new_peer", {"expires_in": expires_in})
    assert (status, headers.get("content-type")) == (200, JSON), body
    assert re.fullmatch(rb"[0-9]+", body), body
    peer = int(body)
    assert 0 <= peer <= U64_MAX
    return peer


def acquire(node, peer, segment, count=1, query="", timeout=10.0):
    return call(node, "PUT", f"/peers/{peer}/{segment}{query}", count, timeout=timeout)


def acquired(node, peer, segment, count=1, query=""):
    expect(acquire(node, peer, segment, count, query), 200, str(peer), JSON)


def pending(node, peer, segment, count=1, query=""):
    expect(acquire(node, peer, segment, count, query), 202, str(peer), JSON)


def release(node, peer, segment):
    expect(call(node, "DELETE", f"/peers/{peer}/{segment}"), 200, "Ok", TEXT)


def delete_peer(node, peer):
    expect(call(node, "DELETE", f"/peers/{peer}"), 200, '"Peer released"', JSON)


def remainder(node, name) -> int:
    status, headers, body = call(node, "GET", "/remainder?semaphore=" + seg(name))
    assert (status, headers.get("content-type")) == (200, JSON), body
    assert re.fullmatch(rb"-?[0-9]+", body), body
    return int(body)


def is_acquired(node, peer) -> bool:
    status, headers, body = call(node, "GET", f"/peers/{peer}/is_acquired")
    assert (status, headers.get("content-type")) == (200, JSON), body
    assert body in (b"true", b"false"), body
    return body == b"true"


def listed(node) -> set[int]:
    status, headers, body = call(node, "GET", "/peers/")
    assert (status, headers.get("content-type")) == (200, JSON), body
    assert b" " not in body and b"\n" not in body, body  # compact JSON
    entries = json.loads(body)
    assert all(list(entry) == ["id"] for entry in entries), body
    return {entry["id"] for entry in entries}


class Later:
    """Run `action` in a thread after `delay` seconds; `join` waits for it (bounded)."""

    def __init__(self, delay, action):
        self.result = None
        self.error = None

        def run():
            time.sleep(delay)
            try:
                self.result = action()
            except BaseException as error:  # reported by join
                self.error = error

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def join(self, timeout=10.0):
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "background request did not finish"
        if self.error is not None:
            raise self.error
        return self.result


def raw_exchange(node, data: bytes, timeout=5.0) -> bytes:
    """Send raw bytes, half-close, and read whatever comes back until the server closes."""
    with socket.create_connection(("127.0.0.1", node.port), timeout=timeout) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        chunks = []
        try:
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        except (ConnectionResetError, TimeoutError):
            pass
        return b"".join(chunks)


# -- static routes --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path, body",
    [
        ("/", "Hello from Throttle!"),
        ("/health", "Ok"),
        ("/version", version("sluicegate")),
    ],
)
def test_text_routes(shared_node, path, body):
    expect(call(shared_node, "GET", path), 200, body, TEXT)


def test_favicon(shared_node):
    status, headers, body = call(shared_node, "GET", "/favicon.ico")
    assert (status, headers.get("content-type")) == (200, "image/x-icon")
    assert body.startswith(b"\x00\x00\x01\x00")
    assert len(body) > 6


def test_head_has_get_headers_and_no_body(node):
    peer = new_peer(node)
    paths = [
        "/",
        "/health",
        "/version",
        "/favicon.ico",
        "/metrics",
        "/peers/",
        "/remainder?semaphore=C",
        f"/peers/{peer}/is_acquired",
    ]
    for path in paths:
        get_status, get_headers, get_body = call(node, "GET", path)
        head_status, head_headers, head_body = call(node, "HEAD", path)
        get_headers.pop("date", None)
        head_headers.pop("date", None)
        assert (head_status, head_headers, head_body) == (get_status, get_headers, b""), path
        assert int(head_headers["content-length"]) == len(get_body), path


@pytest.mark.parametrize(
    "method, path, allow",
    [
        ("POST", "/", "GET,HEAD"),
        ("PUT", "/health", "GET,HEAD"),
        ("DELETE", "/version", "GET,HEAD"),
        ("POST", "/favicon.ico", "GET,HEAD"),
        ("POST", "/metrics", "GET,HEAD"),
        ("POST", "/peers/", "GET,HEAD"),
        ("DELETE", "/peers/", "GET,HEAD"),
        ("PUT", "/remainder?semaphore=A", "GET,HEAD"),
        ("GET", "/new_peer", "POST"),
        ("PUT", "/new_peer", "POST"),
        ("GET", "/restore", "POST"),
        ("GET", "/peers/1", "PUT,DELETE"),
        ("POST", "/peers/1", "PUT,DELETE"),
        ("GET", "/peers/abc", "PUT,DELETE"),  # the method is checked before the path is parsed
        ("GET", "/peers/1/A", "PUT,DELETE"),
        ("POST", "/peers/1/A", "PUT,DELETE"),
        ("PATCH", "/peers/1/A", "PUT,DELETE"),
        ("PUT", "/peers/1/is_acquired", "GET,HEAD"),  # the static segment wins
        ("DELETE", "/peers/1/is_acquired", "GET,HEAD"),
    ],
)
def test_wrong_method_is_405_with_allow_and_empty_body(shared_node, method, path, allow):
    body = {"expires_in": "5m"} if method in ("POST", "PUT") else None
    status, headers, data = call(shared_node, method, path, body)
    assert (status, data) == (405, b"")
    assert "content-type" not in headers, headers
    assert headers.get("allow") == allow


@pytest.mark.parametrize(
    "method, path",
    [
        ("GET", "/nope"),
        ("POST", "/nope"),
        ("GET", "/peers"),
        ("GET", "/health/"),
        ("GET", "/peers/1/A/extra"),
        ("PUT", "/peers/1/A/extra"),
        ("GET", "/remainder/A"),
        ("GET", "/new_peer/1"),
    ],
)
def test_unknown_path_is_404_html(shared_node, method, path):
    status, headers, body = call(shared_node, method, path)
    assert (status, headers.get("content-type")) == (404, HTML)
    assert b"<title>404 - Not Found</title>" in body


# -- peers --------------------------------------------------------------------------------------


def test_peer_lifecycle(node):
    expect(call(node, "GET", "/peers/"), 200, "[]", JSON)
    first = new_peer(node)
    expect(call(node, "GET", "/peers/"), 200, f'[{{"id":{first}}}]', JSON)
    second = new_peer(node, "1h 30m")
    assert second != first
    assert listed(node) == {first, second}

    expect(call(node, "PUT", f"/peers/{first}", {"expires_in": "5m"}), 200, "Ok", TEXT)
    expect(call(node, "PUT", f"/peers/{first}", {"expires_in": "1m 40s"}), 200, "Ok", TEXT)

    delete_peer(node, first)
    expect(call(node, "DELETE", f"/peers/{first}"), 200, '"Peer not found"', JSON)
    expect_domain(call(node, "PUT", f"/peers/{first}", {"expires_in": "5m"}), 400, "Unknown peer")
    expect_domain(call(node, "GET", f"/peers/{first}/is_acquired"), 400, "Unknown peer")
    assert listed(node) == {second}
    # An id that never existed: 200 all the same.
    expect(call(node, "DELETE", "/peers/0"), 200, '"Peer not found"', JSON)


def test_heartbeat_errors(shared_node):
    expect(call(shared_node, "PUT", "/peers/1", b'{"expires_in":"5m"}'), 415, UNSUPPORTED, TEXT)
    expect_prefix(
        call(shared_node, "PUT", "/peers/1", b"{", {"Content-Type": JSON}), 400, JSON_SYNTAX
    )
    expect_prefix(call(shared_node, "PUT", "/peers/1", {"expires_in": 5}), 422, JSON_SHAPE)
    expect_prefix(call(shared_node, "PUT", "/peers/1", {}), 422, JSON_SHAPE)
    expect_domain(call(shared_node, "PUT", "/peers/1", {"expires_in": "5m"}), 400, "Unknown peer")


@pytest.mark.parametrize(
    "headers, body, status, expected",
    [
        ({}, b'{"expires_in":"5m"}', 415, UNSUPPORTED),
        ({"Content-Type": "text/plain"}, b'{"expires_in":"5m"}', 415, UNSUPPORTED),
        ({"Content-Type": "application/x-www-form-urlencoded"}, b"expires_in=5m", 415, UNSUPPORTED),
        ({"Content-Type": JSON}, b"", 400, JSON_SYNTAX),
        ({"Content-Type": JSON}, b"{", 400, JSON_SYNTAX),
        ({"Content-Type": JSON}, b'{"expires_in":"5m"', 400, JSON_SYNTAX),
        ({"Content-Type": JSON}, b"{'expires_in':'5m'}", 400, JSON_SYNTAX),
        ({"Content-Type": JSON}, b'{"expires_in":"5m"} x', 400, JSON_SYNTAX),
        ({"Content-Type": JSON}, b"\xff\xfe", 400, JSON_SYNTAX),
        ({"Content-Type": JSON}, b"{}", 422, JSON_SHAPE),
        ({"Content-Type": JSON}, b'{"expires_in":5}', 422, JSON_SHAPE),
        ({"Content-Type": JSON}, b'{"expires_in":null}', 422, JSON_SHAPE),
        ({"Content-Type": JSON}, b'{"expires_in":"5x"}', 422, JSON_SHAPE),
        ({"Content-Type": JSON}, b'{"expires_in":"soon"}', 422, JSON_SHAPE),
        ({"Content-Type": JSON}, b'"5m"', 422, JSON_SHAPE),
        ({"Content-Type": JSON}, b"5", 422, JSON_SHAPE),
    ],
)
def test_new_peer_framework_errors(shared_node, headers, body, status, expected):
    result = call(shared_node, "POST", "/new_peer", body, headers)
    if expected == UNSUPPORTED:
        expect(result, status, expected, TEXT)
    else:
        expect_prefix(result, status, expected)


def test_new_peer_missing_field_names_it(shared_node):
    status, headers, body = call(shared_node, "POST", "/new_peer", {"expire_in": "5m"})
    assert (status, headers.get("content-type")) == (422, TEXT)
    assert body.startswith(JSON_SHAPE)
    assert b"missing field `expires_in`" in body


def test_new_peer_accepts_json_variants(shared_node):
    for content_type in ("application/json; charset=utf-8", "application/vnd.api+json"):
        headers = {"Content-Type": content_type}
        status, _, body = call(shared_node, "POST", "/new_peer", b'{"expires_in":"5m"}', headers)
        assert status == 200, body
        delete_peer(shared_node, int(body))
    # Unknown keys are ignored, whitespace is fine.
    status, _, body = call(
        shared_node,
        "POST",
        "/new_peer",
        b' { "expires_in" : "250ms" , "other" : [1, 2] } ',
        {"Content-Type": JSON},
    )
    assert status == 200, body
    call(shared_node, "DELETE", f"/peers/{int(body)}")


def test_struct_body_as_json_array_like_serde(shared_node):
    """serde_json reads a struct from an array of its fields in order, so Throttle takes this."""
    status, headers, body = call(shared_node, "POST", "/new_peer", ["5m"])
    assert (status, headers.get("content-type")) == (200, JSON), body
    delete_peer(shared_node, int(body))


SINGLE_ID_ROUTES = [
    ("PUT", "/peers/{}", {"expires_in": "5m"}),
    ("DELETE", "/peers/{}", None),
    ("GET", "/peers/{}/is_acquired", None),
]
PAIR_ID_ROUTES = [
    ("PUT", "/peers/{}/A", 1),
    ("DELETE", "/peers/{}/A", None),
]
BAD_IDS = ["abc", "-1", "18446744073709551616", "1.5", "0x10"]


@pytest.mark.parametrize("bad", BAD_IDS)
@pytest.mark.parametrize("method, template, body", SINGLE_ID_ROUTES)
def test_non_u64_peer_id_single_parameter_routes(shared_node, method, template, body, bad):
    # `Path<PeerId>` in Throttle: axum's ParseError.
    expect(
        call(shared_node, method, template.format(bad), body),
        400,
        f"Invalid URL: Cannot parse `{bad}` to a `u64`",
        TEXT,
    )


@pytest.mark.parametrize("bad", BAD_IDS[:3])
@pytest.mark.parametrize("method, template, body", PAIR_ID_ROUTES)
def test_non_u64_peer_id_two_parameter_routes(shared_node, method, template, body, bad):
    # Throttle extracts `Path<(PeerId, String)>` here (server/src/semaphore_shell.rs), and axum
    # 0.8's path deserializer reports a tuple element's failure as ParseErrorAtIndex.
    expect(
        call(shared_node, method, template.format(bad), body),
        400,
        f"Invalid URL: Cannot parse value at index 0 with value `{bad}` to a `u64`",
        TEXT,
    )


@pytest.mark.parametrize(
    "method, path, body, name",
    [
        ("PUT", "/peers/1/%FF", 1, "semaphore"),
        ("DELETE", "/peers/1/%C3", None, "semaphore"),
        ("PUT", "/peers/%FF/A", 1, "id"),
        ("GET", "/peers/%FF/is_acquired", None, "id"),
        ("PUT", "/peers/%FF", {"expires_in": "5m"}, "id"),
    ],
)
def test_invalid_utf8_in_path(shared_node, method, path, body, name):
    expect(
        call(shared_node, method, path, body), 400, f"Invalid URL: Invalid UTF-8 in `{name}`", TEXT
    )


def test_invalid_utf8_after_second_decoding_is_just_an_unknown_name(shared_node):
    expect_domain(call(shared_node, "PUT", "/peers/1/%25FF", 1), 400, "Unknown semaphore")


def test_path_id_is_checked_before_query_and_body(shared_node):
    status, headers, body = call(shared_node, "PUT", "/peers/abc/A?block_for=never", b"x")
    assert (status, headers.get("content-type")) == (400, TEXT)
    assert body.startswith(b"Invalid URL: "), body


def test_largest_u64_peer_id(node):
    body = {"expires_in": "5m", "peer_id": U64_MAX, "acquired": {"C": 1}}
    expect(call(node, "POST", "/restore", body), 200, "Ok", TEXT)
    expect(call(node, "GET", "/peers/"), 200, f'[{{"id":{U64_MAX}}}]', JSON)
    assert is_acquired(node, U64_MAX)
    acquired(node, U64_MAX, "C", 1)
    expect(call(node, "PUT", f"/peers/{U64_MAX}", {"expires_in": "5m"}), 200, "Ok", TEXT)
    # Rust's u64 parser takes a leading plus sign.
    expect(call(node, "GET", f"/peers/+{U64_MAX}/is_acquired"), 200, "true", JSON)
    release(node, U64_MAX, "C")
    assert remainder(node, "C") == 5
    delete_peer(node, U64_MAX)


# -- acquire ------------------------------------------------------------------------------------


def test_acquire_grant_pending_and_fifo(node):
    first, second, third = new_peer(node), new_peer(node), new_peer(node)
    acquired(node, first, "C", 4)
    assert remainder(node, "C") == 1
    pending(node, second, "C", 3)
    assert not is_acquired(node, second)
    # One unit is free, yet a newcomer queues behind the waiter: strict FIFO, no overtaking.
    pending(node, third, "C", 1)
    assert remainder(node, "C") == 1  # pending locks are not counted
    # Asking again with the same count is idempotent: 200/202 by the peer-wide flag.
    acquired(node, first, "C", 4)
    pending(node, second, "C", 3)
    release(node, first, "C")
    assert is_acquired(node, second) and is_acquired(node, third)
    assert remainder(node, "C") == 1
    acquired(node, second, "C", 3)


def test_acquire_check_order(node):
    holder, peer = new_peer(node), new_peer(node)
    unknown = 12345
    expires = "?expires_in=1m"

    # 1. unknown semaphore before everything else
    expect_domain(acquire(node, unknown, "Nope", 100, expires), 400, "Unknown semaphore")
    expect_domain(acquire(node, peer, "Nope", 1), 400, "Unknown semaphore")
    expect_domain(acquire(node, peer, "a", 1), 400, "Unknown semaphore")  # names are exact
    # 2. count > max, even for an unknown peer and with expires_in
    expect_domain(acquire(node, unknown, "A", 2, expires), 409, NEVER.format(2, 1))
    expect_domain(acquire(node, peer, "C", 6), 409, NEVER.format(6, 5))
    expect_domain(acquire(node, peer, "A", 2**63 - 1), 409, NEVER.format(2**63 - 1, 1))
    # 3. expires_in in the query touches the peer before the count is checked
    expect_domain(acquire(node, unknown, "A", 0, expires), 400, "Unknown peer")
    # 4. count < 1
    expect_domain(acquire(node, unknown, "A", 0), 400, COUNT.format(0))
    expect_domain(acquire(node, peer, "A", -5), 400, COUNT.format(-5))
    expect_domain(acquire(node, peer, "A", -(2**63)), 400, COUNT.format(-(2**63)))
    # 5. unknown peer
    expect_domain(acquire(node, unknown, "A", 1), 400, "Unknown peer")

    # 6. the same semaphore again: same count idempotent, smaller 501, larger deadlock at its level
    acquired(node, peer, "C", 2)
    acquired(node, peer, "C", 2)  # before the level check, which would refuse level 0 <= 0
    expect_domain(acquire(node, peer, "C", 1), 501, SHRINKING)
    expect_domain(acquire(node, peer, "C", 3), 409, DEADLOCK.format(0, 0))
    expect_domain(acquire(node, peer, "C", 0), 400, COUNT.format(0))  # 4 comes before 6
    # 7. lock levels: holding C (level 0), asking A (level 0) or B (level 1)
    expect_domain(acquire(node, peer, "A", 1), 409, DEADLOCK.format(0, 0))
    expect_domain(acquire(node, peer, "B", 1), 409, DEADLOCK.format(0, 1))
    # Holding B (level 1), A (level 0) is fine.
    climber = new_peer(node)
    acquired(node, climber, "B", 1)
    acquired(node, holder, "A", 1)
    pending(node, climber, "A", 1)
    # 8. one pending lock per peer
    expect_domain(acquire(node, climber, "C", 1), 409, ALREADY_PENDING)
    expect_domain(acquire(node, climber, seg(ODD), 1), 409, ALREADY_PENDING)
    # ... the pending one itself is idempotent
    pending(node, climber, "A", 1)
    # ... and so is the held one, answered by the peer-wide flag: 202 while A is pending.
    pending(node, climber, "B", 1)
    # 9. released: the waiter is granted, and the same requests now answer 200.
    release(node, holder, "A")
    acquired(node, climber, "A", 1)
    acquired(node, climber, "B", 1)


LEVELS_CONFIG = """
[semaphores]
Zero = 3
Other = 3
One = { max = 3, level = 1 }
Two = { max = 3, level = 2 }
"""


def test_lock_levels(tmp_path):
    with NodeProcess(LEVELS_CONFIG, workdir=tmp_path) as node:
        high, mid, filler = new_peer(node), new_peer(node), new_peer(node)
        acquired(node, high, "Two", 2)
        # A larger count for the same semaphore: Deadlock with its own level twice.
        expect_domain(acquire(node, high, "Two", 3), 409, DEADLOCK.format(2, 2))
        expect_domain(acquire(node, high, "Two", 1), 501, SHRINKING)
        # Descending is fine: the current level is the lowest held.
        acquired(node, high, "One", 1)
        expect_domain(acquire(node, high, "Two", 3), 409, DEADLOCK.format(2, 2))
        acquired(node, high, "Zero", 1)
        expect_domain(acquire(node, high, "Other", 1), 409, DEADLOCK.format(0, 0))

        acquired(node, mid, "One", 1)
        expect_domain(acquire(node, mid, "Two", 1), 409, DEADLOCK.format(1, 2))
        expect_domain(acquire(node, mid, "One", 2), 409, DEADLOCK.format(1, 1))
        acquired(node, filler, "Zero", 2)
        pending(node, mid, "Zero", 1)
        # Level check (7) before the pending check (8) ...
        expect_domain(acquire(node, mid, "Two", 1), 409, DEADLOCK.format(1, 2))
        # ... and a lock that passes the level check meets the pending one.
        expect_domain(acquire(node, mid, "Other", 1), 409, ALREADY_PENDING)


def test_block_for_runs_out_with_202_and_lock_stays_pending(node):
    holder, waiter = new_peer(node), new_peer(node)
    acquired(node, holder, "A")
    start = time.monotonic()
    result = acquire(node, waiter, "A", 1, "?block_for=500ms")
    elapsed = time.monotonic() - start
    expect(result, 202, str(waiter), JSON)
    assert 0.49 <= elapsed < 3.0, elapsed
    assert not is_acquired(node, waiter)
    # Granted only: no longer blocked; the old pending lock is what gets the grant.
    release(node, holder, "A")
    assert is_acquired(node, waiter)
    assert remainder(node, "A") == 0
    # block_for on a lock that is free answers at once.
    other = new_peer(node)
    start = time.monotonic()
    expect(acquire(node, other, "C", 5, "?block_for=10s"), 200, str(other), JSON)
    assert time.monotonic() - start < 2.0


def test_block_for_answers_200_as_soon_as_released(node):
    holder, waiter = new_peer(node), new_peer(node)
    acquired(node, holder, "A")
    releaser = Later(0.3, lambda: call(node, "DELETE", f"/peers/{holder}/A"))
    start = time.monotonic()
    result = acquire(node, waiter, "A", 1, "?block_for=10s", timeout=15)
    elapsed = time.monotonic() - start
    expect(releaser.join(), 200, "Ok", TEXT)
    expect(result, 200, str(waiter), JSON)
    assert 0.25 <= elapsed < 3.0, elapsed
    assert is_acquired(node, waiter)


def test_block_for_answers_200_when_holder_peer_is_deleted(node):
    holder, waiter = new_peer(node), new_peer(node)
    acquired(node, holder, seg(UNI))
    deleter = Later(0.3, lambda: call(node, "DELETE", f"/peers/{holder}"))
    start = time.monotonic()
    result = acquire(node, waiter, seg(UNI), 1, "?block_for=10s", timeout=15)
    elapsed = time.monotonic() - start
    expect(deleter.join(), 200, '"Peer released"', JSON)
    expect(result, 200, str(waiter), JSON)
    assert 0.25 <= elapsed < 3.0, elapsed


def test_blocked_acquire_of_deleted_peer_is_unknown_peer(node):
    holder, waiter = new_peer(node), new_peer(node)
    acquired(node, holder, "A")
    deleter = Later(0.3, lambda: call(node, "DELETE", f"/peers/{waiter}"))
    start = time.monotonic()
    result = acquire(node, waiter, "A", 1, "?block_for=10s", timeout=15)
    elapsed = time.monotonic() - start
    expect(deleter.join(), 200, '"Peer released"', JSON)
    expect_domain(result, 400, "Unknown peer")
    assert 0.25 <= elapsed < 3.0, elapsed
    # Other clients were served while it was blocked; the holder still holds.
    assert is_acquired(node, holder)
    assert remainder(node, "A") == 0


def test_blocked_acquire_of_expiring_peer_is_unknown_peer(node):
    holder, waiter = new_peer(node), new_peer(node)
    acquired(node, holder, "A")
    start = time.monotonic()
    result = acquire(node, waiter, "A", 1, "?expires_in=400ms&block_for=10s", timeout=15)
    elapsed = time.monotonic() - start
    expect_domain(result, 400, "Unknown peer")
    assert 0.35 <= elapsed < 3.0, elapsed
    assert listed(node) == {holder}


def test_other_clients_are_served_while_one_blocks(node):
    holder, waiter = new_peer(node), new_peer(node)
    acquired(node, holder, "A")
    blocked = Later(0, lambda: acquire(node, waiter, "A", 1, "?block_for=1500ms", timeout=15))
    time.sleep(0.2)
    start = time.monotonic()
    expect(call(node, "GET", "/health"), 200, "Ok", TEXT)
    assert remainder(node, "C") == 5
    assert time.monotonic() - start < 1.0
    expect(blocked.join(), 202, str(waiter), JSON)


@pytest.mark.parametrize(
    "query",
    [
        "?block_for=abc",
        "?block_for=5",
        "?block_for=",
        "?block_for=-1s",
        "?block_for=1.5s",
        "?expires_in=5x",
        "?expires_in=soon",
        "?block_for=1s&block_for=2s",
        "?expires_in=%FF",
    ],
)
def test_acquire_bad_query(shared_node, query):
    # The query is extracted before the body: even without a Content-Type it is a 400.
    expect_prefix(call(shared_node, "PUT", f"/peers/1/A{query}", b"1"), 400, QUERY)
    expect_prefix(call(shared_node, "PUT", f"/peers/1/A{query}", 1), 400, QUERY)


def test_acquire_query_humantime_and_unknown_keys(shared_node):
    peer = new_peer(shared_node)
    try:
        for query in (
            "?expires_in=5m",
            "?expires_in=1h+30m",
            "?expires_in=1h%2030m",
            "?expires_in=2M&block_for=250ms",
            "?block_for=0s",
            "?foo=bar&expires_in=30s",
            "?",
            "?&&",
        ):
            acquired(shared_node, peer, "C", 1, query)
    finally:
        delete_peer(shared_node, peer)


@pytest.mark.parametrize(
    "headers, body, status, expected",
    [
        ({}, b"1", 415, UNSUPPORTED),
        ({"Content-Type": "text/plain"}, b"1", 415, UNSUPPORTED),
        ({"Content-Type": JSON}, b"", 400, JSON_SYNTAX),
        ({"Content-Type": JSON}, b"one", 400, JSON_SYNTAX),
        ({"Content-Type": JSON}, b"1 2", 400, JSON_SYNTAX),
        ({"Content-Type": JSON}, b"NaN", 400, JSON_SYNTAX),
        ({"Content-Type": JSON}, b'"x"', 422, JSON_SHAPE),
        ({"Content-Type": JSON}, b'"1"', 422, JSON_SHAPE),
        ({"Content-Type": JSON}, b"1.5", 422, JSON_SHAPE),
        ({"Content-Type": JSON}, b"1.0", 422, JSON_SHAPE),
        ({"Content-Type": JSON}, b"1e3", 422, JSON_SHAPE),
        ({"Content-Type": JSON}, b"true", 422, JSON_SHAPE),
        ({"Content-Type": JSON}, b"null", 422, JSON_SHAPE),
        ({"Content-Type": JSON}, b"[1]", 422, JSON_SHAPE),
        ({"Content-Type": JSON}, b'{"count":1}', 422, JSON_SHAPE),
        ({"Content-Type": JSON}, b"9223372036854775808", 422, JSON_SHAPE),
    ],
)
def test_acquire_body_errors(shared_node, headers, body, status, expected):
    peer = new_peer(shared_node)
    try:
        # The body is read after the path and query, and before any semaphore check.
        for segment in ("C", "Nope"):
            result = call(shared_node, "PUT", f"/peers/{peer}/{segment}", body, headers)
            if expected == UNSUPPORTED:
                expect(result, status, expected, TEXT)
            else:
                expect_prefix(result, status, expected)
        assert is_acquired(shared_node, peer)
    finally:
        delete_peer(shared_node, peer)
    assert remainder(shared_node, "C") == 5


# -- release, is_acquired, remainder --------------------------------------------------------------


def test_release_lock(node):
    holder, waiter, idle = new_peer(node), new_peer(node), new_peer(node)
    acquired(node, holder, "A")
    pending(node, waiter, "A")
    # Not held: Ok all the same.
    release(node, idle, "A")
    release(node, idle, "C")
    # Releasing a pending lock withdraws it.
    release(node, waiter, "A")
    assert is_acquired(node, waiter)
    release(node, holder, "A")
    assert remainder(node, "A") == 1
    assert is_acquired(node, waiter)  # it did not get the lock it withdrew
    acquired(node, idle, "A")
    # Unknown semaphore is checked before the peer.
    expect_domain(call(node, "DELETE", "/peers/12345/Nope"), 400, "Unknown semaphore")
    expect_domain(call(node, "DELETE", f"/peers/{idle}/Nope"), 400, "Unknown semaphore")
    expect_domain(call(node, "DELETE", "/peers/12345/A"), 400, "Unknown peer")
    # DELETE needs no body and no Content-Type; a body is ignored.
    release(node, idle, "A")
    expect(call(node, "DELETE", f"/peers/{idle}/A", b"garbage"), 200, "Ok", TEXT)


def test_is_acquired(node):
    holder, waiter = new_peer(node), new_peer(node)
    expect(call(node, "GET", f"/peers/{waiter}/is_acquired"), 200, "true", JSON)
    acquired(node, holder, "A")
    pending(node, waiter, "A")
    expect(call(node, "GET", f"/peers/{waiter}/is_acquired"), 200, "false", JSON)
    expect(call(node, "GET", f"/peers/{holder}/is_acquired"), 200, "true", JSON)
    expect_domain(call(node, "GET", "/peers/12345/is_acquired"), 400, "Unknown peer")


def test_remainder(shared_node):
    expect(call(shared_node, "GET", "/remainder?semaphore=C"), 200, "5", JSON)
    expect(call(shared_node, "GET", "/remainder?semaphore=A&other=1"), 200, "1", JSON)
    expect(
        call(shared_node, "GET", "/remainder"),
        400,
        "Failed to deserialize query string: missing field `semaphore`",
        TEXT,
    )
    expect(
        call(shared_node, "GET", "/remainder?semaphor=A"),
        400,
        "Failed to deserialize query string: missing field `semaphore`",
        TEXT,
    )
    expect_prefix(call(shared_node, "GET", "/remainder?semaphore=A&semaphore=C"), 400, QUERY)
    expect_domain(call(shared_node, "GET", "/remainder?semaphore=Nope"), 400, "Unknown semaphore")
    expect_domain(call(shared_node, "GET", "/remainder?semaphore="), 400, "Unknown semaphore")
    expect_domain(call(shared_node, "GET", "/remainder?semaphore=a"), 400, "Unknown semaphore")


# -- restore ------------------------------------------------------------------------------------


def restore(node, peer_id, acquired_locks, expires_in="5m"):
    body = {"expires_in": expires_in, "peer_id": peer_id, "acquired": acquired_locks}
    return call(node, "POST", "/restore", body)


def test_restore(node):
    expect(restore(node, 42, {"C": 3, "B": 1}), 200, "Ok", TEXT)
    assert 42 in listed(node)
    assert is_acquired(node, 42)
    assert remainder(node, "C") == 2
    assert remainder(node, "B") == 0
    # Beyond max: counted as acquired all the same, so the remainder goes negative.
    expect(restore(node, 43, {"C": 4}), 200, "Ok", TEXT)
    assert remainder(node, "C") == -2
    newcomer = new_peer(node)
    pending(node, newcomer, "C", 3)
    # An identical restore is Ok; anything else for an existing peer is a 409.
    expect(restore(node, 42, {"B": 1, "C": 3}), 200, "Ok", TEXT)
    expect_domain(restore(node, 42, {"C": 3}), 409, RESTORE_CONFLICT)
    expect_domain(restore(node, 42, {"C": 2, "B": 1}), 409, RESTORE_CONFLICT)
    expect_domain(restore(node, 42, {}), 409, RESTORE_CONFLICT)
    expect_domain(restore(node, newcomer, {}), 409, RESTORE_CONFLICT)  # it has a pending lock
    # Domain errors of the body's contents.
    expect_domain(restore(node, 44, {"Nope": 1}), 400, "Unknown semaphore")
    expect_domain(restore(node, 44, {"C": 0}), 400, COUNT.format(0))
    expect_domain(restore(node, 44, {"C": -3}), 400, COUNT.format(-3))
    expect_domain(restore(node, 42, {"C": 0}), 400, COUNT.format(0))
    assert 44 not in listed(node)
    # Releasing the restored locks resolves the waiter once it fits.
    delete_peer(node, 43)
    assert remainder(node, "C") == 2
    assert not is_acquired(node, newcomer)
    release(node, 42, "C")
    assert is_acquired(node, newcomer)
    assert remainder(node, "C") == 2
    # A restored peer without locks.
    expect(restore(node, 45, {}), 200, "Ok", TEXT)
    expect(call(node, "GET", "/peers/45/is_acquired"), 200, "true", JSON)
    # Restore skips level checks: B (level 1) and A (level 0) and C together.
    expect(restore(node, 46, {"A": 1, "B": 1, "C": 1}), 200, "Ok", TEXT)


def test_identical_restore_does_not_extend_expiry(node):
    expect(restore(node, 7, {"C": 1}, expires_in="400ms"), 200, "Ok", TEXT)
    expect(restore(node, 7, {"C": 1}, expires_in="1h"), 200, "Ok", TEXT)
    time.sleep(0.8)
    expect_domain(call(node, "GET", "/peers/7/is_acquired"), 400, "Unknown peer")
    assert remainder(node, "C") == 5


@pytest.mark.parametrize(
    "body",
    [
        b'{"expires_in":"5m","peer_id":1}',
        b'{"expires_in":"5m","acquired":{}}',
        b'{"peer_id":1,"acquired":{}}',
        b'{"expires_in":"5m","peer_id":"1","acquired":{}}',
        b'{"expires_in":"5m","peer_id":-1,"acquired":{}}',
        b'{"expires_in":"5m","peer_id":1.5,"acquired":{}}',
        b'{"expires_in":"5m","peer_id":18446744073709551616,"acquired":{}}',
        b'{"expires_in":"5m","peer_id":1,"acquired":[]}',
        b'{"expires_in":"5m","peer_id":1,"acquired":{"C":"1"}}',
        b'{"expires_in":"5m","peer_id":1,"acquired":{"C":1.5}}',
        b'{"expires_in":5,"peer_id":1,"acquired":{}}',
        b"[]",
        b"1",
    ],
)
def test_restore_shape_errors(shared_node, body):
    expect_prefix(
        call(shared_node, "POST", "/restore", body, {"Content-Type": JSON}), 422, JSON_SHAPE
    )


def test_restore_framework_errors(shared_node):
    good = b'{"expires_in":"5m","peer_id":1,"acquired":{}}'
    expect(call(shared_node, "POST", "/restore", good), 415, UNSUPPORTED, TEXT)
    expect_prefix(
        call(shared_node, "POST", "/restore", good[:-1], {"Content-Type": JSON}), 400, JSON_SYNTAX
    )
    assert 1 not in listed(shared_node)


# -- percent-decoding -----------------------------------------------------------------------------


def test_semaphore_names_are_decoded_twice_in_the_path(node):
    once = seg(ODD)
    assert once == "a%2Fb%26c%25"
    twice = quote(once, safe="")
    assert twice == "a%252Fb%2526c%2525"
    first, second = new_peer(node), new_peer(node)
    acquired(node, first, twice, 1)
    expect(call(node, "GET", "/remainder?semaphore=a%2Fb%26c%25"), 200, "1", JSON)
    acquired(node, second, once, 1)
    expect(call(node, "GET", "/remainder?semaphore=a%2Fb%26c%25"), 200, "0", JSON)
    # The same lock, named either way: idempotent.
    acquired(node, first, once, 1)
    acquired(node, second, twice, 1)
    third = new_peer(node)
    pending(node, third, once, 1)
    # Released through the other spelling.
    release(node, first, once)
    assert is_acquired(node, third)
    release(node, second, twice)
    release(node, third, twice)
    expect(call(node, "GET", "/remainder?semaphore=a%2Fb%26c%25"), 200, "2", JSON)
    # The query parameter is decoded once only.
    expect_domain(
        call(node, "GET", "/remainder?semaphore=a%252Fb%2526c%2525"), 400, "Unknown semaphore"
    )
    # An unescaped `/` is a path separator, not part of the name.
    status, headers, _ = acquire(node, first, "a/b&c%25")
    assert (status, headers.get("content-type")) == (404, HTML)
    # Plain names may be escaped too.
    acquired(node, first, "%41", 1)
    acquired(node, first, "%2541", 1)
    expect(call(node, "GET", "/remainder?semaphore=%41"), 200, "0", JSON)


def test_unicode_semaphore_name(node):
    once = seg(UNI)
    assert once == "%C3%BCn%C3%AF%20code"
    twice = quote(once, safe="")
    peer, other = new_peer(node), new_peer(node)
    acquired(node, peer, once, 1)
    expect(call(node, "GET", "/remainder?semaphore=%C3%BCn%C3%AF%20code"), 200, "0", JSON)
    expect(call(node, "GET", "/remainder?semaphore=%C3%BCn%C3%AF+code"), 200, "0", JSON)
    pending(node, other, twice, 1)
    release(node, peer, twice)
    assert is_acquired(node, other)
    release(node, other, once)
    expect(call(node, "GET", "/remainder?semaphore=%C3%BCn%C3%AF+code"), 200, "1", JSON)
    # `+` is a space in the query only; in the path it is a plus sign.
    expect_domain(acquire(node, peer, "%C3%BCn%C3%AF+code", 1), 400, "Unknown semaphore")
    expect_domain(
        call(node, "GET", "/remainder?semaphore=%C3%BCn%C3%AF%2Bcode"), 400, "Unknown semaphore"
    )


# -- metrics ------------------------------------------------------------------------------------


def metrics_text(families: dict[str, dict[str, int]]) -> str:
    helps = {
        "throttle_acquired": "Sum of all acquired locks.",
        "throttle_longest_pending_sec": (
            "Time the longest pending peer is waiting until now, to acquire a lock to a semaphore."
        ),
        "throttle_max": "Maximum allowed lock count for this semaphore.",
        "throttle_pending": "Sum of all pending locks",
    }
    lines = []
    for name in sorted(helps):
        lines.append(f"# HELP {name} {helps[name]}")
        lines.append(f"# TYPE {name} gauge")
        for label, value in families[name].items():
            lines.append(f'{name}{{semaphore="{label}"}} {value}')
    return "".join(line + "\n" for line in lines)


def test_metrics_for_a_known_state(node):
    holder, waiter, other, odd = new_peer(node), new_peer(node), new_peer(node), new_peer(node)
    acquired(node, holder, "A")
    pending(node, waiter, "A")
    acquired(node, other, "C", 2)
    acquired(node, odd, seg(ODD), 1)
    names = ["A", "B", "C", ODD, UNI]  # sorted by label value
    expected = metrics_text(
        {
            "throttle_acquired": dict(zip(names, [1, 0, 2, 1, 0], strict=True)),
            "throttle_longest_pending_sec": dict(zip(names, [0, 0, 0, 0, 0], strict=True)),
            "throttle_max": dict(zip(names, [1, 1, 5, 2, 1], strict=True)),
            "throttle_pending": dict(zip(names, [1, 0, 0, 0, 0], strict=True)),
        }
    )
    expect(call(node, "GET", "/metrics"), 200, expected, TEXT)
    # Whole seconds, no decimal point.
    time.sleep(1.2)
    status, _, body = call(node, "GET", "/metrics")
    assert status == 200
    line = re.search(rb'^throttle_longest_pending_sec\{semaphore="A"\} (.*)$', body, re.M)
    assert line is not None and line.group(1) in (b"1", b"2"), body
    # Once resolved, the family drops back to zero.
    release(node, holder, "A")
    expected = metrics_text(
        {
            "throttle_acquired": dict(zip(names, [1, 0, 2, 1, 0], strict=True)),
            "throttle_longest_pending_sec": dict(zip(names, [0, 0, 0, 0, 0], strict=True)),
            "throttle_max": dict(zip(names, [1, 1, 5, 2, 1], strict=True)),
            "throttle_pending": dict(zip(names, [0, 0, 0, 0, 0], strict=True)),
        }
    )
    expect(call(node, "GET", "/metrics"), 200, expected, TEXT)


def test_metrics_without_semaphores_is_empty(tmp_path):
    with NodeProcess("", workdir=tmp_path) as node:
        expect(call(node, "GET", "/metrics"), 200, "", TEXT)
        expect_domain(call(node, "GET", "/remainder?semaphore=A"), 400, "Unknown semaphore")


ESCAPING_CONFIG = r"""
[semaphores]
"q\"uo\\te" = 1
"new\nline" = 2
"ä" = 3
a = 4
Z = 5
"""


def test_metrics_label_escaping_and_order(tmp_path):
    with NodeProcess(ESCAPING_CONFIG, workdir=tmp_path) as node:
        labels = ["Z", "a", "new\\nline", 'q\\"uo\\\\te', "ä"]
        expected = metrics_text(
            {
                "throttle_acquired": dict.fromkeys(labels, 0),
                "throttle_longest_pending_sec": dict.fromkeys(labels, 0),
                "throttle_max": dict(zip(labels, [5, 4, 2, 1, 3], strict=True)),
                "throttle_pending": dict.fromkeys(labels, 0),
            }
        )
        expect(call(node, "GET", "/metrics"), 200, expected, TEXT)
        peer = new_peer(node)
        acquired(node, peer, seg('q"uo\\te'), 1)
        expect(call(node, "GET", "/remainder?semaphore=" + seg("new\nline")), 200, "2", JSON)


# -- expiry -------------------------------------------------------------------------------------


def test_expiry_and_heartbeat(node):
    short, kept, holder = new_peer(node, "300ms"), new_peer(node, "300ms"), new_peer(node, "400ms")
    acquired(node, holder, "A")
    waiter = new_peer(node)
    pending(node, waiter, "A")
    time.sleep(0.1)
    expect(call(node, "PUT", f"/peers/{kept}", {"expires_in": "1h"}), 200, "Ok", TEXT)
    time.sleep(0.7)
    assert listed(node) == {kept, waiter}
    expect_domain(call(node, "PUT", f"/peers/{short}", {"expires_in": "5m"}), 400, "Unknown peer")
    # The expired holder's lock went to the waiter.
    assert is_acquired(node, waiter)
    # expires_in on an acquire sets the peer's expiry too.
    acquired(node, kept, "C", 1, "?expires_in=300ms")
    time.sleep(0.7)
    assert listed(node) == {waiter}
    assert remainder(node, "C") == 5


# -- abuse ----------------------------------------------------------------------------------------


def test_body_over_one_mib_is_413(shared_node):
    # The limit the brief asks for. NB: axum's own DefaultBodyLimit is 2 MB (2_097_152 bytes).
    limit = 1024 * 1024
    expect(
        call(shared_node, "POST", "/new_peer", b" " * (limit + 1), {"Content-Type": JSON}),
        413,
        TOO_LARGE,
        TEXT,
    )
    expect(
        call(shared_node, "PUT", "/peers/1/A", b" " * (limit + 1) + b"1", {"Content-Type": JSON}),
        413,
        TOO_LARGE,
        TEXT,
    )
    # Exactly at the limit is read (and here answered by the domain).
    body = b'{"expires_in":"5m","peer_id":1,"acquired":{"Nope":1}}'
    body = body + b" " * (limit - len(body))
    expect_domain(
        call(shared_node, "POST", "/restore", body, {"Content-Type": JSON}),
        400,
        "Unknown semaphore",
    )


def test_bad_requests_do_not_disturb_other_clients_locks(node):
    holder, other, waiter = new_peer(node), new_peer(node), new_peer(node)
    acquired(node, holder, "C", 3)
    acquired(node, other, "A")
    pending(node, waiter, "A")
    before = call(node, "GET", "/metrics")
    # A client that sends headers and then nothing, held open during the flood.
    lingering = socket.create_connection(("127.0.0.1", node.port), timeout=5)
    lingering.sendall(b"PUT /peers/1/C HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n")
    try:
        bad = [
            ("PUT", f"/peers/{holder}/C", b"{", {"Content-Type": JSON}),
            ("PUT", f"/peers/{holder}/C", b'"3"', {"Content-Type": JSON}),
            ("PUT", f"/peers/{holder}/C", b"3", {}),
            ("PUT", f"/peers/{holder}/C?block_for=x", b"3", {"Content-Type": JSON}),
            ("PUT", f"/peers/{holder}/C", b"1", {"Content-Type": JSON}),  # shrinking: 501
            ("PUT", f"/peers/{holder}/C", b"4", {"Content-Type": JSON}),  # growing: 409
            ("PUT", f"/peers/{holder}/Nope", b"1", {"Content-Type": JSON}),
            ("PUT", f"/peers/{holder}/A", b"1", {"Content-Type": JSON}),  # level: 409
            ("PUT", f"/peers/{waiter}/C", b"1", {"Content-Type": JSON}),  # already pending
            ("PUT", f"/peers/{holder}", b"{}", {"Content-Type": JSON}),
            ("DELETE", f"/peers/{holder}/Nope", None, {}),
            ("DELETE", f"/peers/{holder}x", None, {}),
            ("DELETE", f"/peers/{holder}x/C", None, {}),
            ("GET", f"/peers/{holder}/C", None, {}),
            (
                "POST",
                "/restore",
                b'{"expires_in":"5m","peer_id":%d,"acquired":{}}' % holder,
                {"Content-Type": JSON},
            ),
            (
                "POST",
                "/restore",
                b'{"expires_in":"5m","peer_id":%d,"acquired":{"C":0}}' % holder,
                {"Content-Type": JSON},
            ),
            ("POST", "/new_peer", b"x" * (1024 * 1024 + 1), {"Content-Type": JSON}),
            ("GET", "/remainder", None, {}),
            ("GET", "/nope", None, {}),
        ]
        for _ in range(8):
            for method, path, body, headers in bad:
                status, _, _ = call(node, method, path, body, headers)
                assert 400 <= status < 600, (method, path, status)
        # Broken connections: a body cut short, and bytes that are not HTTP at all.
        for _ in range(5):
            raw_exchange(
                node,
                b"PUT /peers/%d/C HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: 100\r\n\r\n1" % holder,
            )
            raw_exchange(node, b"NOT HTTP AT ALL\r\n\r\n")
        # The lingering client does not block anyone.
        start = time.monotonic()
        expect(call(node, "GET", "/health"), 200, "Ok", TEXT)
        assert time.monotonic() - start < 1.0
    finally:
        lingering.close()
    assert is_acquired(node, holder) and is_acquired(node, other)
    assert not is_acquired(node, waiter)
    assert remainder(node, "C") == 2
    assert remainder(node, "A") == 0
    assert listed(node) == {holder, other, waiter}
    after = call(node, "GET", "/metrics")
    strip = re.compile(rb"^throttle_longest_pending_sec.*$", re.M)
    assert strip.sub(b"", after[2]) == strip.sub(b"", before[2])
    # And the locks still work normally.
    release(node, other, "A")
    assert is_acquired(node, waiter)
