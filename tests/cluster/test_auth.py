"""The rules of tokens without a network (cluster/auth.py): which credentials name which token,
and what each operation needs of it."""

from __future__ import annotations

import base64
import random
import typing

import pytest

from sluicegate.cluster import auth
from sluicegate.cluster.auth import Credentials, Token, admit
from sluicegate.cluster.errors import Forbidden
from sluicegate.cluster.peer_ids import made_with, stamped
from sluicegate.cluster.peers import PeerTable
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
OPS = Token("ops", b"ops-secret-0123456789", admin=True)
CREDENTIALS = Credentials([CRAWLER, VIEWER, OPS])
# A peer the crawler made.
P = stamped(CRAWLER.peer_key, 7)


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


def refusal(token: Token, op: object) -> str | None:
    try:
        admit(token, op)
    except Forbidden as forbidden:
        return str(forbidden)
    return None


@pytest.mark.parametrize(
    "op, crawler, viewer",
    [
        (NewPeer(60.0), None, "read-only"),
        (Heartbeat(P, 60.0), None, "read-only"),
        (ReleasePeer(P), None, "read-only"),
        (Acquire(P, "crawl-eu", 1), None, "read-only"),
        (Acquire(P, "db", 1), "semaphore 'db'", "read-only"),
        (ReleaseLock(P, "db"), "semaphore 'db'", "read-only"),
        (IsAcquired(P), None, "not one the token 'viewer' made"),
        (Remainder("db"), "semaphore 'db'", None),
        (ListPeers(), None, None),
        (Restore(P, 60.0, {"crawl-eu": 1, "db": 1}), "semaphore 'db'", "read-only"),
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


@pytest.mark.parametrize(
    "op",
    [
        Heartbeat(P, 60.0),
        ReleasePeer(P),
        Acquire(P, "crawl-eu", 1),
        ReleaseLock(P, "crawl-eu"),
        IsAcquired(P),
        Restore(P, 60.0, {"crawl-eu": 1}),
    ],
)
def test_only_the_maker_of_a_peer_or_an_admin_acts_on_it(op):
    other = Token("other", b"other-secret-012345")
    assert refusal(other, op) == f"the peer {P} is not one the token 'other' made"
    assert refusal(CRAWLER, op) is None and refusal(OPS, op) is None
    assert refusal(CRAWLER, Heartbeat(P ^ 1, 60.0)) is not None


def test_a_new_peer_gets_an_id_that_names_its_maker():
    made = admit(CRAWLER, NewPeer(60.0))
    assert made.key == CRAWLER.peer_key and "secret" not in repr(made)
    table = PeerTable({})
    rng = random.Random(5)
    ids = [table.new_peer(60.0, rng, key=made.key) for _ in range(2000)]
    assert len(set(ids)) == 2000 and all(CRAWLER.owns(peer_id) for peer_id in ids)
    assert not any(made_with(VIEWER.peer_key, peer_id) for peer_id in ids)
    anonymous = [table.new_peer(60.0, rng) for _ in range(2000)]
    assert not any(CRAWLER.owns(peer_id) for peer_id in anonymous)


def test_a_tokens_key_follows_its_secret_alone():
    again = Token("renamed", b"crawler-secret-0123", semaphores=("*",))
    assert again.peer_key == CRAWLER.peer_key and again.owns(P)
    assert Token("crawler", b"crawler-secret-0124").peer_key != CRAWLER.peer_key


def test_a_secret_is_not_in_a_tokens_repr():
    assert "crawler-secret" not in repr(CRAWLER)
