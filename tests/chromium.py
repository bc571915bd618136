"""Headless Chromium for tests, driven over the Chrome DevTools Protocol with trio-websocket.

Debian's `chromium` (installed by `make test`) is started on a fresh profile with a DevTools port
the kernel picks (`--remote-debugging-port=0`); the port is read from `DevToolsActivePort` in the
profile, and the page's WebSocket from `/json`. Only what the tests need is here: navigate,
evaluate JavaScript, and take a screenshot. The flags keep Chromium off the network (it has
none here) and out of the way of other processes. Every wait is bounded, and `kill` ends the
browser's whole process group (it was started in a session of its own).
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import time
import urllib.request
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio
from trio_websocket import WebSocketConnection, open_websocket_url

BINARY = "/usr/bin/chromium"
STARTUP_TIMEOUT = 30.0
CALL_TIMEOUT = 30.0
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--mute-audio",
    "--hide-scrollbars",
    "--window-size=1200,900",
    "--remote-debugging-address=127.0.0.1",
    "--remote-debugging-port=0",
]


class DevToolsError(RuntimeError):
    pass


class ChromiumProcess:
    """One headless Chromium with its own profile under `workdir`."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = Path(workdir)
        self.profile = self.workdir / "profile"
        self.process: subprocess.Popen | None = None
        self.devtools_port: int | None = None
        self._log_path = self.workdir / "chromium.log"

    def start(self) -> ChromiumProcess:
        self.profile.mkdir(parents=True, exist_ok=True)
        active = self.profile / "DevToolsActivePort"
        active.unlink(missing_ok=True)  # an earlier browser's port, in a profile used again
        with open(self._log_path, "ab") as log:
            self.process = subprocess.Popen(
                [BINARY, *FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while time.monotonic() < deadline:
            lines = active.read_text().split() if active.exists() else []
            if lines:
                self.devtools_port = int(lines[0])
                return self
            if self.process.poll() is not None:
                raise RuntimeError(f"chromium exited with {self.process.returncode}:\n{self.log()}")
            time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"chromium opened no DevTools port in {STARTUP_TIMEOUT}s:\n{self.log()}")

    def page_websocket_url(self) -> str:
        """The DevTools WebSocket of the browser's first page (the `about:blank` it opened)."""
        url = f"http://127.0.0.1:{self.devtools_port}/json"
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while True:
            with urllib.request.urlopen(url, timeout=5) as answer:
                targets = json.loads(answer.read())
            pages = [t for t in targets if t.get("type") == "page"]
            if pages:
                return pages[0]["webSocketDebuggerUrl"]
            if time.monotonic() > deadline:
                raise RuntimeError(f"no page among Chromium's targets: {targets}")
            time.sleep(0.1)

    def log(self) -> str:
        return self._log_path.read_text(encoding="utf-8", errors="replace")

    def kill(self) -> None:
        """SIGKILL to the browser and every process it started (its own process group)."""
        if self.process is None or self.process.poll() is not None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait(10)

    def __enter__(self) -> ChromiumProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.kill()


class Page:
    """One page over its DevTools WebSocket: a call at a time, events kept for diagnostics."""

    def __init__(self, websocket: WebSocketConnection) -> None:
        self._websocket = websocket
        self._last_id = 0
        # Console messages, exceptions and policy violations, newest last (for failure messages).
        self.events: deque[str] = deque(maxlen=50)

    async def call(self, method: str, **params: object) -> dict:
        self._last_id += 1
        call_id = self._last_id
        message = {"id": call_id, "method": method, "params": params}
        with trio.fail_after(CALL_TIMEOUT):
            await self._websocket.send_message(json.dumps(message))
            while True:
                answer = json.loads(await self._websocket.get_message())
                if answer.get("id") == call_id:
                    if "error" in answer:
                        raise DevToolsError(f"{method}: {answer['error']}")
                    return answer["result"]
                self._keep_event(answer)

    def _keep_event(self, event: dict) -> None:
        method, params = event.get("method"), event.get("params", {})
        if method == "Log.entryAdded":
            entry = params["entry"]
            self.events.append(f"{entry['level']}: {entry['text']}")
        elif method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            self.events.append(f"exception: {details.get('exception', {}).get('description')}")
        elif method == "Runtime.consoleAPICalled":
            texts = [str(arg.get("value", arg.get("description"))) for arg in params["args"]]
            self.events.append(f"console.{params['type']}: {' '.join(texts)}")

    async def navigate(self, url: str) -> None:
        """Open `url` and wait until it has loaded (Page.navigate answers once it has started)."""
        answer = await self.call("Page.navigate", url=url)
        if answer.get("errorText"):
            raise DevToolsError(f"cannot open {url}: {answer['errorText']}")
        await self.wait_for(
            f"location.href === {json.dumps(url)} && document.readyState === 'complete'",
            CALL_TIMEOUT,
            f"{url} loaded",
        )

    async def evaluate(self, expression: str) -> object:
        """The value of a JavaScript expression in the page (JSON-able values only)."""
        answer = await self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in answer:
            raise DevToolsError(f"{expression!r} threw: {answer['exceptionDetails']}")
        return answer["result"].get("value")

    async def wait_for(self, expression: str, timeout: float, what: str) -> object:
        """Evaluate `expression` until it is truthy (its value); fails after `timeout` with
        what the page shows and said."""
        with trio.move_on_after(timeout):
            while True:
                value = await self.evaluate(expression)
                if value:
                    return value
                await trio.sleep(0.2)
        shown = await self.evaluate("document.body.innerText")
        said = "\n".join(self.events) or "(nothing)"
        raise AssertionError(
            f"not within {timeout}s: {what}\n--- the page shows:\n{shown}\n--- it said:\n{said}"
        )

    async def screenshot(self, path: Path) -> None:
        """A PNG of the whole page, however long."""
        metrics = await self.call("Page.getLayoutMetrics")
        size = metrics["cssContentSize"]
        clip = {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}
        shot = await self.call(
            "Page.captureScreenshot", format="png", captureBeyondViewport=True, clip=clip
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(shot["data"]))


@asynccontextmanager
async def open_page(chromium: ChromiumProcess) -> AsyncIterator[Page]:
    """The browser's first page, its console, exceptions and log kept in `page.events`."""
    async with open_websocket_url(
        chromium.page_websocket_url(),
        # Screenshots arrive as one base64 message of several megabytes.
        max_message_size=64 * 1024 * 1024,
        connect_timeout=CALL_TIMEOUT,
        disconnect_timeout=5,
    ) as websocket:
        page = Page(websocket)
        for domain in ("Page", "Runtime", "Log"):
            await page.call(f"{domain}.enable")
        yield page
