"""`sluicegate-node -c FILE --address A --port P`, Throttle's command line."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import trio

from .config import ConfigError, load_config
from .logs import choose_level, setup_logging
from .server import run_node

log = logging.getLogger("sluicegate.node")


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
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        config, notice = load_config(args.configuration)
    except ConfigError as error:
        print(f"sluicegate-node: {error}", file=sys.stderr)
        return 2
    level, complaint = choose_level(config.log_level)
    setup_logging(level)
    for message in (notice, complaint):
        if message:
            log.warning(message)
    bind_error = None
    try:
        trio.run(run_node, config, args.address, args.port)
    except* OSError as group:
        bind_error = group.exceptions[0]
    if bind_error is not None:
        log.error("Cannot serve on %s:%s: %s", args.address, args.port, bind_error)
        return 1
    return 0
