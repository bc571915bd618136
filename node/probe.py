"""`python -m sluicegate.node.probe health|ready`: exit 0 if this machine's node answers 200 on
`/health` or `/ready`, else 1, for a container's HEALTHCHECK and for supervisors that run a
command rather than an HTTP request. The node is at 127.0.0.1 on `SLUICEGATE_PORT` (8000), or
at `--url`.

A node whose TLS the environment sets (`SLUICEGATE_TLS_CERTIFICATE`, as in its container) is
asked over `https://`, with the node's own certificate shown for mutual TLS, and its chain
verified against `SLUICEGATE_TLS_CA` (the system's authorities if none) but not its name: the
probe asks the node on this machine's loopback, which the certificate need not name. With
`SLUICEGATE_TOKEN` set, it names that token (for a node whose `[auth] open` leaves the two routes
out)."""

from __future__ import annotations

import argparse
import os
import ssl
import sys
import urllib.error
import urllib.request


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sluicegate.node.probe", allow_abbrev=False)
    parser.add_argument("what", choices=("health", "ready"))
    certificate = os.environ.get("SLUICEGATE_TLS_CERTIFICATE")
    scheme = "https" if certificate else "http"
    parser.add_argument(
        "--url",
        default=f"{scheme}://127.0.0.1:{os.environ.get('SLUICEGATE_PORT') or 8000}",
        help="the node (default: http://127.0.0.1:$SLUICEGATE_PORT, port 8000 if unset; "
        "https:// if SLUICEGATE_TLS_CERTIFICATE is set)",
    )
    parser.add_argument("--timeout", type=float, default=2.0, help="seconds (default: 2)")
    args = parser.parse_args(argv)
    url = f"{args.url.rstrip('/')}/{args.what}"
    try:
        context = None
        if certificate:
            context = ssl.create_default_context(cafile=os.environ.get("SLUICEGATE_TLS_CA"))
            context.check_hostname = False
            context.load_cert_chain(certificate, os.environ.get("SLUICEGATE_TLS_KEY"))
        request = urllib.request.Request(url)
        token = os.environ.get("SLUICEGATE_TOKEN")
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        with urllib.request.urlopen(request, timeout=args.timeout, context=context) as answer:
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
