"""A simulated network: byte streams between named places, in memory, under the virtual clock.

Nodes listen at addresses (`n1:8000`); node links and clients connect to them. Each connection is
a pair of `trio.testing` one-way memory streams, so nothing leaves the process. The faults the
simulations inject act here:

* a place cut off from another (`cut`, one way or both): new connections between them are
  refused, and the open ones are severed;
* a place that crashes: its listener is gone and every connection it had is severed (the other
  end sees the stream break, as after a reset).
"""

from __future__ import annotations

from collections.abc import Callable

import trio
import trio.testing

# Takes the server end of a new connection (and serves it in a task of its own).
Accept = Callable[[trio.abc.Stream], None]


class ConnectionRefused(OSError):
    """Nobody listens there, or the network between the two places is cut."""


class _Connection:
    __slots__ = ("source", "target", "ends")

    def __init__(self, source: str, target: str, ends: tuple[trio.abc.Stream, trio.abc.Stream]):
        self.source = source
        self.target = target
        self.ends = ends

    def sever(self) -> None:
        for end in self.ends:
            # The far side's reads see the end of the stream; writes on either side break.
            end.send_stream.close()
            end.receive_stream.close()


class SimNetwork:
    def __init__(self) -> None:
        self._listeners: dict[str, tuple[str, Accept]] = {}  # address -> (place, accept)
        self._connections: list[_Connection] = []
        # (from, to) pairs whose packets are lost: connections from the first to the second.
        self._cut: set[tuple[str, str]] = set()
        self.connections_made = 0

    def listen(self, place: str, address: str, accept: Accept) -> None:
        self._listeners[address] = (place, accept)

    def crash(self, place: str) -> None:
        """`place` is gone: its listeners, and every connection it had."""
        for address in [a for a, (p, _) in self._listeners.items() if p == place]:
            del self._listeners[address]
        self._sever(lambda c: place in (c.source, c.target))

    def cut(self, a: str, b: str, both_ways: bool = True) -> None:
        """Packets from `a` to `b` (and back, if `both_ways`) are lost from now on. A TCP
        connection needs both ways, so either way severs what is open between them."""
        self._cut.add((a, b))
        if both_ways:
            self._cut.add((b, a))
        self._sever(lambda c: {c.source, c.target} == {a, b})

    def heal(self) -> None:
        self._cut.clear()

    def is_cut(self, a: str, b: str) -> bool:
        return (a, b) in self._cut or (b, a) in self._cut

    async def connect(self, source: str, address: str) -> trio.abc.Stream:
        """A stream from `source` to whoever listens at `address`, or `ConnectionRefused`."""
        await trio.lowlevel.checkpoint()
        listener = self._listeners.get(address)
        if listener is None:
            raise ConnectionRefused(f"nobody listens at {address}")
        target, accept = listener
        if self.is_cut(source, target):
            raise ConnectionRefused(f"the network between {source} and {target} is cut")
        client_end, server_end = trio.testing.memory_stream_pair()
        self._connections.append(_Connection(source, target, (client_end, server_end)))
        self.connections_made += 1
        accept(server_end)
        return client_end

    def _sever(self, which: Callable[[_Connection], bool]) -> None:
        for connection in [c for c in self._connections if which(c)]:
            connection.sever()
            self._connections.remove(connection)
