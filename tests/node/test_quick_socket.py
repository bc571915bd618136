"""`QuickSocketStream` (node/quick_socket.py): a plain TCP stream that skips trio's scheduler
when its socket is ready, and still waits, closes, breaks and shares the loop as a stream
must."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from sluicegate.node.quick_socket import FAIR_EVERY, QuickSocketStream, quick


def pair() -> tuple[QuickSocketStream, QuickSocketStream]:
    a, b = trio.socket.socketpair()
    ends = trio.SocketStream(a), trio.SocketStream(b)
    left, right = (quick(end) for end in ends)
    assert isinstance(left, QuickSocketStream) and isinstance(right, QuickSocketStream)
    return left, right


async def test_what_is_sent_arrives_in_order_however_large():
    left, right = pair()
    payload = bytes(range(256)) * 40_000  # far more than a socket buffer holds
    received = bytearray()

    async def read_all() -> None:
        while len(received) < len(payload):
            received.extend(await right.receive_some())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read_all)
        await left.send_all(payload)
    assert bytes(received) == payload


async def test_a_read_waits_for_data_and_the_end_reads_empty():
    left, right = pair()
    async with trio.open_nursery() as nursery:
        got: list[bytes] = []

        async def read() -> None:
            got.append(await right.receive_some())

        nursery.start_soon(read)
        await trio.testing.wait_all_tasks_blocked()
        assert got == []
        await left.send_all(b"x")
    assert got == [b"x"]
    await left.aclose()
    assert await right.receive_some() == b""


async def test_a_send_to_a_closed_end_is_broken_and_a_closed_stream_is_closed():
    left, right = pair()
    await right.aclose()
    with pytest.raises(trio.BrokenResourceError):
        for _ in range(100):  # the first writes may still land in the buffer
            await left.send_all(b"y" * 65536)
    await left.aclose()
    with pytest.raises(trio.ClosedResourceError):
        await left.receive_some()


async def test_a_reader_that_never_waits_lets_the_others_run():
    left, right = pair()
    await left.send_all(b"z" * 100_000)
    others = 0

    async def other() -> None:
        nonlocal others
        while True:
            others += 1
            await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(other)
        start = others
        for _ in range(2 * FAIR_EVERY):
            await right.receive_some(1)
        assert others > start, "the reading task yielded to the other"
        nursery.cancel_scope.cancel()


async def test_a_cancelled_read_raises_at_once():
    left, right = pair()
    await left.send_all(b"w")
    with trio.CancelScope() as scope:
        scope.cancel()
        await right.receive_some()
    assert scope.cancelled_caught


async def test_a_stream_other_than_plain_tcp_is_left_as_it_is():
    stream, _ = trio.testing.memory_stream_pair()
    assert quick(stream) is stream
