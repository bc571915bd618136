"""Run HAProxy in front of node processes for tests: the real deploy/haproxy.cfg, loopback only.

deploy/haproxy.cfg is a template that ends in `backend sluicegate_nodes` without `server` lines; the
harness copies it into a temporary directory, appends one `server` line per backend URL, and starts
`haproxy -db -dR -f <copy>` with the frontend bound to a free loopback port via SLUICEGATE_LB_BIND.
Every wait is bounded.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

TEMPLATE = Path(__file__).resolve().parent.parent / "deploy" / "haproxy.cfg"
STARTUP_TIMEOUT = 10.0
STOP_TIMEOUT = 10.0
# Debian installs haproxy into /usr/sbin, which a non-root user's PATH often lacks.
_EXTRA_PATHS = ("/usr/sbin", "/usr/local/sbin")
_LOOPBACK = {"127.0.0.1", "localhost"}


class HaproxyNotInstalled(RuntimeError):
    pass


def haproxy_binary() -> str:
    """The haproxy executable, or HaproxyNotInstalled with what to do about it."""
    search = os.pathsep.join([os.environ.get("PATH", os.defpath), *_EXTRA_PATHS])
    found = shutil.which("haproxy", path=search)
    if found is None:
        raise HaproxyNotInstalled(
            "haproxy is not installed (not on PATH, nor in /usr/sbin). Run `make test`, which "
            "installs it from Debian packages (apt-get install haproxy), or install it yourself."
        )
    return found


def free_loopback_port() -> int:
    """A port that was free a moment ago (HAProxy refuses port 0, so it must be picked up front)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def server_address(url: str) -> str:
    """`http://127.0.0.1:8001` -> `127.0.0.1:8001`, loopback only."""
    parts = urlsplit(url)
    if parts.scheme != "http" or parts.hostname not in _LOOPBACK or parts.port is None:
        raise ValueError(f"expected http://127.0.0.1:<port>, got {url!r}")
    return f"{parts.hostname}:{parts.port}"


def render_config(backend_urls: list[str], template: Path = TEMPLATE) -> str:
    """The template with one `server nK host:port` line per backend, in order."""
    if not backend_urls:
        raise ValueError("HAProxy needs at least one backend")
    text = template.read_text(encoding="utf-8")
    if not text.endswith("\n"):
        text += "\n"
    lines = [
        f"    server n{index} {server_address(url)}\n"
        for index, url in enumerate(backend_urls, start=1)
    ]
    return text + "".join(lines)


class HaproxyProcess:
    """`haproxy -db -f cfg` in front of `backend_urls` (servers n1..nN); `.url` is the frontend."""

    def __init__(self, backend_urls: list[str], workdir: Path | None = None) -> None:
        self.backend_urls = list(backend_urls)
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="sluicegate-haproxy-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.config_path = self.workdir / "haproxy.cfg"
        self.config_path.write_text(render_config(self.backend_urls), encoding="utf-8")
        self.log_path = self.workdir / "haproxy.log"
        self.port: int | None = None
        self.url: str | None = None
        self.process: subprocess.Popen | None = None

    def start(self) -> HaproxyProcess:
        binary = haproxy_binary()
        # The port is picked, released, then bound by HAProxy: another process may take it in
        # between. HAProxy then exits at once with "cannot bind socket"; try once more.
        for attempt in range(2):
            self.port = free_loopback_port()
            self.url = f"http://127.0.0.1:{self.port}"
            if self._start_once(binary):
                return self
            if attempt == 0 and "cannot bind" not in self.log():
                break
        raise RuntimeError(f"haproxy did not start:\n{self.log()}")

    def _start_once(self, binary: str) -> bool:
        env = dict(os.environ, SLUICEGATE_LB_BIND=f"127.0.0.1:{self.port}")
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                # -dR: no SO_REUSEPORT, so a port another HAProxy already holds is a bind
                # failure (and a retry here) rather than two processes silently sharing it.
                [binary, "-db", "-dR", "-f", str(self.config_path)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                cwd=self.workdir,
                env=env,
            )
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False
            if self._healthy():
                return True
            time.sleep(0.02)
        self.kill()
        raise RuntimeError(
            f"haproxy did not answer GET /health with 200 within {STARTUP_TIMEOUT}s:\n{self.log()}"
        )

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=1) as response:
                return response.status == 200
        except OSError:  # urllib.error.HTTPError (503 before a server is up) is one too
            return False

    def log(self) -> str:
        if not self.log_path.exists():
            return ""
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def signal(self, signum: int) -> None:
        assert self.process is not None
        self.process.send_signal(signum)

    def kill(self) -> None:
        """SIGKILL."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(STOP_TIMEOUT)

    def stop(self) -> int:
        """Soft stop (SIGUSR1: stop listening, finish open requests) and wait; the exit code."""
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process else 0
        self.signal(signal.SIGUSR1)
        try:
            return self.process.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def __enter__(self) -> HaproxyProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        try:
            self.stop()
        finally:
            self.kill()
