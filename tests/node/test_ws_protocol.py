"""The `/ws` protocol's bytes without a network: requests, their checks, and error codes."""

from __future__ import annotations

import msgpack
import pytest

from sluicegate.cluster import errors
from sluicegate.cluster.quota_leases import Grant, SliceReport
from sluicegate.cluster.rate_limits import RateCheck, RateChecks, RateLease
from sluicegate.cluster.semaphore_ops import Acquire, Restore
from sluicegate.node import ws_protocol as protocol
from sluicegate.node.rpc import Unavailable

# A well-formed ask for a slice, for the bad ones to change one field of.
LEASE = {"id": 1, "op": "lease", "limiter": "a", "holder": 1, "want": 1, "ask_id": 1}


def decode(*requests: object) -> list:
    return protocol.decode(msgpack.packb(list(requests)), expect_hello=False)


def test_requests_become_the_operations_of_the_http_api():
    [acquire, restore] = decode(
        {"id": 1, "op": "acquire", "peer": 5, "semaphore": "A", "count": 2, "wait": 1},
        {"id": 2, "op": "restore", "peer": 5, "expires_in": 10, "acquired": {"A": 2}},
    )
    assert acquire == protocol.Request(1, Acquire(5, "A", 2, None, 1.0))
    assert restore == protocol.Request(2, Restore(5, 10.0, {"A": 2}))


def test_a_check_asked_times_times_is_one_request_that_counts_as_that_many():
    [once, thrice] = decode(
        {"id": 1, "op": "check", "limiter": "api", "times": 1},
        {"id": 2, "op": "check", "limiter": "api", "key": "u", "n": 2, "times": 3},
    )
    assert once == protocol.Request(1, RateCheck("api", "", 1))
    assert thrice == protocol.Request(2, RateChecks("api", "u", 2, 3))
    [once, thrice, wait] = decode(
        {"id": 1, "op": "check", "limiter": "api", "retry_id": 2**64 - 1},
        {"id": 2, "op": "check", "limiter": "api", "times": 3, "retry_ids": [4, 5, 6]},
        {"id": 3, "op": "wait", "limiter": "api", "timeout": 1, "retry_id": 0},
    )
    assert once.op == RateCheck("api", "", 1, 2**64 - 1)
    assert thrice.op == RateChecks("api", "", 1, 3, (4, 5, 6))
    assert wait.op.retry_id == 0
    decode(*[{"id": i, "op": "check", "limiter": "a", "times": 2} for i in range(5000)])
    with pytest.raises(protocol.ProtocolViolation) as violation:
        decode(
            {"id": 0, "op": "check", "limiter": "a", "times": 2},
            *[{"id": i, "op": "check", "limiter": "a", "times": 2} for i in range(1, 5000)],
            {"id": 5000, "op": "check", "limiter": "a"},
        )
    assert violation.value.code == protocol.CLOSE_UNDECODABLE


@pytest.mark.parametrize(
    ("request_map", "code"),
    [
        ({"id": 1, "op": "acquire", "peer": True, "semaphore": "A"}, "bad_request"),
        (
            {"id": 1, "op": "acquire", "peer": 1, "semaphore": "A", "wait": float("nan")},
            "bad_request",
        ),
        (
            {"id": 1, "op": "restore", "peer": 1, "expires_in": 1, "acquired": {"A": "x"}},
            "bad_request",
        ),
        ({"id": 1, "op": "heartbeat", "peer": 1}, "bad_request"),
        ({"id": 1, "op": 7}, "unknown_op"),
        ({"id": 1, "op": "check", "limiter": "api", "times": 0}, "bad_request"),
        ({"id": 1, "op": "check", "limiter": "api", "times": True}, "bad_request"),
        ({"id": 1, "op": "check", "limiter": "api", "times": 10_001}, "bad_request"),
        ({"id": 1, "op": "check", "limiter": "api", "times": "2"}, "bad_request"),
        ({"id": 1, "op": "check", "limiter": "api", "retry_id": -1}, "bad_request"),
        ({"id": 1, "op": "check", "limiter": "api", "retry_id": "7"}, "bad_request"),
        ({"id": 1, "op": "check", "limiter": "a", "times": 2, "retry_ids": [1]}, "bad_request"),
        ({"id": 1, "op": "check", "limiter": "a", "times": 2, "retry_ids": 1}, "bad_request"),
        ({"id": 1, "op": "wait", "limiter": "a", "timeout": 1, "retry_id": 0.5}, "bad_request"),
        ({**LEASE, "ask_id": None}, "bad_request"),
        ({**LEASE, "holder": -1}, "bad_request"),
        ({**LEASE, "reports": [[1, 2]]}, "bad_request"),
        ({**LEASE, "reports": [[1, 2, False]] * 5}, "bad_request"),
        ({"id": "1", "op": "new_peer"}, "bad_request"),
        ("not a map", "bad_request"),
    ],
)
def test_bad_requests_are_rejected_with_a_code(request_map, code):
    [rejected] = decode(request_map)
    assert isinstance(rejected, protocol.Rejected) and rejected.code == code


def test_every_error_of_the_core_has_a_code_of_its_own():
    samples = [
        errors.UnknownSemaphore("A"),
        errors.UnknownPeer(1),
        errors.LockNeverAcquirable(3, 2),
        errors.LockHierarchyViolation(0, 1),
        errors.AlreadyPending(),
        errors.InvalidLockCount(0),
        errors.RestoreConflict(),
        errors.ShrinkingLockCount(),
        errors.StaleOperation(3, 4),
        errors.NotServing("moving"),
        Unavailable("no link"),
        errors.BeyondLimit("key_length", "a key of 300 characters"),
        errors.QuotaFull("peers", "this node holds 3 peers"),
        errors.Forbidden("the token 'x' is read-only"),
    ]
    codes = [protocol.domain_error(1, sample)["error"] for sample in samples]
    assert "internal" not in codes
    assert len(set(codes)) == len(codes) - 1  # NotServing and Unavailable share "unavailable"
    # Every subclass is sampled: the limits' two through their base, LimitError.
    assert len(samples) - 3 == len(errors.SemaphoreError.__subclasses__()) - 1


def test_frames_that_are_not_requests_end_the_connection():
    with pytest.raises(protocol.ProtocolViolation) as violation:
        protocol.decode(msgpack.packb([]), expect_hello=False)
    assert violation.value.code == protocol.CLOSE_UNDECODABLE
    with pytest.raises(protocol.ProtocolViolation) as violation:
        protocol.decode(msgpack.packb({"hello": 1}), expect_hello=False)
    assert violation.value.code == protocol.CLOSE_UNDECODABLE


def test_an_ask_for_a_slice_and_its_grant():
    [ask] = decode(
        {
            "id": 4,
            "op": "lease",
            "limiter": "fetch",
            "key": "k",
            "holder": 2**63,
            "want": 30,
            "ask_id": 9,
            "reports": [[77, 5, True], [78, 0, False]],
        }
    )
    reports = (SliceReport(77, 5, True), SliceReport(78, 0, False))
    assert ask == protocol.Request(4, RateLease("fetch", "k", 2**63, reports, 30, 9))
    assert protocol.ok(4, Grant(79, 30, 0.5)) == {
        "id": 4,
        "ok": {"slice": 79, "tokens": 30, "term": 0.5, "retry_after": 0.0},
    }
    assert protocol.domain_error(4, errors.NotLeased("api"))["error"] == "not_leased"
    welcome = msgpack.unpackb(protocol.welcome("n1", 60.0, {"fetch": 0.5}))
    assert welcome["leases"] == {"fetch": 0.5}
    assert "leases" not in msgpack.unpackb(protocol.welcome("n1", 60.0, {}))
