"""A plain TCP connection read and written without a trip through trio's scheduler when its
socket is ready.

trio's `SocketStream` ends every send and every receive that did not have to wait with a
checkpoint: the task goes back to the scheduler, which polls epoll and runs it again. On a
node link or a `/ws` connection that is one more scheduler pass for each frame sent and for
each read: a quarter of a cluster lock's passes at each member, and a tenth of its CPU
(docs/benchmarks.md, "Quick sockets"). Here a send writes what the socket takes at once and
waits only for the rest, and a receive returns what is there, or waits until something is.
Every call still notices a cancellation at once, and a run of reads that never had to wait
yields to the other tasks every `FAIR_EVERY` reads, so a peer that floods a connection cannot
hold the loop.

POSIX only (`os.read` and `os.write` on a socket); elsewhere, and over TLS, the stream is
trio's own.
"""

from __future__ import annotations

import os

import trio

# Reads in a row that did not wait, after which the reading task lets the others run.
FAIR_EVERY = 16
# Bytes read from the socket at a time: frames of up to a MiB want big reads.
RECEIVE_BYTES = 65536


class QuickSocketStream(trio.abc.Stream):
    """`stream` (which closes it), read and written through `socket`, its plain TCP socket."""

    def __init__(self, stream: trio.abc.Stream, socket: trio.socket.SocketType) -> None:
        self._stream = stream
        self._socket = socket
        self._reads_without_wait = 0

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await trio.lowlevel.checkpoint_if_cancelled()
        with memoryview(data) as view:
            while view:
                try:
                    sent = os.write(self._fileno(), view)
                except BlockingIOError:
                    await trio.lowlevel.wait_writable(self._socket)
                    continue
                except OSError as error:
                    raise trio.BrokenResourceError(str(error)) from error
                view = view[sent:]

    def send_nowait(self, data: bytes | bytearray | memoryview) -> int:
        """Write what the socket takes of `data` without waiting; how many bytes that was."""
        try:
            return os.write(self._fileno(), data)
        except BlockingIOError:
            return 0
        except OSError as error:
            raise trio.BrokenResourceError(str(error)) from error

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        await trio.lowlevel.checkpoint_if_cancelled()
        self._reads_without_wait += 1
        if self._reads_without_wait >= FAIR_EVERY:
            self._reads_without_wait = 0
            await trio.lowlevel.cancel_shielded_checkpoint()
        while True:
            try:
                return os.read(self._fileno(), max_bytes or RECEIVE_BYTES)
            except BlockingIOError:
                self._reads_without_wait = 0
                await trio.lowlevel.wait_readable(self._socket)
            except OSError as error:
                raise trio.BrokenResourceError(str(error)) from error

    async def wait_send_all_might_not_block(self) -> None:
        await self._stream.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        await self._stream.aclose()

    def _fileno(self) -> int:
        fileno = self._socket.fileno()
        if fileno < 0:
            raise trio.ClosedResourceError("the socket was closed")
        return fileno


def quick(stream: trio.abc.Stream) -> trio.abc.Stream:
    """`stream` as a `QuickSocketStream` if it is plain TCP with nothing read ahead (a
    `trio.SocketStream`, or a listener's connection that says `plain_socket`), else itself."""
    if os.name != "posix":
        return stream
    socket: trio.socket.SocketType | None
    if isinstance(stream, trio.SocketStream):
        socket = stream.socket
    else:
        socket = getattr(stream, "plain_socket", None)
    return stream if socket is None else QuickSocketStream(stream, socket)
