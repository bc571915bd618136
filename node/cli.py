"""`sluicegate-node -c FILE --address A --port P`, Throttle's command line."""

from __future__ import annotations

import argparse
import gc
import logging
import os
import sys
from dataclasses import replace
from pathlib import Path

import trio

from .config import ConfigError, NodeConfig, load_config
from .logs import choose_level, setup_logging
from .server import run_node

log = logging.getLogger("sluicegate.node")

# A shorter cluster secret could be guessed offline from one recorded handshake.
SHORTEST_SECRET = 16


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="sluicegate-node",
        description="A sluicegate node: semaphores for distributed systems, Throttle's HTTP API.",
    )
    parser.add_argument(
        "-c",
        "--configuration",
        type=Path,
        default=None,
        help="TOML configuration file (default: throttle.toml in the working directory, "
        "if present)",
    )
    parser.add_argument(
        "--address", default="127.0.0.1", help="address to bind (default: %(default)s)"
    )
    parser.add_argument(
        "--port",
        type=int,
        default=8000,
        help="port to bind, 0 for any free one (default: %(default)s)",
    )
    parser.add_argument(
        "--node-id",
        help="this node's id in the cluster (default: [cluster] node_id, else ADDRESS:PORT)",
    )
    parser.add_argument(
        "--join",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="address of another node to join through; repeat or separate with commas",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        config, notice = load_config(args.configuration)
        config = with_cluster_flags(config, args)
    except ConfigError as error:
        print(f"sluicegate-node: {error}", file=sys.stderr)
        return 2
    level, complaint = choose_level(config.log_level)
    setup_logging(level)
    for message in (notice, complaint):
        if message:
            log.warning(message)
    bind_error = None
    # What is loaded by now lives as long as the process: keep it out of the garbage collector's
    # full collections, whose pauses grow with every object they look at.
    gc.freeze()
    try:
        trio.run(run_node, config, args.address, args.port)
    except* OSError as group:
        bind_error = group.exceptions[0]
    if bind_error is not None:
        log.error("Cannot serve on %s:%s: %s", args.address, args.port, bind_error)
        return 1
    return 0


def with_cluster_flags(config: NodeConfig, args: argparse.Namespace) -> NodeConfig:
    """Command-line cluster settings win over the file's; a cluster needs a secret."""
    cluster = config.cluster
    join = [address.strip() for flag in args.join for address in flag.split(",") if address.strip()]
    if join:
        cluster = replace(cluster, join=tuple(join))
    if args.node_id:
        cluster = replace(cluster, node_id=args.node_id)
    secret = os.environ.get("SLUICEGATE_CLUSTER_SECRET") or cluster.secret
    cluster = replace(cluster, secret=secret)
    if (cluster.join or cluster.node_id) and not secret:
        raise ConfigError(
            "a cluster needs a shared secret: set [cluster] secret or SLUICEGATE_CLUSTER_SECRET"
        )
    if secret and len(secret.encode()) < SHORTEST_SECRET:
        raise ConfigError(
            f"the cluster secret must be {SHORTEST_SECRET} bytes or longer, not "
            f"{len(secret.encode())}: python3 -c 'import secrets; print(secrets.token_hex(16))' "
            "makes one"
        )
    if secret and not cluster.advertise and args.address in ("0.0.0.0", "::", ""):
        raise ConfigError(
            f'other nodes cannot dial {args.address!r}: set [cluster] advertise = "HOST:PORT" '
            "to the address they reach this node at"
        )
    return replace(config, cluster=cluster)
