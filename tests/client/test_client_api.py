"""The async client against real node processes: locks, levels, timeouts, many tasks sharing one
client, restore after a node lost its memory, and failover to the next URL."""

from __future__ import annotations

import os
import signal
import threading
import time
from datetime import timedelta

import anyio
import pytest

from sluicegate import client as sg
from sluicegate.client.connection import Connection
from tests.conftest import NODE_CONFIG
from tests.nodes import NodeProcess

# Every async test runs under asyncio and under trio (conftest.py, `anyio_backend`).
pytestmark = [pytest.mark.process, pytest.mark.anyio]


TIMEOUT = 20


async def test_a_lock_holds_count_and_token_and_is_released_on_exit(node):
    with anyio.fail_after(TIMEOUT):
        async with await sg.connect(node.url) as client:
            async with client.lock("C", count=3) as lease:
                assert lease.fencing_token is not None and not lease.lost
                assert await client.remainder("C") == 2
            assert await client.remainder("C") == 5
            async with client.lock("C") as again:
                assert again.fencing_token > lease.fencing_token


async def test_nested_locks_follow_the_levels(node):
    with anyio.fail_after(TIMEOUT):
        async with await sg.connect(node.url) as client:
            async with client.lock("B"):  # level 1
                async with client.lock("A"):  # level 0: lower, fine
                    assert await client.remainder("A") == 0
            async with client.lock("A"):
                with pytest.raises(sg.Deadlock):
                    async with client.lock("B"):
                        pass
            with pytest.raises(sg.UnknownSemaphore):
                async with client.lock("nope"):
                    pass


async def test_tasks_of_one_client_have_their_own_hierarchies(node):
    with anyio.fail_after(TIMEOUT):
        async with await sg.connect(node.url) as client:
            holding_a = anyio.Event()
            done = anyio.Event()

            async def hold_a():
                async with client.lock("A"):
                    holding_a.set()
                    await done.wait()

            async with anyio.create_task_group() as nursery:
                nursery.start_soon(hold_a)
                await holding_a.wait()
                # Another task of the same client: B (level 1) after A is no deadlock here.
                async with client.lock("B", timeout=5) as lease:
                    assert lease.fencing_token is not None
                done.set()


async def test_a_lock_not_granted_in_time_times_out_and_leaves_no_waiter(node):
    with anyio.fail_after(TIMEOUT):
        async with await sg.connect(node.url) as holder, await sg.connect(node.url) as other:
            async with holder.lock("A"):
                started = anyio.current_time()
                with pytest.raises(sg.LockTimeout):
                    async with other.lock("A", timeout=0.5):
                        pass
                assert 0.4 < anyio.current_time() - started < 3
            # The timed-out waiter was withdrawn: the next one is granted at once.
            async with other.lock("A", timeout=2):
                pass


async def test_a_cancelled_wait_leaves_no_lock_behind(node):
    with anyio.fail_after(TIMEOUT):
        async with await sg.connect(node.url) as holder, await sg.connect(node.url) as other:
            async with holder.lock("A"):
                with anyio.move_on_after(0.3):
                    async with other.lock("B"):
                        async with other.lock("A"):  # waits, and is cancelled
                            pytest.fail("A is held")
            # The cancelled wait was withdrawn rather than granted to other's peer, which would
            # hold A, idle, for as long as the client lives.
            async with holder.lock("A", timeout=2):
                pass
            async with other.lock("A", timeout=2):
                assert await other.remainder("A") == 0


async def test_many_tasks_lock_through_one_client_and_never_exceed_max(node):
    inside = most = 0

    async def worker(client):
        nonlocal inside, most
        for _ in range(3):
            async with client.lock("C", timeout=15):
                inside += 1
                most = max(most, inside)
                await anyio.sleep(0.01)
                inside -= 1

    with anyio.fail_after(TIMEOUT):
        async with await sg.connect(node.url) as client:
            async with anyio.create_task_group() as nursery:
                for _ in range(12):
                    nursery.start_soon(worker, client)
            assert await client.remainder("C") == 5
    assert most == 5


async def test_concurrent_requests_of_one_client_share_frames(node):
    with anyio.fail_after(TIMEOUT):
        async with await sg.connect(node.url) as client:
            results = []

            async def ask():
                results.append(await client.remainder("C"))

            frames_before = client.connection.frames_sent
            async with anyio.create_task_group() as nursery:
                for _ in range(200):
                    nursery.start_soon(ask)
            assert results == [5] * 200
            assert client.connection.frames_sent - frames_before <= 20  # not one frame each


async def test_callers_take_turns_reading_even_when_the_reader_is_cancelled(node):
    """Whoever waits reads the socket for everyone; a reader cancelled mid-wait hands reading
    over, so the callers still waiting get their answers."""
    with anyio.fail_after(TIMEOUT):
        async with anyio.create_task_group() as tasks:
            connection = await Connection.open(tasks, node.url.replace("http", "ws") + "/ws")
            ids = iter(range(1, 1000))

            async def call(**request) -> object:
                return await connection.call({"id": next(ids), **request})

            holder, reader, sleeper = [await call(op="new_peer", expires_in=60) for _ in range(3)]
            await call(op="acquire", peer=holder, semaphore="B")  # level 1, then level 0
            await call(op="acquire", peer=holder, semaphore="A")
            waiting = anyio.CancelScope()
            answers = []

            async def wait_as_reader() -> None:
                with waiting:
                    await call(op="acquire", peer=reader, semaphore="A", wait=30)

            async def wait_as_sleeper() -> None:
                answers.append(await call(op="acquire", peer=sleeper, semaphore="B", wait=30))

            tasks.start_soon(wait_as_reader)
            await anyio.wait_all_tasks_blocked()
            tasks.start_soon(wait_as_sleeper)
            await anyio.wait_all_tasks_blocked()
            # The reader read this answer for the asking task, and is still reading.
            assert await call(op="remainder", semaphore="C") == 5
            waiting.cancel()
            await call(op="release", peer=holder, semaphore="B")
            while not answers:
                await anyio.sleep(0.01)
            assert answers[0]["acquired"] is True
            assert not connection.closed
            tasks.cancel_scope.cancel()


async def test_a_call_cancelled_before_it_is_sent_leaves_the_connection_whole(node):
    with anyio.fail_after(TIMEOUT):
        async with anyio.create_task_group() as tasks:
            connection = await Connection.open(tasks, node.url.replace("http", "ws") + "/ws")
            with anyio.CancelScope() as scope:
                scope.cancel()
                await connection.call({"id": 1, "op": "remainder", "semaphore": "C"})
            assert not connection.closed
            assert await connection.call({"id": 2, "op": "remainder", "semaphore": "C"}) == 5
            tasks.cancel_scope.cancel()


async def test_a_node_that_lost_its_memory_gets_the_locks_restored(node):
    with anyio.fail_after(TIMEOUT):
        async with await sg.connect(node.url, expires_in=1.5) as client:
            async with client.lock("C", count=2) as lease:
                node.kill()
                node.restart()
                # The heartbeat (every 0.5 s) meets `unknown_peer` and restores the peer.
                while True:
                    try:
                        if await client.remainder("C") == 3:
                            break
                    except sg.Unavailable:
                        pass
                    await anyio.sleep(0.1)
                assert not lease.lost
            assert await client.remainder("C") == 5


async def test_the_next_url_is_used_when_a_node_is_down(tmp_path, caplog):
    with NodeProcess(NODE_CONFIG, workdir=tmp_path / "up") as up:
        with NodeProcess(NODE_CONFIG, workdir=tmp_path / "down") as down:
            dead_url = down.url
        with anyio.fail_after(TIMEOUT):
            async with await sg.connect([dead_url, up.url]) as client:
                async with client.lock("A"):
                    assert client.node == f"127.0.0.1:{up.port}"
    [failed] = [r for r in caplog.records if r.name == "sluicegate.client"]
    assert (
        failed.levelname == "WARNING"
        and f"cannot connect to ws://127.0.0.1:{down.port}/ws" in failed.message
    )


async def test_a_lock_decorates_an_async_function(shared_node):
    with anyio.fail_after(TIMEOUT):
        async with await sg.connect(shared_node.url) as client:

            @client.lock("C", count=2)
            async def left_inside() -> int:
                return await client.remainder("C")

            async with anyio.create_task_group() as nursery:
                for _ in range(3):  # each call holds a lock of its own: 2 + 2 would be 1 left
                    nursery.start_soon(left_inside)
            assert await left_inside() == 3
            assert await client.remainder("C") == 5


def test_the_blocking_api_from_many_threads_never_exceeds_max(node):
    inside = most = 0
    guard = threading.Lock()
    errors = []

    def worker():
        nonlocal inside, most
        try:
            for _ in range(3):
                with sg.lock(node.url, "C", timeout=15) as lease:
                    assert lease.fencing_token is not None
                    with guard:
                        inside += 1
                        most = max(most, inside)
                    time.sleep(0.01)
                    with guard:
                        inside -= 1
        except Exception as error:  # reported below
            errors.append(error)

    threads = [threading.Thread(target=worker) for _ in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT)
    assert errors == [] and most == 5


def test_a_blocking_client_nests_and_times_out(node):
    with sg.BlockingClient(node.url) as client:
        with client.lock("B") as outer:
            with client.lock("A") as inner:  # the thread's own peer: levels 1 then 0
                assert inner.fencing_token and outer.fencing_token
                assert client.remainder("A") == 0
            with pytest.raises(sg.LockTimeout):
                with sg.BlockingClient(node.url) as other:
                    with other.lock("B", timeout=timedelta(milliseconds=300)):
                        pass
        assert client.remainder("B") == 1


def test_blocking_locks_decorate_functions(node):
    with sg.BlockingClient(node.url) as client:

        @sg.lock(node.url, "A", timeout=5)
        def in_a() -> int:
            return client.remainder("A")

        @client.lock("C", count=3)
        def in_c() -> int:
            return client.remainder("C")

        assert (in_a(), in_a(), in_c()) == (0, 0, 2)
        assert client.remainder("A") == 1


def test_two_asyncio_tasks_in_one_thread_take_a_peer_each(node):
    import asyncio

    with sg.BlockingClient(node.url) as client:

        async def hold(semaphore: str, mine: asyncio.Event, theirs: asyncio.Event) -> int:
            with client.lock(semaphore, timeout=5) as lease:
                mine.set()
                await theirs.wait()  # both held at once, in one thread
                return lease.peer_id

        async def main() -> list[int]:
            a, b = asyncio.Event(), asyncio.Event()
            # B (level 1) while A (level 0) is held: a false Deadlock if they shared a peer.
            return await asyncio.wait_for(asyncio.gather(hold("A", a, b), hold("B", b, a)), 10)

        peer_a, peer_b = asyncio.run(main())
        assert peer_a != peer_b


# Python 3.12 and later warn of exactly what this tests: fork in a process with threads.
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_forked_child_locks_with_a_client_of_its_own(node):
    with sg.lock(node.url, "A", timeout=5):  # the parent's client runs, and holds A
        pid = os.fork()
        if pid == 0:  # the child
            code = 1
            try:
                # Not nested in the parent's A (that would be a Deadlock: C is level 0 too).
                with sg.lock(node.url, "C", timeout=10) as lease:
                    with sg.BlockingClient(node.url) as other:
                        held = other.remainder("A"), other.remainder("C")
                    code = 0 if lease.fencing_token and held == (0, 4) else 2
            finally:
                os._exit(code)
        deadline = time.monotonic() + TIMEOUT
        while (done := os.waitpid(pid, os.WNOHANG))[0] == 0:
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                pytest.fail("the forked child hung")
            time.sleep(0.05)
        assert os.waitstatus_to_exitcode(done[1]) == 0


async def test_a_lease_that_cannot_be_kept_cancels_the_body_and_raises(node):
    with anyio.fail_after(TIMEOUT):
        async with await sg.connect(node.url, expires_in=1.5) as client:
            reached_the_end = False
            with pytest.raises(sg.LeaseLost):
                async with client.lock("A") as lease:
                    node.signal(signal.SIGSTOP)  # no heartbeat reaches it any more
                    try:
                        await anyio.sleep(10)
                        reached_the_end = True
                    finally:
                        node.signal(signal.SIGCONT)
            assert lease.lost and not reached_the_end


def test_the_blocking_api_raises_on_exit_when_the_lease_was_lost(node, caplog):
    with sg.BlockingClient(node.url, expires_in=timedelta(seconds=1.5)) as client:
        with pytest.raises(sg.LeaseLost):
            with client.lock("A") as lease:
                node.signal(signal.SIGSTOP)
                try:
                    time.sleep(3)
                finally:
                    node.signal(signal.SIGCONT)
        assert lease.lost
    assert [
        (r.levelname, r.name) for r in caplog.records if "lost the lease on 'A'" in r.message
    ] == [("ERROR", "sluicegate.client")]


def test_the_blocking_api_serves_asyncio_code_through_threads(node):
    import asyncio

    def locked_remainder() -> int:
        with sg.lock(node.url, "C", count=2):
            with sg.BlockingClient(node.url) as other:
                return other.remainder("C")

    async def main() -> list[int]:
        return await asyncio.gather(*(asyncio.to_thread(locked_remainder) for _ in range(2)))

    assert all(0 < left <= 3 for left in asyncio.run(main()))
