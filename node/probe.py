"""`python -m sluicegate.node.probe health|ready`: exit 0 if this machine's node answers 200 on
`/health` or `/ready`, else 1, for a container's HEALTHCHECK and for supervisors that run a
command rather than an HTTP request. The node is at 127.0.0.1 on `SLUICEGATE_PORT` (8000), or
at `--url`."""

from __future__ import annotations

import argparse
import os
import sys
import urllib.error
import urllib.request


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sluicegate.node.probe", allow_abbrev=False)
    parser.add_argument("what", choices=("health", "ready"))
    parser.add_argument(
        "--url",
        default=f"http://127.0.0.1:{os.environ.get('SLUICEGATE_PORT') or 8000}",
        help="the node (default: http://127.0.0.1:$SLUICEGATE_PORT, port 8000 if unset)",
    )
    parser.add_argument("--timeout", type=float, default=2.0, help="seconds (default: 2)")
    args = parser.parse_args(argv)
    url = f"{args.url.rstrip('/')}/{args.what}"
    try:
        with urllib.request.urlopen(url, timeout=args.timeout) as answer:
            status = answer.status
    except urllib.error.HTTPError as error:
        status = error.code
    except (OSError, ValueError) as error:
        print(f"{url}: {error}", file=sys.stderr)
        return 1
    if status != 200:
        print(f"{url}: {status}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
