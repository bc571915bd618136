"""The rules of tokens without a network (cluster/auth.py): which credentials name which token,
and what each operation needs of it."""

from __future__ import annotations

import base64
import typing

import pytest

from sluicegate.cluster import auth
from sluicegate.cluster.auth import Credentials, Token, refusal
from sluicegate.cluster.rate_limits import RateCheck, RateChecks, RateOperation, RateWait
from sluicegate.cluster.semaphore_ops import (
    Acquire,
    Heartbeat,
    IsAcquired,
    ListPeers,
    NewPeer,
    Operation,
    ReleaseLock,
    ReleasePeer,
    Remainder,
    Restore,
)

CRAWLER = Token("crawler", b"crawler-secret-0123", semaphores=("crawl-*",), rate_limits=("api",))
VIEWER = Token("viewer", b"viewer-secret-01234", read_only=True)
CREDENTIALS = Credentials([CRAWLER, VIEWER])


def basic(name: str, secret: bytes) -> bytes:
    return b"Basic " + base64.b64encode(name.encode() + b":" + secret)


def test_every_operation_has_a_rule():
    kinds = typing.get_args(Operation) + typing.get_args(RateOperation)
    assert set(kinds) == set(auth._WRITES)


@pytest.mark.parametrize(
    "header, token",
    [
        (b"Bearer crawler-secret-0123", CRAWLER),
        (b"bearer   viewer-secret-01234 ", VIEWER),
        (basic("crawler", b"crawler-secret-0123"), CRAWLER),
        (basic("viewer", b"crawler-secret-0123"), None),  # a name that is not the secret's
        (basic("crawler", b"wrong"), None),
        (b"Basic !!!not-base64", None),
        (b"Basic " + base64.b64encode(b"no colon"), None),
        (b"Bearer crawler-secret-012", None),  # a prefix of a secret
        (b"Digest crawler-secret-0123", None),
        (None, None),
    ],
)
def test_credentials_name_their_token(header, token):
    assert CREDENTIALS.from_header(header) is token


def test_a_secret_names_its_token_as_text_or_bytes():
    assert CREDENTIALS.from_secret("viewer-secret-01234") is VIEWER
    assert CREDENTIALS.from_secret(b"crawler-secret-0123") is CRAWLER
    assert CREDENTIALS.from_secret(None) is None and CREDENTIALS.from_secret("") is None


@pytest.mark.parametrize(
    "op, crawler, viewer",
    [
        (NewPeer(60.0), None, "read-only"),
        (Heartbeat(1, 60.0), None, "read-only"),
        (ReleasePeer(1), None, "read-only"),
        (Acquire(1, "crawl-eu", 1), None, "read-only"),
        (Acquire(1, "db", 1), "semaphore 'db'", "read-only"),
        (ReleaseLock(1, "db"), "semaphore 'db'", "read-only"),
        (IsAcquired(1), None, None),
        (Remainder("db"), "semaphore 'db'", None),
        (ListPeers(), None, None),
        (Restore(1, 60.0, {"crawl-eu": 1, "db": 1}), "semaphore 'db'", "read-only"),
        (RateCheck("api", "k", 1), None, "read-only"),
        (RateChecks("search", "k", 1, 3), "rate limiter 'search'", "read-only"),
        (RateWait("api", "k", 1, 1.0), None, "read-only"),
    ],
)
def test_each_operation_is_held_against_the_tokens_scopes(op, crawler, viewer):
    for token, expected in ((CRAWLER, crawler), (VIEWER, viewer)):
        why = refusal(token, op)
        assert (why is None) == (expected is None), (token.name, why)
        assert expected is None or expected in why


def test_a_secret_is_not_in_a_tokens_repr():
    assert "crawler-secret" not in repr(CRAWLER)
