"""Availability under faults, measured from outside (`run --availability`, and `deep`).

A probe client at its own place on the simulated network keeps a WebSocket (`/ws`) to every
node and, every `TICK` virtual seconds, asks for the `remainder` of every configured semaphore,
in one frame. A semaphore is *served* at a tick if some node answered that tick's request for
it with a number within `ANSWER_LIMIT` (an error such as `unavailable`, a broken or refused
connection, or silence is not served). Any node will do, since every node answers every request
(forwarding it to the semaphore's owner): the measure is what a client that may try any node
could get, whatever the cluster does inside, and whatever a client's own failover adds.

To stay cheap, the probe asks one node while that node serves everything: a tick goes to the
node that answered all of the last tick in time, and to every node when there is none (then
the first node to answer all of a tick is asked next). So a tick is missed, where asking every
node would have found another that served, at most once each time the node asked stops serving
(0.1 s), and the probe costs about one frame each way per tick (measured: docs/simulations.md).

For each fault, from its start until the next fault starts (or the workload ends):

* `unserved`: the seconds (ticks) in which some semaphore was not served;
* `back after`: the seconds from the fault's start to the end of the last such tick, when
  every semaphore was served again for good (0 if none was ever missed).

`remainder` asks the owner and nothing else: it measures whether an owner can be reached and
answers, not whether it grants (a takeover's grace period grants nothing new, yet answers).
Reading is all the probe does, so the locks the workload takes are not disturbed; its frames
do share the nodes and links with everyone else's, so a run with the probe interleaves
differently from one without it (another history for the same seed), which is why it is
asked for, not always on. Nothing the probe sees goes into the history the checkers judge.
"""

from __future__ import annotations

import itertools
import math

import msgpack
import trio

from sluicegate.client.websocket import WebSocket

from .cluster import PORT
from .history import Event
from .network import SimNetwork

PLACE = "avail"
TICK = 0.1
# An answer that comes later than this after its request does not count: the node was not
# serving then (a paused node answers everything at once when it resumes).
ANSWER_LIMIT = 2.0
CONNECT_LIMIT = 1.0


class Probe:
    def __init__(self, network: SimNetwork, node_ids: list[str], semaphores: list[str]) -> None:
        self._network = network
        self._node_ids = node_ids
        self._semaphores = semaphores
        self._all = (1 << len(semaphores)) - 1
        self.started = math.nan
        self.stopped = math.nan
        # Per tick: a bit for every semaphore some node answered in time.
        self.served: list[int] = []
        # Request id -> (tick, the semaphore's bit, when sent, to which node), for requests on
        # live connections.
        self._asked: dict[int, tuple[int, int, float, str]] = {}
        self._ids = itertools.count()
        self._connections: dict[str, WebSocket] = {}
        self._connecting: set[str] = set()
        # The node asked alone, and the last tick each node answered all of in time.
        self._current: str | None = None
        self._whole_at: dict[str, int] = {}
        # Per tick: the semaphores (bits) each node answered in time.
        self._answered: dict[tuple[int, str], int] = {}
        self._ticking = True
        self._scope = trio.CancelScope()
        self._nursery: trio.Nursery | None = None

    async def run(self) -> None:
        """Ask every node, every tick, until `stop`; keep reading until cancelled."""
        with self._scope:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                self.started = trio.current_time()
                for tick in itertools.count():
                    if not self._ticking:
                        break
                    self.served.append(0)
                    current = self._current
                    if current is not None and self._whole_at.get(current) == tick - 1:
                        await self._ask(current, tick)
                    else:
                        self._current = None  # the first node to answer all is asked next
                        for node_id in self._node_ids:
                            await self._ask(node_id, tick)
                    await trio.sleep_until(self.started + (tick + 1) * TICK)
                await trio.sleep_forever()

    async def stop(self) -> None:
        """Stop asking; wait (at most `ANSWER_LIMIT`) for the answers still due, then close."""
        self._ticking = False
        self.stopped = trio.current_time()
        with trio.move_on_after(ANSWER_LIMIT):
            while self._asked:
                await trio.sleep(TICK)
        self._scope.cancel()

    def window(self, start: float, end: float) -> tuple[float, float]:
        """For the ticks in [start, end): seconds some semaphore was not served, and seconds
        from `start` until the end of the last such tick (0 if none)."""
        first = max(0, math.ceil((start - self.started) / TICK - 1e-9))
        last = min(len(self.served), math.ceil((end - self.started) / TICK - 1e-9))
        missed = [tick for tick in range(first, last) if self.served[tick] != self._all]
        if not missed:
            return 0.0, 0.0
        back = self.started + (missed[-1] + 1) * TICK - start
        return round(len(missed) * TICK, 6), round(back, 6)

    def by_fault(self, events: list[Event]) -> list[tuple[str, float, float]]:
        """(kind, unserved seconds, back after seconds) of every fault the probe watched."""
        faults = [e for e in events if e.kind == "fault" and e.at >= self.started]
        ends = [e.at for e in faults[1:]] + [self.stopped] if faults else []
        return [
            (fault.detail.split()[0], *self.window(fault.at, end))
            for fault, end in zip(faults, ends, strict=True)
        ]

    # -- internals ---------------------------------------------------------------------------

    async def _ask(self, node_id: str, tick: int) -> None:
        ws = self._connections.get(node_id)
        if ws is None:
            if node_id not in self._connecting:
                self._connecting.add(node_id)
                self._nursery.start_soon(self._connect, node_id)
            return
        requests = []
        now = trio.current_time()
        for bit, name in enumerate(self._semaphores):
            request_id = next(self._ids)
            self._asked[request_id] = (tick, 1 << bit, now, node_id)
            requests.append({"id": request_id, "op": "remainder", "semaphore": name})
        try:
            await ws.send_message(msgpack.packb(requests))
        except Exception:  # noqa: BLE001 (a broken connection: the reader says so too)
            for request in requests:
                self._asked.pop(request["id"], None)

    async def _connect(self, node_id: str) -> None:
        address = f"{node_id}:{PORT}"
        try:
            with trio.move_on_after(CONNECT_LIMIT):
                ws = await self._network.open_websocket(PLACE, address)
                await ws.send_message(msgpack.packb({"hello": 1}))
                await ws.get_message()  # the welcome
                self._connections[node_id] = ws
                self._nursery.start_soon(self._read, node_id, ws)
        except Exception:  # noqa: BLE001 (refused, or broken: tried again next tick)
            pass
        finally:
            self._connecting.discard(node_id)

    async def _read(self, node_id: str, ws: WebSocket) -> None:
        try:
            while True:
                answers = msgpack.unpackb(await ws.get_message(), strict_map_key=False)
                now = trio.current_time()
                for answer in answers if isinstance(answers, list) else ():
                    asked = self._asked.pop(answer.get("id"), None)
                    if asked is None:
                        continue
                    tick, bit, sent, _ = asked
                    if "ok" in answer and now - sent <= ANSWER_LIMIT:
                        self.served[tick] |= bit
                        answered = self._answered.pop((tick, node_id), 0) | bit
                        if answered != self._all:
                            self._answered[tick, node_id] = answered
                        elif tick >= self._whole_at.get(node_id, -1):
                            self._whole_at[node_id] = tick
                            if self._current is None:
                                self._current = node_id
        except Exception:  # noqa: BLE001 (the connection broke: connect again next tick)
            pass
        finally:
            if self._connections.get(node_id) is ws:
                del self._connections[node_id]
            # What was asked on this connection will not be answered.
            for request_id in [i for i, asked in self._asked.items() if asked[3] == node_id]:
                del self._asked[request_id]
            with trio.CancelScope(shield=True):
                await ws.aclose()
