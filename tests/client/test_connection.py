"""The client's connection to one node (`client/connection.py`), over an in-memory socket."""

from __future__ import annotations

import math

import msgpack
import pytest
import trio
from trio.testing import wait_all_tasks_blocked

from sluicegate.client.connection import Connection
from sluicegate.client.recovery import ConnectionLost


class MemorySocket:
    """What `Connection` needs of a WebSocket: frames sent are kept, frames to read are put."""

    def __init__(self) -> None:
        self.closed = None
        self.sent: list[list[dict]] = []
        self.put, self._frames = trio.open_memory_channel(math.inf)

    async def send_message(self, data: bytes) -> None:
        self.sent.append(msgpack.unpackb(data))

    async def get_message(self) -> bytes:
        return await self._frames.receive()

    async def aclose(self) -> None:
        self.closed = "closed"


async def test_a_retired_connection_waits_for_its_heartbeats_and_drops_every_other_call(
    nursery,
):
    """A slow node may answer a renewal just after the client left it: a beat on its way is
    not thrown away (seed 114764275), the other calls go to another node at once."""
    socket = MemorySocket()
    connection = Connection(socket, "n1", nursery, check_times=False)
    nursery.start_soon(connection._send_loop)
    results: dict[str, object] = {}

    async def call(name: str, request: dict) -> None:
        try:
            results[name] = await connection.call(request)
        except ConnectionLost:
            results[name] = "lost"

    acquire = {"id": 1, "op": "acquire", "peer": 5, "semaphore": "A", "count": 1}
    nursery.start_soon(call, "acquire", acquire)
    await wait_all_tasks_blocked()
    nursery.start_soon(call, "beat", {"id": 2, "op": "heartbeat", "peer": 5, "expires_in": 5.0})
    await wait_all_tasks_blocked()
    assert [request["id"] for frame in socket.sent for request in frame] == [1, 2]

    connection.retire()  # the acquire's caller was reading the socket
    await wait_all_tasks_blocked()
    assert results == {"acquire": "lost"}
    assert connection.closed and socket.closed is None
    with pytest.raises(ConnectionLost):
        await connection.call({"id": 3, "op": "release", "peer": 5, "semaphore": "A"})

    socket.put.send_nowait(
        msgpack.packb([{"id": 1, "ok": {"acquired": True}}, {"id": 2, "ok": None}])
    )
    await wait_all_tasks_blocked()
    assert results == {"acquire": "lost", "beat": None}
    assert socket.closed == "closed"  # its last beat answered


async def test_a_connection_retired_with_no_heartbeat_on_its_way_closes_at_once(nursery):
    socket = MemorySocket()
    connection = Connection(socket, "n1", nursery, check_times=False)
    nursery.start_soon(connection._send_loop)
    connection.retire()
    await wait_all_tasks_blocked()
    assert connection.closed and socket.closed == "closed"
