"""TLS on the node's port, with certificates made at test time (trustme): our client over
`wss://`, the stock throttle-client over HTTPS, plain text and unknown authorities refused,
mutual TLS, a certificate renewed on SIGHUP, files that do not load, and three nodes whose links
run TLS with client certificates (a node of another authority left out)."""

from __future__ import annotations

import json
import signal
import ssl
import subprocess
import sys
import time

import anyio
import msgpack
import pytest
import requests
import throttle_client
import trustme

from sluicegate import client as sg
from sluicegate.client import websocket
from tests.conftest import NODE_CONFIG
from tests.nodes import NodeProcess, ca_file, cluster_of, node_files, refusal_to_start, tls_section

pytestmark = pytest.mark.process

TIMEOUT = 30
# How a client sees its TLS handshake refused (by the version of TLS, the moment it learns).
REFUSED = (OSError, anyio.BrokenResourceError, anyio.EndOfStream, websocket.HandshakeRefused)
CRAWLER, BATCH, OPS = (
    "crawler-secret-0123456789",
    "batch-secret-0123456789",
    "ops-secret-0123456789",
)
SECRET = {
    "SLUICEGATE_CLUSTER_SECRET": "cluster-test-secret",
    "CRAWLER_TOKEN": CRAWLER,
    "BATCH_TOKEN": BATCH,
    "OPS_TOKEN": OPS,
}
TOKENS = """
[auth.crawler]
secret_env = "CRAWLER_TOKEN"

[auth.batch]
secret_env = "BATCH_TOKEN"

[auth.ops]
secret_env = "OPS_TOKEN"
admin = true
"""


def trusting(*cas: trustme.CA) -> ssl.SSLContext:
    context = ssl.create_default_context()
    for ca in cas:
        ca.configure_trust(context)
    return context


def wss(node: NodeProcess) -> str:
    return f"wss://127.0.0.1:{node.port}"


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def tls_node(ca, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("tls-node")
    files = node_files(ca, workdir)
    with NodeProcess(NODE_CONFIG + tls_section(**files), workdir=workdir) as process:
        process.tls_files = files
        yield process


def test_the_node_listens_on_https(tls_node):
    assert tls_node.url == f"https://127.0.0.1:{tls_node.port}"


@pytest.mark.anyio
async def test_our_client_locks_over_wss(tls_node, ca):
    with anyio.fail_after(TIMEOUT):
        async with await sg.connect(wss(tls_node), ssl_context=trusting(ca)) as client:
            async with client.lock("A") as lease:
                assert lease.fencing_token is not None
                assert await client.remainder("A") == 0


def test_the_stock_throttle_client_locks_over_https(tls_node, ca, tmp_path, monkeypatch):
    # requests, under throttle-client, trusts what REQUESTS_CA_BUNDLE names.
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(ca_file(ca, tmp_path / "ca.pem")))
    with throttle_client.lock(tls_node.url, "A", timeout=None) as peer:
        assert peer.acquired == {"A": 1}
        assert throttle_client.Client(tls_node.url).remainder("A") == 0
    assert throttle_client.Client(tls_node.url).remainder("A") == 1


def test_plain_text_and_unknown_authorities_are_refused(tls_node, ca, tmp_path):
    started = time.monotonic()
    with pytest.raises(requests.ConnectionError):
        requests.get(f"http://127.0.0.1:{tls_node.port}/health", timeout=TIMEOUT)
    assert time.monotonic() - started < 5  # closed at once, not left to time out
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(f"{tls_node.url}/health", timeout=TIMEOUT)  # certifi's authorities
    # Refusals cost the node nothing but the connection.
    ca_path = ca_file(ca, tmp_path / "ca.pem")
    assert requests.get(f"{tls_node.url}/health", verify=ca_path, timeout=TIMEOUT).ok
    assert "Traceback" not in tls_node.log()


def test_the_admin_command_and_the_probe_speak_tls(tls_node, ca, tmp_path):
    ca_path = str(ca_file(ca, tmp_path / "ca.pem"))

    def admin(*args: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "sluicegate.node.admin", "--url", tls_node.url, *args]
        return subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT)

    shown = admin("--ca", ca_path, "--json", "status")
    assert shown.returncode == 0 and json.loads(shown.stdout)["ready"] is True
    refused = admin("status")  # the system's authorities
    assert refused.returncode == 2 and "CERTIFICATE_VERIFY_FAILED" in refused.stderr

    def probe(authority: str) -> int:
        env = {
            "PATH": "",
            "SLUICEGATE_PORT": str(tls_node.port),
            "SLUICEGATE_TLS_CERTIFICATE": str(tls_node.tls_files["certificate"]),
            "SLUICEGATE_TLS_KEY": str(tls_node.tls_files["key"]),
            "SLUICEGATE_TLS_CA": authority,
        }
        command = [sys.executable, "-m", "sluicegate.node.probe", "ready"]
        return subprocess.run(command, env=env, capture_output=True, timeout=TIMEOUT).returncode

    assert probe(ca_path) == 0
    assert probe(str(ca_file(trustme.CA(), tmp_path / "other.pem"))) == 1


@pytest.mark.anyio
async def test_mutual_tls_takes_only_clients_with_a_certificate_of_its_authority(ca, tmp_path):
    clients_ca, stranger_ca = trustme.CA(), trustme.CA()
    config = NODE_CONFIG + tls_section(
        **node_files(ca, tmp_path), client_ca=ca_file(clients_ca, tmp_path / "clients.pem")
    )
    with NodeProcess(config, workdir=tmp_path / "node") as node:
        with anyio.fail_after(TIMEOUT):
            for without in (None, stranger_ca):
                context = trusting(ca)
                if without is not None:
                    without.issue_cert("worker@example").configure_cert(context)
                with pytest.raises(REFUSED):
                    ws = await websocket.open_websocket(wss(node) + "/ws", ssl_context=context)
                    await ws.send_message(msgpack.packb({"hello": 1}))  # answered, if taken
                    await ws.get_message()
            context = trusting(ca)
            clients_ca.issue_cert("worker@example").configure_cert(context)
            async with await sg.connect(wss(node), ssl_context=context) as client:
                assert await client.remainder("A") == 1


@pytest.mark.anyio
async def test_sighup_renews_the_certificate_for_new_connections_and_keeps_open_ones(tmp_path):
    old_ca, new_ca = trustme.CA(), trustme.CA()
    files = node_files(old_ca, tmp_path)
    with NodeProcess(NODE_CONFIG + tls_section(**files), workdir=tmp_path / "node") as node:
        with anyio.fail_after(TIMEOUT):
            async with await sg.connect(wss(node), ssl_context=trusting(old_ca)) as before:
                async with before.lock("A"):
                    node_files(new_ca, tmp_path)  # the same paths, renewed by another authority
                    node.signal(signal.SIGHUP)
                    while "read the TLS certificate, key and CAs again" not in node.log():
                        await anyio.sleep(0.05)
                    async with await sg.connect(wss(node), ssl_context=trusting(new_ca)) as after:
                        assert await after.remainder("A") == 0
                    with pytest.raises(ssl.SSLCertVerificationError):
                        await websocket.open_websocket(
                            wss(node) + "/ws", ssl_context=trusting(old_ca)
                        )
                    assert await before.remainder("A") == 0  # over the connection it had
            files["key"].write_text("not a key")
            node.signal(signal.SIGHUP)
            while "kept the TLS files loaded before" not in node.log():
                await anyio.sleep(0.05)
            async with await sg.connect(wss(node), ssl_context=trusting(new_ca)) as still:
                assert await still.remainder("A") == 1


@pytest.mark.parametrize(
    "section, said",
    [
        ('[tls]\ncertificate = "{certificate}"\n', "certificate and key go together"),
        ('[tls]\ncertificate = "{certificate}"\nkey = "{missing}"\n', "cannot read"),
        ('[tls]\ncertificate = "{certificate}"\nkey = "{other_key}"\n', "KEY_VALUES_MISMATCH"),
        ('[tls]\nca = "{certificate}"\n', "ca needs a certificate"),
        ('[tls]\nminimum_version = "1.1"\n', "minimum_version must be one of 1.2, 1.3"),
    ],
)
def test_tls_files_that_do_not_load_stop_the_node_with_the_reason(ca, tmp_path, section, said):
    files = node_files(ca, tmp_path)
    other = node_files(ca, tmp_path, "other")
    text = section.format(
        certificate=files["certificate"], missing=tmp_path / "missing.pem", other_key=other["key"]
    )
    assert said in refusal_to_start(text, tmp_path)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # (the nodes' part is the point here)
async def test_links_run_tls_with_client_certificates_and_a_stranger_is_left_out(
    ca, tmp_path, anyio_backend
):
    """Every node asks every client for a certificate of the cluster's authority: the other
    nodes' links show theirs, and so do the clients here. Every node knows the same tokens,
    and a peer is its maker's on each of them."""
    cluster_ca = ca_file(ca, tmp_path / "cluster-ca.pem")
    configs = {
        node_id: NODE_CONFIG
        + tls_section(**node_files(ca, tmp_path / node_id), ca=cluster_ca, client_ca=cluster_ca)
        + TOKENS
        for node_id in ("n1", "n2", "n3")
    }
    mine = node_files(ca, tmp_path / "client", "client")
    context = trusting(ca)
    context.load_cert_chain(mine["certificate"], mine["key"])
    certificate = (str(mine["certificate"]), str(mine["key"]))

    def call(node: NodeProcess, method: str, path: str, token: str, **kwargs) -> requests.Response:
        kwargs.update(headers={"Authorization": f"Bearer {token}"}, cert=certificate)
        return requests.request(
            method, node.url + path, verify=cluster_ca, timeout=TIMEOUT, **kwargs
        )

    with cluster_of(tmp_path, "", SECRET, configs=configs, context=context) as (n1, n2, n3):
        status = call(n2, "GET", "/status.json?all=1", OPS)
        # n2 asked the others for theirs over TLS too (node/cluster_status.py).
        answered = [m["id"] for m in status.json()["member_status"] if "status" in m]
        assert sorted(answered) == ["n1", "n3"]
        with anyio.fail_after(TIMEOUT):
            async with (
                await sg.connect(wss(n1), ssl_context=context, token=CRAWLER) as one,
                await sg.connect(wss(n3), ssl_context=context, token=CRAWLER) as other,
            ):
                async with one.lock("A") as lease:  # seen through another node, over the links
                    assert await other.remainder("A") == 0
                    beat = {"json": {"expires_in": "1m"}}
                    for node in (n1, n2, n3):
                        path = f"/peers/{lease.peer_id}"
                        assert call(node, "PUT", path, OPS[::-1], **beat).status_code == 401
                        assert call(node, "PUT", path, BATCH, **beat).status_code == 403
                        assert call(node, "PUT", path, CRAWLER, **beat).text == "Ok"
        # A node whose certificate another authority signed: the others refuse its links.
        stranger = trustme.CA()
        config = NODE_CONFIG + tls_section(
            **node_files(stranger, tmp_path / "n4"), ca=cluster_ca, client_ca=cluster_ca
        )
        join = ["--node-id", "n4", "--join", f"127.0.0.1:{n1.port}"]
        with NodeProcess(config, workdir=tmp_path / "n4", args=join, env=SECRET) as n4:
            await anyio.sleep(3)
            members = call(n1, "GET", "/status.json", OPS)
            assert "n4" not in {m["id"] for m in members.json()["members"]}
            assert "Linked to" not in n4.log()
