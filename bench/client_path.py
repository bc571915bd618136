"""The client's own CPU per operation, without a network or a node.

    python bench/client_path.py [--operations 30000]

Our `Connection` over an in-memory WebSocket that answers every request at once (msgpack both
ways, as a node would), driven by 64 tasks on one client: microseconds per rate-limit `check`,
and per `lock` + unlock. In place (a real node, real sockets) each costs about twice this; the
figures compare versions of the client's hot path with each other, not with anything else.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import msgpack
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from sluicegate.client.client import Client  # noqa: E402
from sluicegate.client.connection import Connection  # noqa: E402

TASKS = 64
RESULTS = {
    "check": {"go": True, "remaining": 5, "retry_after": 0.0},
    "new_peer": 1,
    "acquire": {"acquired": True, "token": 1},
    "release": None,
    "release_peer": True,
}


class InstantNode:
    """A WebSocket whose other end answers every request frame with one answer frame."""

    closed = None

    def __init__(self) -> None:
        self._frames: list[bytes] = []
        self._ready = trio.Event()
        self._peers = 0

    async def send_message(self, data: bytes) -> None:
        answers = []
        for request in msgpack.unpackb(data):
            result = RESULTS[request["op"]]
            if request["op"] == "new_peer":
                self._peers += 1
                result = self._peers
            answers.append({"id": request["id"], "ok": result})
        self._frames.append(msgpack.packb(answers))
        self._ready.set()
        await trio.lowlevel.checkpoint()

    async def get_message(self) -> bytes:
        while not self._frames:
            self._ready = trio.Event()
            await self._ready.wait()
        return self._frames.pop(0)

    async def aclose(self) -> None:
        pass


async def per_operation(operations: int, operation: str) -> float:
    async with trio.open_nursery() as nursery:
        client = Client(["ws://in-memory/ws"], expires_in=30)
        connection = Connection(InstantNode(), "in-memory", nursery)
        nursery.start_soon(connection._send_loop)
        client._connection = connection
        done = 0

        async def task() -> None:
            nonlocal done
            while done < operations:
                if operation == "check":
                    await client.check("bench")
                    done += 1
                else:
                    async with client.lock("bench"):
                        pass
                    done += 2

        started = time.perf_counter()
        async with trio.open_nursery() as tasks:
            for _ in range(TASKS):
                tasks.start_soon(task)
        elapsed = time.perf_counter() - started
        nursery.cancel_scope.cancel()
    return elapsed / done * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--operations", type=int, default=30_000)
    args = parser.parse_args()
    check = trio.run(per_operation, args.operations, "check")
    lock = trio.run(per_operation, args.operations, "lock")
    print(f"Client CPU per operation, {TASKS} tasks, in-memory node")
    print(f"  check                      {check:6.2f} us")
    print(f"  lock or unlock (each)      {lock:6.2f} us")


if __name__ == "__main__":
    main()
