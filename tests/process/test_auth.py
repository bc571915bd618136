"""Tokens (`[auth]`): a node that has them refuses requests without one (401), and holds each
request against its token's scopes (403), over HTTP, `/ws` and the stock throttle-client's
credentials in its URL; the routes that stay open; secrets that cannot be had stop the node."""

from __future__ import annotations

import os
import subprocess
import sys

import anyio
import msgpack
import pytest
import requests
import throttle_client

from sluicegate import client as sg
from sluicegate.client import websocket
from tests.conftest import NODE_CONFIG
from tests.nodes import NodeProcess, refusal_to_start

pytestmark = pytest.mark.process

TIMEOUT = 30
SECRETS = {
    "CRAWLER_TOKEN": "crawler-secret-0123456789",
    "VIEWER_TOKEN": "viewer-secret-0123456789",
    "OPS_TOKEN": "ops-secret-0123456789abc",
    "BATCH_TOKEN": "batch-secret-0123456789",
}
CONFIG = (
    NODE_CONFIG
    + """
[rate_limits]
api = { algorithm = "token_bucket", capacity = 100, rate = 10 }
other = { algorithm = "token_bucket", capacity = 100, rate = 10 }

[auth.crawler]
secret_env = "CRAWLER_TOKEN"
semaphores = ["C", "a/*"]
rate_limits = ["api"]

[auth.viewer]
secret_env = "VIEWER_TOKEN"
read_only = true

[auth.ops]
secret_env = "OPS_TOKEN"
admin = true

[auth.batch]
secret_env = "BATCH_TOKEN"
semaphores = ["C"]
"""
)


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    with NodeProcess(CONFIG, workdir=tmp_path_factory.mktemp("node"), env=SECRETS) as process:
        yield process


def bearer(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {SECRETS[name.upper() + '_TOKEN']}"}


def call(node, method: str, path: str, token: str | None = None, **kwargs) -> requests.Response:
    headers = bearer(token) if token else {}
    return requests.request(method, node.url + path, headers=headers, timeout=TIMEOUT, **kwargs)


def test_without_a_known_token_nothing_is_done(node):
    for headers in ({}, {"Authorization": "Bearer not-a-token-of-this-node"}):
        answer = requests.post(
            f"{node.url}/new_peer", json={"expires_in": "1m"}, headers=headers, timeout=TIMEOUT
        )
        assert answer.status_code == 401 and "Bearer" in answer.headers["www-authenticate"]
    basic_with_wrong_name = ("viewer", SECRETS["CRAWLER_TOKEN"])
    assert (
        requests.get(
            f"{node.url}/remainder?semaphore=C", auth=basic_with_wrong_name, timeout=TIMEOUT
        ).status_code
        == 401
    )
    listed = call(node, "GET", "/peers/", "ops")
    assert listed.status_code == 200 and listed.json() == []  # no peer was made


def test_health_metrics_and_the_cluster_routes_stay_open(node):
    for path in ("/health", "/ready", "/metrics", "/version"):
        assert call(node, "GET", path).status_code == 200, path


def test_auth_open_says_which_routes_need_no_token(tmp_path):
    config = CONFIG.replace("[auth.crawler]", '[auth]\nopen = ["/health"]\n\n[auth.crawler]')
    with NodeProcess(config, workdir=tmp_path, env=SECRETS) as closed:
        assert call(closed, "GET", "/health").status_code == 200
        for path in ("/ready", "/metrics", "/version"):
            assert call(closed, "GET", path).status_code == 401, path
            assert call(closed, "GET", path, "viewer").status_code == 200, path
        probe = [sys.executable, "-m", "sluicegate.node.probe", "ready", "--url", closed.url]
        env = {**os.environ, "SLUICEGATE_TOKEN": SECRETS["VIEWER_TOKEN"]}
        assert subprocess.run(probe, capture_output=True, timeout=TIMEOUT).returncode == 1
        assert subprocess.run(probe, capture_output=True, timeout=TIMEOUT, env=env).returncode == 0


def test_the_status_needs_an_admin_token(node):
    for path in ("/status.json", "/status"):
        assert call(node, "GET", path, "crawler").status_code == 403, path
        assert call(node, "GET", path, "ops").status_code == 200, path


def test_a_peer_is_its_makers_alone(node):
    mine = call(node, "POST", "/new_peer", "crawler", json={"expires_in": "1m"}).json()
    theirs = call(node, "POST", "/new_peer", "batch", json={"expires_in": "1m"}).json()
    assert call(node, "PUT", f"/peers/{theirs}/C", "batch", json=1).status_code == 200
    restore = {"peer_id": theirs, "expires_in": "1m", "acquired": {"C": 1}}
    for method, path, body in [
        ("PUT", f"/peers/{theirs}/C", 1),
        ("DELETE", f"/peers/{theirs}/C", None),
        ("PUT", f"/peers/{theirs}", {"expires_in": "0s"}),
        ("DELETE", f"/peers/{theirs}", None),
        ("GET", f"/peers/{theirs}/is_acquired", None),
        ("POST", "/restore", restore),
    ]:
        refused = call(node, method, path, "crawler", json=body)
        assert refused.status_code == 403, (method, path)
        assert f"the peer {theirs} is not one the token 'crawler' made" in refused.text
    assert call(node, "GET", "/remainder?semaphore=C", "batch").json() == 4  # nothing changed
    assert call(node, "GET", "/peers/", "crawler").json() == [{"id": mine}]
    assert call(node, "GET", "/peers/?limit=1", "batch").json() == [{"id": theirs}]
    every = {peer["id"] for peer in call(node, "GET", "/peers/", "ops").json()}
    assert every == {mine, theirs}
    assert call(node, "DELETE", f"/peers/{theirs}", "ops").json() == "Peer released"
    assert call(node, "DELETE", f"/peers/{mine}", "crawler").json() == "Peer released"


def test_the_admin_command_names_its_token(node, tmp_path):
    def status(*args: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "sluicegate.node.admin", "--url", node.url, *args]
        return subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT)

    assert status("--token", SECRETS["OPS_TOKEN"], "status").returncode == 0
    refused = status("--token", SECRETS["CRAWLER_TOKEN"], "status")
    assert refused.returncode == 2 and "403" in refused.stderr
    assert status("status").returncode == 2
    # Off the command line: from a file, whose first line is the secret.
    token_file = tmp_path / "ops-token"
    token_file.write_text(SECRETS["OPS_TOKEN"] + "\n")
    assert status("--token-file", str(token_file), "status").returncode == 0
    missing = status("--token-file", str(tmp_path / "missing"), "status")
    assert missing.returncode == 2 and f"cannot read the token file {tmp_path / 'missing'}" in (
        missing.stderr
    )


def test_a_token_uses_only_its_semaphores_and_rate_limiters(node):
    peer = call(node, "POST", "/new_peer", "crawler", json={"expires_in": "1m"}).json()
    refused = call(node, "PUT", f"/peers/{peer}/A", "crawler", json=1)
    assert refused.status_code == 403 and "may not use the semaphore 'A'" in refused.text
    assert call(node, "PUT", f"/peers/{peer}/C", "crawler", json=2).status_code == 200
    assert call(node, "GET", "/remainder?semaphore=C", "viewer").json() == 3
    restore = {"peer_id": peer, "expires_in": "1m", "acquired": {"C": 2, "A": 1}}
    assert call(node, "POST", "/restore", "crawler", json=restore).status_code == 403
    assert call(node, "DELETE", f"/peers/{peer}", "crawler").status_code == 200
    assert call(node, "POST", "/rate_limits/api/check?key=k", "crawler").status_code == 200
    other = call(node, "POST", "/rate_limits/other/check?key=k", "crawler")
    assert other.status_code == 403 and other.json()["error"] == "forbidden"


def test_a_read_only_token_reads_and_changes_nothing(node):
    assert call(node, "GET", "/remainder?semaphore=A", "viewer").json() == 1
    refused = call(node, "POST", "/new_peer", "viewer", json={"expires_in": "1m"})
    assert refused.status_code == 403 and "read-only" in refused.text


def test_the_stock_throttle_client_with_credentials_in_its_url(node):
    url = node.url.replace("http://", f"http://crawler:{SECRETS['CRAWLER_TOKEN']}@")
    with throttle_client.lock(url, "C", count=2, timeout=None) as peer:
        assert peer.acquired == {"C": 2}
        assert throttle_client.Client(url).remainder("C") == 3
    assert throttle_client.Client(url).remainder("C") == 5


@pytest.mark.anyio
async def test_our_client_says_its_token_in_the_hello(node):
    url = node.url.replace("http", "ws")
    with anyio.fail_after(TIMEOUT):
        async with await sg.connect(url, token=SECRETS["CRAWLER_TOKEN"]) as client:
            async with client.lock("C") as lease:
                assert lease.fencing_token is not None
            with pytest.raises(sg.Forbidden, match="may not use the semaphore 'A'"):
                async with client.lock("A"):
                    pass
            with pytest.raises(sg.Forbidden):
                await client.check("other", key="k")
            assert (await client.check("api", key="k")).go
        with_credentials = url.replace("ws://", f"ws://crawler:{SECRETS['CRAWLER_TOKEN']}@")
        async with await sg.connect(with_credentials) as client:
            assert (await client.check("api", key="k")).go
        with pytest.raises(ValueError, match="different tokens"):
            await sg.connect([with_credentials, url], token=SECRETS["BATCH_TOKEN"])
        for token in (None, "not-a-token-of-this-node"):
            with pytest.raises(sg.Unauthorized):  # at once: no retrying elsewhere
                async with await sg.connect(url, token=token):
                    pass


def test_the_blocking_lock_takes_credentials_in_its_url(node):
    url = node.url.replace("http://", f"ws://crawler:{SECRETS['CRAWLER_TOKEN']}@")
    with sg.lock(url, "C", count=2, timeout=TIMEOUT) as lease:
        assert lease.fencing_token is not None
        assert call(node, "GET", "/remainder?semaphore=C", "viewer").json() == 3


@pytest.mark.anyio
async def test_over_ws_too_a_peer_is_its_makers_alone(node):
    theirs = call(node, "POST", "/new_peer", "batch", json={"expires_in": "1m"}).json()
    url = node.url.replace("http", "ws") + "/ws"
    with anyio.fail_after(TIMEOUT):
        ws = await websocket.open_websocket(url)
        await ws.send_message(msgpack.packb({"hello": 1, "token": SECRETS["CRAWLER_TOKEN"]}))
        assert "welcome" in msgpack.unpackb(await ws.get_message())
        requests_ = [
            {"id": 1, "op": "heartbeat", "peer": theirs, "expires_in": 0},
            {"id": 2, "op": "release_peer", "peer": theirs},
            {"id": 3, "op": "acquire", "peer": theirs, "semaphore": "C"},
        ]
        await ws.send_message(msgpack.packb(requests_))
        answers = []
        while len(answers) < len(requests_):
            answers += msgpack.unpackb(await ws.get_message())
        await ws.aclose()
    assert {answer["error"] for answer in answers} == {"forbidden"}
    assert call(node, "GET", f"/peers/{theirs}/is_acquired", "batch").json() is True
    assert call(node, "DELETE", f"/peers/{theirs}", "batch").json() == "Peer released"


@pytest.mark.parametrize(
    "section, env, said",
    [
        ('[auth.x]\nsecret = "in-the-file-0123456789"\n', {}, "never holds it"),
        ('[auth.x]\nsecret_env = "X_TOKEN"\n', {}, "it is empty or unset"),
        ('[auth.x]\nsecret_env = "X_TOKEN"\n', {"X_TOKEN": "short"}, "16 bytes or longer"),
        ('[auth.x]\nsecret_file = "/nonexistent/x"\n', {}, "cannot read the file"),
        ('[auth.x]\nsecret_env = "X"\nscope = 1\n', {}, "auth.x.scope is not a token setting"),
        ('[auth]\nopen = ["/remainder"]\n', {}, "auth.open must be a list of routes among /,"),
        (
            '[auth.x]\nsecret_env = "X_TOKEN"\n[auth.y]\nsecret_env = "X_TOKEN"\n',
            {"X_TOKEN": "in-the-file-0123456789"},
            "[auth] x and y have the same secret",
        ),
    ],
)
def test_secrets_that_cannot_be_had_stop_the_node(tmp_path, section, env, said):
    said_instead = refusal_to_start(section, tmp_path, env)
    assert said in said_instead and "in-the-file-0123456789" not in said_instead
