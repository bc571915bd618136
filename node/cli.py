"""`sluicegate-node -c FILE --address A --port P`, Throttle's command line, and a flag and an
environment variable for every setting of the file (`node/settings.py`)."""

from __future__ import annotations

import argparse
import gc
import logging
import os
import sys
from collections.abc import Mapping
from functools import partial
from pathlib import Path

import trio

from .config import ConfigError, NodeConfig, load_config, parse_section, whole_number
from .credentials import from_config as credentials_from_config
from .gc_pauses import GC_PAUSES
from .logs import FORMATS, choose_level, clip, setup_logging
from .server import run_node
from .settings import add_flags, apply, given
from .state_file import StateFile
from .tls import from_config as tls_from_config

log = logging.getLogger("sluicegate.node")

# A shorter cluster secret could be guessed offline from one recorded handshake.
SHORTEST_SECRET = 16


def parse_args(argv: list[str] | None, environ: Mapping[str, str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="sluicegate-node",
        allow_abbrev=False,
        description="A sluicegate node: semaphores for distributed systems, Throttle's HTTP API.",
    )
    parser.add_argument(
        "-c",
        "--configuration",
        type=Path,
        default=environ.get("SLUICEGATE_CONFIGURATION") or None,
        help="TOML configuration file (default: throttle.toml in the working directory, "
        "if present); SLUICEGATE_CONFIGURATION",
    )
    parser.add_argument(
        "--address",
        default=environ.get("SLUICEGATE_ADDRESS") or "127.0.0.1",
        help="address to bind (default: 127.0.0.1); SLUICEGATE_ADDRESS",
    )
    parser.add_argument(
        "--port",
        default=environ.get("SLUICEGATE_PORT") or "8000",
        help="port to bind, 0 for any free one (default: 8000); SLUICEGATE_PORT",
    )
    parser.add_argument(
        "--log-level",
        metavar="LEVEL",
        help="ERROR, WARN, INFO, DEBUG or TRACE (default: [logging.stderr] level, else WARN); "
        "SLUICEGATE_LOG, then THROTTLE_LOG",
    )
    parser.add_argument(
        "--log-format",
        choices=FORMATS,
        default=environ.get("SLUICEGATE_LOG_FORMAT") or "text",
        help="text, or json: an object a line (default: text); SLUICEGATE_LOG_FORMAT",
    )
    add_flags(parser)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv, os.environ)
    try:
        port = _port(args.port)
        if args.log_format not in FORMATS:
            raise ConfigError(
                f"SLUICEGATE_LOG_FORMAT: text or json, not {clip(args.log_format, 40)!r}"
            )
        config, notice = load_config(args.configuration)
        chosen = given(args, os.environ)
        config = apply(config, chosen)
        if chosen:
            notice = None  # no file, but flags or variables: not an empty configuration
        check_cluster(config, args.address)
        if config.cluster.state_dir:
            StateFile(Path(config.cluster.state_dir)).check()
        tls = tls_from_config(config.tls)
        credentials = credentials_from_config(config.auth, os.environ)
        flag_level = (
            parse_section("logging", {"stderr": {"level": args.log_level}}, "--log-level")
            if args.log_level
            else None
        )
    except ConfigError as error:
        print(f"sluicegate-node: {error}", file=sys.stderr)
        return 2
    level, complaint = choose_level(config.log_level, flag_level)
    setup_logging(level, args.log_format)
    for message in (notice, complaint):
        if message:
            log.warning(message)
    bind_error = None
    # What is loaded by now lives as long as the process: keep it out of the garbage collector's
    # full collections, whose pauses grow with every object they look at.
    gc.freeze()
    # A full collection comes after 100 of the middle generation's, not 10: tens of thousands
    # of waiting acquires keep tables whose every entry a full collection walks (26 to 49 ms),
    # and a burst of them arriving set one off every second or two.
    gc.set_threshold(700, 10, 100)
    GC_PAUSES.watch()
    try:
        trio.run(partial(run_node, tls=tls, credentials=credentials), config, args.address, port)
    except* OSError as group:
        bind_error = group.exceptions[0]
    if bind_error is not None:
        log.error("Cannot serve on %s:%s: %s", args.address, port, bind_error)
        return 1
    return 0


def _port(text: str) -> int:
    port = whole_number(text, 65536)
    if port is None or port > 65535:
        raise ConfigError(f"--port or SLUICEGATE_PORT: not a port number: {clip(text, 40)!r}")
    return port


def check_cluster(config: NodeConfig, address: str) -> None:
    """A cluster needs a secret long enough, and an address the other nodes can dial."""
    cluster = config.cluster
    secret = cluster.secret
    if (cluster.join or cluster.node_id) and not secret:
        raise ConfigError(
            "a cluster needs a shared secret: set SLUICEGATE_CLUSTER_SECRET, --secret-file or "
            "[cluster] secret"
        )
    if secret and len(secret.encode()) < SHORTEST_SECRET:
        raise ConfigError(
            f"the cluster secret must be {SHORTEST_SECRET} bytes or longer, not "
            f"{len(secret.encode())}: python3 -c 'import secrets; print(secrets.token_hex(16))' "
            "makes one"
        )
    if secret and not cluster.advertise and address in ("0.0.0.0", "::", ""):
        raise ConfigError(
            f"other nodes cannot dial {address!r}: set --advertise HOST:PORT (or "
            '[cluster] advertise = "HOST:PORT") to the address they reach this node at'
        )
