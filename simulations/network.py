"""A simulated network: byte streams between named places, in memory, under the virtual clock.

Nodes listen at addresses (`n1:8000`); node links and clients connect to them. Each connection is
two one-way pipes of `trio.testing` memory streams, so nothing leaves the process. The faults the
simulations inject act here:

* a place cut off from another (`cut`, one way or both): new connections between them are
  refused, and the open ones are severed;
* a place that crashes: its listener is gone and every connection it had is severed (the other
  end sees the stream break, as after a reset);
* latency (`delay`): bytes from one place to another arrive that much later, in order;
* held traffic (`hold`, `pause`): bytes between two places, or to and from one place, wait until
  released, then arrive in order, as over a TCP connection that stalled; the connections stay up
  and new ones can be made (their handshakes wait too);
* a frozen place (`freeze`, as under SIGSTOP): its traffic is held both ways as in a pause, and
  its own tasks that write or read a stream wait until `thaw`; `freeze_mid_write` freezes it in
  the middle of its next write, whose first part is delivered and the rest held;
* repeated requests (`duplicating`): the ends that speak messages (clients' WebSockets, node
  links) look at this flag and send some of their messages twice (`cluster.py`, `run.py`);
  with `repeating_late` too, a node link sends half of those second copies later
  (`late_repeat`), after what it sent meanwhile.

Bytes that need no delay go straight through, as `trio.testing.memory_stream_pair` does; only
delayed or held ones go through `run`'s queue, so a run without such faults costs no more.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from collections.abc import Callable

import anyio
import trio
import trio.testing

from sluicegate.client.websocket import WebSocket, handshake

# Takes the server end of a new connection (and serves it in a task of its own).
Accept = Callable[[trio.abc.Stream], None]


class ConnectionRefused(OSError):
    """Nobody listens there, or the network between the two places is cut."""


class _Pipe:
    """One direction of a connection: what `source` writes, `target` reads."""

    __slots__ = ("network", "source", "target", "send", "receive", "queue")

    def __init__(self, network: SimNetwork, source: str, target: str) -> None:
        self.network = network
        self.source = source
        self.target = target
        self.send = trio.testing.MemorySendStream(self._sent, None, self._closed)
        self.receive = trio.testing.MemoryReceiveStream(self._receiving)
        # Bytes on their way, in order: [due, data] (b"" is the end of the stream).
        self.queue: deque[list] = deque()

    async def _sent(self) -> None:
        network = self.network
        network._carry(self)
        if network._frozen and self.source in network._frozen:
            # The writer is a task of a frozen place: it stops here, mid-write, until the thaw.
            await network._frozen[self.source].wait()

    async def _receiving(self) -> None:
        network = self.network
        if network._frozen and self.target in network._frozen:
            await network._frozen[self.target].wait()

    def _closed(self) -> None:
        try:
            self.network._carry(self)
        except trio.BrokenResourceError:
            pass  # the far end was closed first: nothing to tell it

    def deliver(self, data: bytes | bytearray) -> None:
        if data:
            self.receive.put_data(data)
        else:
            self.receive.put_eof()


class _Connection:
    __slots__ = ("source", "target", "pipes")

    def __init__(self, source: str, target: str, pipes: tuple[_Pipe, _Pipe]) -> None:
        self.source = source
        self.target = target
        self.pipes = pipes

    def sever(self) -> None:
        for pipe in self.pipes:
            # A reset: what was on its way is lost; the far side's reads see the end of the
            # stream, and writes on either side break.
            pipe.queue.clear()
            pipe.send.close()
            pipe.receive.close()


# A late second copy of a message comes this long after the first, at most.
LATE_REPEAT = 1.0


class SimNetwork:
    def __init__(self, seed: int = 0) -> None:
        self._listeners: dict[str, tuple[str, Accept]] = {}  # address -> (place, accept)
        self._connections: list[_Connection] = []
        # (from, to) pairs whose packets are lost: connections from the first to the second.
        self._cut: set[tuple[str, str]] = set()
        # (from, to) -> seconds bytes take; pairs whose bytes wait; places whose bytes wait.
        self._delay: dict[tuple[str, str], float] = {}
        self._held: set[tuple[str, str]] = set()
        self._paused: set[str] = set()
        # Frozen places, each with the event its thaw sets; places to freeze at their next
        # write: place -> (random source for where the write splits, what to call then).
        self._frozen: dict[str, trio.Event] = {}
        self._arming: dict[str, tuple[random.Random, Callable[[str], None]]] = {}
        # Pipes with bytes due: (due, sequence, pipe), the earliest first.
        self._due: list[tuple[float, int, _Pipe]] = []
        self._sequence = 0
        self._wake = trio.Event()
        self.connections_made = 0
        # While set, messages that may be repeated are sent twice; how many were.
        self.duplicating = False
        self.duplicated = 0
        # While set too, half the second copies come later; drawn from a source of its own, so
        # that runs without late copies keep their histories.
        self.repeating_late = False
        self.repeated_late = 0
        self._late = random.Random(f"late repeats {seed}")

    def late_repeat(self) -> float | None:
        """How long after a message its second copy goes, if later than at once."""
        if not self.repeating_late or self._late.random() < 0.5:
            return None
        self.repeated_late += 1
        return self._late.uniform(0.0, LATE_REPEAT)

    def listen(self, place: str, address: str, accept: Accept) -> None:
        self._listeners[address] = (place, accept)

    def crash(self, place: str) -> None:
        """`place` is gone: its listeners, and every connection it had."""
        for address in [a for a, (p, _) in self._listeners.items() if p == place]:
            del self._listeners[address]
        self._sever(lambda c: place in (c.source, c.target))

    def drain(self, place: str, keep: set[str]) -> None:
        """`place` takes no new connections, and drops those with anyone but `keep`."""
        for address in [a for a, (p, _) in self._listeners.items() if p == place]:
            del self._listeners[address]
        self._sever(lambda c: place in (c.source, c.target) and not {c.source, c.target} & keep)

    def cut(self, a: str, b: str, both_ways: bool = True) -> None:
        """Packets from `a` to `b` (and back, if `both_ways`) are lost from now on. A TCP
        connection needs both ways, so either way severs what is open between them."""
        self._cut.add((a, b))
        if both_ways:
            self._cut.add((b, a))
        self._sever(lambda c: {c.source, c.target} == {a, b})

    def heal(self) -> None:
        self._cut.clear()

    def uncut(self, a: str, b: str) -> None:
        """Packets between `a` and `b` flow again both ways (other cuts stay)."""
        self._cut -= {(a, b), (b, a)}

    def is_cut(self, a: str, b: str) -> bool:
        return (a, b) in self._cut or (b, a) in self._cut

    def delay(self, a: str, b: str, seconds: float) -> None:
        """Bytes between `a` and `b` (both ways) take `seconds` from now on (0: none)."""
        for pair in ((a, b), (b, a)):
            if seconds > 0:
                self._delay[pair] = seconds
            else:
                self._delay.pop(pair, None)

    def hold(self, a: str, b: str) -> None:
        """Bytes between `a` and `b` (both ways) wait until `release`."""
        self._held.update({(a, b), (b, a)})

    def release(self, a: str, b: str) -> None:
        self._held -= {(a, b), (b, a)}
        self._reschedule(lambda pipe: {pipe.source, pipe.target} == {a, b})

    def pause(self, place: str) -> None:
        """Every byte to and from `place` waits until `resume`: from outside, the place has
        stopped (its connections stay open, and connecting to it still works)."""
        self._paused.add(place)

    def resume(self, place: str) -> None:
        self._paused.discard(place)
        self._reschedule(lambda pipe: place in (pipe.source, pipe.target))

    def freeze(self, place: str, on_frozen: Callable[[str], None] = lambda detail: None) -> None:
        """`place` stops, as under SIGSTOP: every byte to and from it waits until `thaw`, and
        its tasks that write or read wait too. `on_frozen(detail)` is called at once."""
        self._arming.pop(place, None)
        if place not in self._frozen:
            self._frozen[place] = trio.Event()
            on_frozen("between writes")

    def freeze_mid_write(
        self, place: str, rng: random.Random, on_frozen: Callable[[str], None]
    ) -> None:
        """Freeze `place` in the middle of its next write (on any connection): the first part
        of those bytes (at least one) is delivered, the rest waits for the thaw with everything
        else, and the writer stops there. `on_frozen(detail)` is called at that moment, before
        any other task runs; `freeze` does it at once if no write comes first."""
        self._arming[place] = (rng, on_frozen)

    def thaw(self, place: str) -> None:
        self._arming.pop(place, None)
        thawed = self._frozen.pop(place, None)
        if thawed is not None:
            thawed.set()
            self._reschedule(lambda pipe: place in (pipe.source, pipe.target))

    def is_frozen(self, place: str) -> bool:
        return place in self._frozen

    async def connect(self, source: str, address: str) -> trio.abc.Stream:
        """A stream from `source` to whoever listens at `address`, or `ConnectionRefused`."""
        await trio.lowlevel.checkpoint()
        listener = self._listeners.get(address)
        if listener is None:
            raise ConnectionRefused(f"nobody listens at {address}")
        target, accept = listener
        if self.is_cut(source, target):
            raise ConnectionRefused(f"the network between {source} and {target} is cut")
        there, back = _Pipe(self, source, target), _Pipe(self, target, source)
        self._connections.append(_Connection(source, target, (there, back)))
        self.connections_made += 1
        accept(trio.StapledStream(back.send, there.receive))
        return trio.StapledStream(there.send, back.receive)

    async def open_websocket(self, source: str, address: str) -> WebSocket:
        """The client's WebSocket from `source` to the node at `address` (its `/ws`)."""
        return await handshake(_ClientStream(await self.connect(source, address)), address, "/ws")

    async def run(self) -> None:
        """Deliver delayed and held bytes when they are due (runs as long as the network)."""
        while True:
            now = trio.current_time()
            while self._due and self._due[0][0] <= now:
                _, _, pipe = heapq.heappop(self._due)
                self._deliver_due(pipe, now)
            self._wake = trio.Event()
            with trio.move_on_at(self._due[0][0] if self._due else math.inf):
                await self._wake.wait()

    # -- internals ---------------------------------------------------------------------------

    def _latency(self, pipe: _Pipe) -> float:
        """How long bytes sent on `pipe` now take: inf while they are held."""
        pair = (pipe.source, pipe.target)
        if pair in self._held or pipe.source in self._paused or pipe.target in self._paused:
            return math.inf
        if pipe.source in self._frozen or pipe.target in self._frozen:
            return math.inf
        return self._delay.get(pair, 0.0)

    def _carry(self, pipe: _Pipe) -> None:
        """Bytes were written (or the writer closed): on their way, now or later."""
        try:
            data = pipe.send.get_data_nowait()
        except trio.WouldBlock:
            return
        if not (self._delay or self._held or self._paused or self._frozen or pipe.queue):
            if not (self._arming and pipe.source in self._arming):
                try:
                    pipe.deliver(data)
                except trio.ClosedResourceError:
                    raise trio.BrokenResourceError("the far end is closed") from None
                return
        if self._arming and pipe.source in self._arming and data:
            # Frozen mid-write: the first part goes as it would have, the rest is held.
            rng, on_frozen = self._arming.pop(pipe.source)
            cut = rng.randint(1, len(data) - 1) if len(data) > 1 else len(data)
            if pipe.queue or self._latency(pipe):
                self._queue(pipe, data[:cut])
            else:
                pipe.deliver(data[:cut])
            self._frozen[pipe.source] = trio.Event()
            on_frozen(f"mid-write: {cut} of {len(data)} bytes to {pipe.target} went")
            if cut < len(data):
                self._queue(pipe, data[cut:])
            return
        self._queue(pipe, data)

    def _queue(self, pipe: _Pipe, data: bytes | bytearray) -> None:
        due = trio.current_time() + self._latency(pipe)
        if pipe.queue:
            due = max(due, pipe.queue[-1][0])  # in order, as over one TCP connection
        pipe.queue.append([due, data])
        if due < math.inf:
            self._schedule(due, pipe)

    def _schedule(self, due: float, pipe: _Pipe) -> None:
        self._sequence += 1
        heapq.heappush(self._due, (due, self._sequence, pipe))
        self._wake.set()

    def _deliver_due(self, pipe: _Pipe, now: float) -> None:
        while pipe.queue and pipe.queue[0][0] <= now:
            _, data = pipe.queue.popleft()
            try:
                pipe.deliver(data)
            except trio.ClosedResourceError:
                pipe.queue.clear()  # the reader is gone: the rest is lost with it
                return

    def _reschedule(self, which: Callable[[_Pipe], bool]) -> None:
        """Held bytes of the pipes `which` picks are due now, unless still held another way."""
        now = trio.current_time()
        for connection in self._connections:
            for pipe in connection.pipes:
                if not pipe.queue or not which(pipe) or self._latency(pipe) == math.inf:
                    continue
                for chunk in pipe.queue:
                    if chunk[0] == math.inf:
                        chunk[0] = now
                self._schedule(now, pipe)

    def _sever(self, which: Callable[[_Connection], bool]) -> None:
        for connection in [c for c in self._connections if which(c)]:
            connection.sever()
            self._connections.remove(connection)


class _ClientStream(anyio.abc.ByteStream):
    """A trio stream of the network as anyio's byte stream, the kind the client's WebSocket
    reads and writes (it runs under asyncio too)."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self._stream = stream

    async def receive(self, max_bytes: int = 65536) -> bytes:
        try:
            data = await self._stream.receive_some(max_bytes)
        except trio.BrokenResourceError as error:
            raise anyio.BrokenResourceError from error
        except trio.ClosedResourceError as error:
            raise anyio.ClosedResourceError from error
        if not data:
            raise anyio.EndOfStream
        return data

    async def send(self, item: bytes) -> None:
        try:
            await self._stream.send_all(item)
        except trio.BrokenResourceError as error:
            raise anyio.BrokenResourceError from error
        except trio.ClosedResourceError as error:
            raise anyio.ClosedResourceError from error

    async def send_eof(self) -> None:
        await self._stream.send_eof()

    async def aclose(self) -> None:
        await self._stream.aclose()
