"""The simulated network's freeze (simulations/network.py): a place stopped as under SIGSTOP,
in the middle of a write, its traffic held both ways and its readers and writers stopped."""

from __future__ import annotations

import random

import pytest
import trio

from simulations.network import SimNetwork

DATA = b"0123456789" * 3


@pytest.fixture
async def linked(nursery):
    """A network with place "a" connected to place "b": (network, a's stream, b's stream)."""
    network = SimNetwork()
    nursery.start_soon(network.run)
    accepted: list[trio.abc.Stream] = []
    network.listen("b", "b:1", accepted.append)
    stream = await network.connect("a", "b:1")
    return network, stream, accepted[0]


async def nothing_within(stream: trio.abc.Stream, seconds: float) -> bool:
    with trio.move_on_after(seconds):
        await stream.receive_some()
        return False
    return True


async def test_a_frame_written_as_the_freeze_starts_arrives_split(autojump_clock, linked, nursery):
    network, a, b = linked
    frozen: list[str] = []
    network.freeze_mid_write("a", random.Random(7), frozen.append)
    assert not network.is_frozen("a")
    wrote = trio.Event()

    async def write() -> None:
        await a.send_all(DATA)
        wrote.set()

    nursery.start_soon(write)
    await trio.sleep(1)
    head = await b.receive_some()
    assert 0 < len(head) < len(DATA) and DATA.startswith(head)
    assert network.is_frozen("a") and frozen == [f"mid-write: {len(head)} of 30 bytes to b went"]
    assert await nothing_within(b, 5)
    assert not wrote.is_set()  # the writer stopped mid-write, as under SIGSTOP
    network.thaw("a")
    rest = await b.receive_some()
    assert head + rest == DATA
    await wrote.wait()


async def test_a_frozen_place_reads_nothing_until_the_thaw(autojump_clock, linked):
    network, a, b = linked
    await b.send_all(b"before")  # in a's buffer before the freeze
    network.freeze("a")
    await b.send_all(b"during")  # held on the way
    assert await nothing_within(a, 5)
    network.thaw("a")
    received = b""
    while received != b"beforeduring":
        received += await a.receive_some()


async def test_without_a_write_to_split_the_freeze_starts_between_writes(autojump_clock, linked):
    network, a, b = linked
    frozen: list[str] = []
    network.freeze_mid_write("a", random.Random(1), frozen.append)
    network.freeze("a", frozen.append)
    assert frozen == ["between writes"]
    network.thaw("a")
    await a.send_all(DATA)  # thawed: the next write is whole, and on its way at once
    assert await b.receive_some() == DATA
