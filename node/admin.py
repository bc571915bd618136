"""`sluicegate`: look at a running node or cluster over a node's HTTP port.

    sluicegate status [--url URL] [--json]        the node's members, its slots, ready or not
    sluicegate semaphores [--url URL] [--json]    holders and waiters of every semaphore
    sluicegate peers [--url URL] [--limit N]      the peers the cluster knows
    sluicegate drain NODE [--url URL]             a graceful leave of NODE, followed until done
    sluicegate forget NODE [--url URL]            NODE, dead for good, stops counting for the
                                                  quorum; followed until every member knows

`--url` defaults to `SLUICEGATE_URL`, else http://127.0.0.1:8000. An `https://` URL verifies the
nodes against `--ca` (`SLUICEGATE_CA`; the system's authorities if none), and shows the client
certificate `--certificate` and `--key` name (`SLUICEGATE_CERTIFICATE`, `SLUICEGATE_KEY`) to nodes
that ask for one; `--token` (`SLUICEGATE_TOKEN`), or the file `--token-file`
(`SLUICEGATE_TOKEN_FILE`), names an admin token to nodes with `[auth]` (README, "Security"). The
other members are asked the same way. Each member answers for the semaphores it owns (`GET
/status.json`), so `semaphores` asks every member that is up. `drain` and `forget` prove the
cluster secret (`SLUICEGATE_CLUSTER_SECRET`, or the file `--secret-file` or
`SLUICEGATE_CLUSTER_SECRET_FILE` names) without sending it (node/cluster_admin.py).
"""

from __future__ import annotations

import argparse
import json
import os
import ssl
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from .cluster_admin import authorization
from .config import whole_number

TIMEOUT = 5.0
# How often `drain` and `forget` look at how far they got.
POLL = 0.2


class Unreachable(Exception):
    pass


def fetch(url: str) -> Any:
    """The JSON a node answers at `url`."""
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT) as answer:
            return json.loads(answer.read())
    except urllib.error.HTTPError as error:
        body = error.read().decode(errors="replace")[:200]
        raise Unreachable(f"{url}: {error.code} {body}") from None
    except (OSError, ValueError) as error:
        raise Unreachable(f"{url}: {error}") from None


def scheme_of(url: str) -> str:
    """The other members are asked as the node given was: over TLS, or not."""
    return url.split("://", 1)[0]


def use_credentials(
    ca: str | None, certificate: str | None, key: str | None, token: str | None
) -> None:
    """Every request from here on verifies TLS against `ca`, shows `certificate` if asked, and
    names `token` (but `drain` and `forget`, which prove the cluster secret instead)."""
    context = ssl.create_default_context(cafile=ca)
    if certificate:
        context.load_cert_chain(certificate, key)
    opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=context))
    if token:
        # (A request's own Authorization header wins over these.)
        opener.addheaders = [*opener.addheaders, ("Authorization", f"Bearer {token}")]
    urllib.request.install_opener(opener)


def table(headers: list[str], rows: list[list[object]]) -> str:
    cells = [headers, *[["-" if v is None else str(v) for v in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    )


def status(url: str, as_json: bool) -> int:
    node = fetch(f"{url}/status.json")
    if as_json:
        print(json.dumps(node, indent=2))
        return 0
    if not node["cluster"]:
        print(f"single node at {url}, version {node['version']}, ready")
        return 0
    state = "ready" if node["ready"] else "not ready"
    print(
        f"node {node['node']} at {url}, version {node['version']}, {state}: acts for "
        f"{node['slots_acting']} of 256 slots, home of {node['peers_homed']} peers, "
        f"{node['waiting_for_quorum']} answers waiting for a quorum"
    )
    if node["semaphores_in_grace"]:
        print(f"in cold-start grace: {', '.join(node['semaphores_in_grace'])}")
    print()
    link = {None: "(this node)", True: "up", False: "down"}
    mine = node["members"][0]["definitions"]
    rows = [
        [
            m["id"],
            m["address"],
            m["generation"],
            m["state"],
            m["gossip_lag"],
            m["definitions"] if m["definitions"] == mine else f"{m['definitions']} (differ)",
            link[m["link"]],
        ]
        for m in node["members"]
    ]
    headers = ["MEMBER", "ADDRESS", "LIFE", "STATE", "GOSSIP LAG (s)", "DEFINITIONS", "LINK"]
    print(table(headers, rows))
    return 0


def semaphores(url: str, as_json: bool) -> int:
    node = fetch(f"{url}/status.json")
    answers = {node.get("node", url): node}
    unreachable = []
    for member in node["members"]:
        if member["state"] == "up" and member["id"] not in answers:
            try:
                answers[member["id"]] = fetch(f"{scheme_of(url)}://{member['address']}/status.json")
            except Unreachable as error:
                unreachable.append(str(error))
    found = sorted(
        ({**s, "owner": owner} for owner, answer in answers.items() for s in answer["semaphores"]),
        key=lambda s: s["name"],
    )
    if as_json:
        print(json.dumps({"semaphores": found, "unreachable": unreachable}, indent=2))
    else:
        rows = [
            [s["name"], s["max"], s["acquired"], s["pending"], s["longest_pending"], s["owner"]]
            for s in found
        ]
        print(table(["SEMAPHORE", "MAX", "HELD", "WAITING", "LONGEST WAIT (s)", "OWNER"], rows))
        for line in unreachable:
            print(f"not asked: {line}", file=sys.stderr)
    return 1 if unreachable else 0


def peers(url: str, limit: int | None, as_json: bool) -> int:
    listed = fetch(f"{url}/peers/" + ("" if limit is None else f"?limit={limit}"))
    ids = [peer["id"] for peer in listed]
    if as_json:
        print(json.dumps(ids))
    else:
        print(f"{len(ids)} peers" + ("" if limit is None else f" (at most {limit} listed)"))
        for peer_id in ids:
            print(peer_id)
    return 0


def drain(url: str, node_id: str, secret: bytes, timeout: float) -> int:
    """Ask `node_id` for a graceful leave, then print its progress until it has left."""
    node = fetch(f"{url}/status.json")
    members = {m["id"]: m for m in node["members"]}
    member = members.get(node_id)
    if member is None:
        print(f"sluicegate: {url} knows no member {node_id!r}", file=sys.stderr)
        return 1
    if member["state"] != "up":
        print(
            f"sluicegate: {node_id} is {member['state']}, not up: nothing to drain", file=sys.stderr
        )
        return 1
    stays = [m for m in node["members"] if m["id"] != node_id and m["state"] == "up"]
    if not stays:
        print(
            f"sluicegate: no other member of {node_id}'s is up to take its slots", file=sys.stderr
        )
        return 1
    address = f"{scheme_of(url)}://{member['address']}"
    request = urllib.request.Request(f"{address}/drain", data=b"", method="POST")
    request.add_header("Authorization", authorization(secret, "drain", node_id, int(time.time())))
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as answer:
            print(answer.read().decode(errors="replace"), flush=True)
    except urllib.error.HTTPError as error:
        print(f"sluicegate: {node_id} refused: {error.read().decode(errors='replace')[:300]}")
        return 1
    except OSError as error:
        raise Unreachable(f"{address}/drain: {error}") from None
    watcher = f"{scheme_of(url)}://{stays[0]['address']}"
    deadline = time.monotonic() + timeout
    said = None
    while time.monotonic() < deadline:
        try:
            acting = fetch(f"{address}/status.json")["slots_acting"]
        except Unreachable:
            acting = None
        try:
            seen = {m["id"]: m["state"] for m in fetch(f"{watcher}/status.json")["members"]}
            state = seen.get(node_id, "unknown")
        except Unreachable:
            state = f"unknown ({stays[0]['id']} does not answer)"
        line = f"{node_id}: {state} at {stays[0]['id']}, " + (
            "stopped" if acting is None else f"acting for {acting} slots"
        )
        if line != said:
            print(line, flush=True)
            said = line
        if state == "left" and acting is None:
            print(f"{node_id} has left, and its slots are with the others.")
            return 0
        time.sleep(POLL)
    print(f"sluicegate: {node_id} had not left after {timeout:g} s", file=sys.stderr)
    return 1


def forget(url: str, node_id: str, secret: bytes, timeout: float) -> int:
    """Ask the node at `url` to forget `node_id`, then wait until every member up has heard."""
    deadline = time.monotonic() + timeout
    query = urllib.parse.urlencode({"node": node_id})
    while True:
        request = urllib.request.Request(f"{url}/forget?{query}", data=b"", method="POST")
        proof = authorization(secret, "forget", node_id, int(time.time()))
        request.add_header("Authorization", proof)
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT) as answer:
                print(answer.read().decode(errors="replace"), flush=True)
                break
        except urllib.error.HTTPError as error:
            why = error.read().decode(errors="replace")[:300]
            # Another change of the members is still settling: the node says for how long.
            wait = whole_number(error.headers.get("retry-after") or "", 3600)
            if wait is None or time.monotonic() + wait > deadline:
                print(f"sluicegate: {why}", file=sys.stderr)
                return 1
            print(f"{why} Waiting {wait} s.", flush=True)
            time.sleep(wait)
        except OSError as error:
            raise Unreachable(f"{url}/forget: {error}") from None
    said = None
    while time.monotonic() < deadline:
        # The node's view and every other up member's own (`member_status`).
        node = fetch(f"{url}/status.json?all=1")
        views = {node["node"]: node["members"]}
        for other in node["member_status"]:
            views[other["id"]] = other["status"]["members"] if "status" in other else []
        unaware = [
            member
            for member, seen in views.items()
            if {m["id"]: m["state"] for m in seen}.get(node_id) != "forgotten"
        ]
        line = f"{len(views) - len(unaware)} of {len(views)} members up know {node_id} is forgotten"
        if line != said:
            print(line, flush=True)
            said = line
        if not unaware:
            print(f"{node_id} is forgotten: all {len(views)} members up know.")
            return 0
        time.sleep(POLL)
    print(
        f"sluicegate: after {timeout:g} s, {', '.join(unaware)} had not heard; forget nobody "
        "else until they have (sluicegate status at each)",
        file=sys.stderr,
    )
    return 1


def token_from(token: str | None, path: str | None) -> str | None:
    """The admin token: `--token` (or `SLUICEGATE_TOKEN`), else the first line of the file
    `--token-file` (or `SLUICEGATE_TOKEN_FILE`), which keeps it off the command line."""
    if token:
        return token
    path = path or os.environ.get("SLUICEGATE_TOKEN_FILE")
    if not path:
        return None
    try:
        return Path(path).read_text(encoding="utf-8").strip() or None
    except (OSError, UnicodeDecodeError) as error:
        raise TokenFileError(f"cannot read the token file {path}: {error}") from None


class TokenFileError(Exception):
    pass


def secret_from(path: str | None) -> bytes | None:
    path = path or os.environ.get("SLUICEGATE_CLUSTER_SECRET_FILE")
    if path:
        return Path(path).read_text(encoding="utf-8").strip().encode()
    secret = os.environ.get("SLUICEGATE_CLUSTER_SECRET")
    return secret.encode() if secret else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sluicegate", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--url",
        default=os.environ.get("SLUICEGATE_URL") or "http://127.0.0.1:8000",
        help="a node's HTTP address (default: SLUICEGATE_URL, else http://127.0.0.1:8000)",
    )
    parser.add_argument("--json", action="store_true", help="JSON instead of a table")
    for name, what in (
        ("ca", "the authority of the nodes' certificates (PEM)"),
        ("certificate", "a client certificate, for nodes that ask for one (PEM)"),
        ("key", "its private key (PEM)"),
        ("token", "the secret of an admin token, for a node with [auth]"),
    ):
        variable = f"SLUICEGATE_{name.upper()}"
        parser.add_argument(
            f"--{name}", default=os.environ.get(variable), help=f"{what}; {variable}"
        )
    parser.add_argument(
        "--token-file",
        help="a file whose first line is the token's secret, instead of --token; "
        "SLUICEGATE_TOKEN_FILE",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("status", help="the node's members, slots and readiness")
    commands.add_parser("semaphores", help="holders and waiters of every semaphore")
    listing = commands.add_parser("peers", help="the peers the cluster knows")
    listing.add_argument("--limit", type=int, help="list at most this many")
    leave = commands.add_parser("drain", help="a graceful leave of a member, followed until done")
    leave.add_argument("node", help="the member's id")
    leave.add_argument(
        "--secret-file",
        help="the cluster secret's file (default: SLUICEGATE_CLUSTER_SECRET_FILE, else the "
        "secret in SLUICEGATE_CLUSTER_SECRET)",
    )
    leave.add_argument("--timeout", type=float, default=30.0, help="seconds to follow it")
    forgetting = commands.add_parser(
        "forget", help="a member dead for good stops counting for the quorum"
    )
    forgetting.add_argument("node", help="the member's id")
    forgetting.add_argument("--secret-file", help="as for drain")
    forgetting.add_argument("--timeout", type=float, default=30.0, help="seconds to follow it")
    args = parser.parse_args(argv)
    url = args.url.rstrip("/")
    try:
        token = token_from(args.token, args.token_file)
    except TokenFileError as error:
        print(f"sluicegate: {error}", file=sys.stderr)
        return 2
    try:
        use_credentials(args.ca, args.certificate, args.key, token)
    except (OSError, ssl.SSLError) as error:
        print(f"sluicegate: cannot load the TLS files: {error}", file=sys.stderr)
        return 2
    try:
        if args.command in ("drain", "forget"):
            try:
                secret = secret_from(args.secret_file)
            except (OSError, UnicodeDecodeError) as error:
                print(f"sluicegate: cannot read the secret: {error}", file=sys.stderr)
                return 2
            if not secret:
                print(f"sluicegate: {args.command} needs the cluster secret", file=sys.stderr)
                return 2
            act = drain if args.command == "drain" else forget
            return act(url, args.node, secret, args.timeout)
        if args.command == "status":
            return status(url, args.json)
        if args.command == "semaphores":
            return semaphores(url, args.json)
        return peers(url, args.limit, args.json)
    except Unreachable as error:
        print(f"sluicegate: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
