"""`sluicegate`: look at a running node or cluster over a node's HTTP port.

    sluicegate status [--url URL] [--json]        the node's members, its slots, ready or not
    sluicegate semaphores [--url URL] [--json]    holders and waiters of every semaphore
    sluicegate peers [--url URL] [--limit N]      the peers the cluster knows

`--url` defaults to `SLUICEGATE_URL`, else http://127.0.0.1:8000. Each member answers for the
semaphores it owns (`GET /status.json`), so `semaphores` asks every member that is up.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request

TIMEOUT = 5.0


class Unreachable(Exception):
    pass


def fetch(url: str) -> object:
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT) as answer:
            return json.loads(answer.read())
    except urllib.error.HTTPError as error:
        body = error.read().decode(errors="replace")[:200]
        raise Unreachable(f"{url}: {error.code} {body}") from None
    except (OSError, ValueError) as error:
        raise Unreachable(f"{url}: {error}") from None


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
                answers[member["id"]] = fetch(f"http://{member['address']}/status.json")
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sluicegate", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--url",
        default=os.environ.get("SLUICEGATE_URL") or "http://127.0.0.1:8000",
        help="a node's HTTP address (default: SLUICEGATE_URL, else http://127.0.0.1:8000)",
    )
    parser.add_argument("--json", action="store_true", help="JSON instead of a table")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("status", help="the node's members, slots and readiness")
    commands.add_parser("semaphores", help="holders and waiters of every semaphore")
    listing = commands.add_parser("peers", help="the peers the cluster knows")
    listing.add_argument("--limit", type=int, help="list at most this many")
    args = parser.parse_args(argv)
    url = args.url.rstrip("/")
    try:
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
