"""Fencing tokens over HTTP: `Sluicegate-Fencing-Token` on every grant, increasing per semaphore,
also across a restart of the node."""

from __future__ import annotations

import http.client
import json

import pytest

from tests.nodes import wait_healthy

pytestmark = pytest.mark.process


def request(node, method: str, path: str, body: object = None):
    conn = http.client.HTTPConnection("127.0.0.1", node.port, timeout=10)
    try:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        payload = json.dumps(body).encode() if body is not None else None
        conn.request(method, path, body=payload, headers=headers)
        response = conn.getresponse()
        return response.status, response.getheader("sluicegate-fencing-token"), response.read()
    finally:
        conn.close()


def new_peer(node) -> int:
    status, _, body = request(node, "POST", "/new_peer", {"expires_in": "1m"})
    assert status == 200
    return int(body)


def test_grants_carry_increasing_tokens_and_waits_carry_none(node):
    tokens = []
    for _ in range(3):
        peer = new_peer(node)
        status, token, body = request(node, "PUT", f"/peers/{peer}/A", 1)
        assert (status, body) == (200, str(peer).encode())  # Throttle's bytes, unchanged
        tokens.append(int(token))
        waiting = new_peer(node)
        status, token, _ = request(node, "PUT", f"/peers/{waiting}/A", 1)
        assert status == 202 and token is None
        request(node, "DELETE", f"/peers/{waiting}")
        request(node, "DELETE", f"/peers/{peer}")
    assert tokens == sorted(set(tokens))


def test_tokens_keep_increasing_after_the_node_restarts(node):
    peer = new_peer(node)
    _, before, _ = request(node, "PUT", f"/peers/{peer}/A", 1)
    node.kill()
    node.restart()
    wait_healthy(node.url)
    peer = new_peer(node)
    _, after, _ = request(node, "PUT", f"/peers/{peer}/A", 1)
    assert int(after) > int(before)
