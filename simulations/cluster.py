"""Real nodes in one process: the node as a process builds it (`node/assembly.py`'s `Node`, its
`/ws` and `/cluster` routes on its own WebSocket, `node/websocket.py`), over the simulated
network, under the virtual clock.

What differs from a node process is only what the seams inject: links are dialled over
`SimNetwork`, randomness comes from the run's seed, a life's generation and the fencing epoch
count virtual time, and the node's clock is a `SimClock` of its own (simulations/clocks.py: one
that may run fast or slow, and that a freeze stops). There is no HTTP (clients speak `/ws`). A
crash drops the node's object and severs its connections; a restart is a new object with empty
memory, as a process would be. A graceful leave does what SIGTERM does (`node/server.py`):
stream the last changes, say goodbye, stop.

A node task that raises is not the end of the run: the node is down from then on, as a process
that died of it would be, and `on_failure` hears of it (a violation of its own).

While the network duplicates (`SimNetwork.duplicating`), a node sends the messages between
homes and owners, those of slot ownership and replication, and rate-limit gossip, twice:
docs/cluster.md says repeated messages change nothing. In overlap's bursts half the second
copies come later, up to a second (`SimNetwork.repeating_late`), after what the node sent
meanwhile: a link keeps one life's messages in order, so an old copy behind newer ones is the
reordering a node can see. (Not the frames: a link numbers its messages and drops what it had,
so a repeated frame would test nothing; a node that said something twice is what the cores
must bear.)
"""

from __future__ import annotations

import logging
import random
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import replace
from pathlib import Path

import trio
from trio_websocket import ConnectionClosed

from sluicegate.cluster import lock_messages, ownership
from sluicegate.cluster.membership import Gossip
from sluicegate.cluster.rate_limits import RateEvents
from sluicegate.cluster.replication import Accept, Accepted
from sluicegate.node.app import NodeApp
from sluicegate.node.assembly import Node, Seams
from sluicegate.node.config import NodeConfig
from sluicegate.node.link_codec import LINK_CODEC
from sluicegate.node.links import HANDSHAKE_TIMEOUT
from sluicegate.node.listener import CLOSE_TIMEOUT
from sluicegate.node.rate_limit_service import RateLimitService
from sluicegate.node.websocket import accept_handshake, handshake
from sluicegate.node.wire import MAX_FRAME

from .clocks import SimClock, TimeOfDay
from .network import SimNetwork
from .rate_taps import RateLog
from .servers import ServerLog

log = logging.getLogger("sluicegate.simulated_link")
# The node whose task runs now (tasks inherit it from the node's `run`): for logs that say which
# node speaks (`python -m simulations run --seed N --logs`).
NODE: ContextVar[str] = ContextVar("simulated_node", default="-")
SECRET = "simulated-cluster"
# Latency of a stopping node's links (see `SimNode.leave`).
STOPPING_LATENCY = 0.001
PORT = 8000
# What a duplicating network delivers twice on node links: messages whose receivers promise that
# a repeat changes nothing.
REPEATABLE = (
    lock_messages.LockRequest,
    lock_messages.LockRestore,
    lock_messages.LockRelease,
    lock_messages.LockAnswer,
    lock_messages.LockRefused,
    lock_messages.LockReleased,
    lock_messages.LockTaken,
    lock_messages.Audit,
    ownership.Prepare,
    ownership.Promise,
    ownership.Refuse,
    ownership.Renew,
    ownership.Renewed,
    ownership.Resign,
    Accept,
    Accepted,
    RateEvents,
)


def virtual_epoch() -> int:
    """Fencing epochs in virtual milliseconds: they grow from one owner to the next, as the
    wall clock's do."""
    return int(trio.current_time() * 1000)


class SimNode:
    """One life of a node: from `start` until `crash` (or `stop`)."""

    def __init__(
        self,
        node_id: str,
        config: NodeConfig,
        network: SimNetwork,
        rng: random.Random,
        generation: int,
        join: tuple[str, ...],
        on_failure: Callable[[str, str], None],
        clock: SimClock | None = None,
        servers: ServerLog | None = None,
        deciders: RateLog | None = None,
        time_of_day: TimeOfDay | None = None,
        state_dir: Path | None = None,
    ) -> None:
        """`servers`, `deciders`: where to record what this life does with its slots and its
        exact rate limits (for the checkers);
        `time_of_day`: the machine's, if the node reads one of its own (else trio time, and
        `generation` and virtual milliseconds order lives and eras); `state_dir`: where the
        node keeps its era and generation across lives (`[cluster] state_dir`)."""
        self.node_id = node_id
        self.clock = clock or SimClock()
        self.address = f"{node_id}:{PORT}"
        self.time_of_day = time_of_day
        self.config = replace(
            config,
            cluster=replace(
                config.cluster,
                node_id=node_id,
                join=join,
                secret=SECRET,
                state_dir=str(state_dir) if state_dir is not None else None,
            ),
        )
        self._network = network
        self._rng = rng
        self.generation = generation
        self._scope: trio.CancelScope | None = None
        self.app: NodeApp | None = None
        self.membership = None
        self.semaphores = None
        self.rate_limits: RateLimitService | None = None
        self.crashed = False
        self.began = trio.current_time()
        self.left = False
        self._on_failure = on_failure
        self._node: Node | None = None
        self._servers = servers
        self._deciders = deciders

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run until crashed or stopped; `task_status.started()` once it listens and has joined."""
        NODE.set(self.node_id)
        try:
            with trio.CancelScope() as self._scope:
                await self._run(task_status)
        except Exception as error:  # noqa: BLE001 (a node task that raised: the run goes on)
            self.crashed = True
            self._network.crash(self.node_id)
            self._on_failure(self.node_id, describe(error))

    async def _run(self, task_status: trio.TaskStatus[None]) -> None:
        network = self._network

        def repeat(remote_id: str, message: object, life: int | None) -> bool:
            if not network.duplicating or not isinstance(message, REPEATABLE):
                return False
            network.duplicated += 1
            later = network.late_repeat()
            if later is None:
                return True
            if life is not None:  # a copy for the life the first went to, or for none
                nursery.start_soon(self._send_late, later, remote_id, message, life)
            return False

        seams = Seams(
            dialer=self._dial,
            rng=self._rng,
            generation=self.generation,
            epoch=virtual_epoch,
            clock=self.clock,
            wall=trio.current_time,
            repeat=repeat,
        )
        if self.time_of_day is not None:  # as a process reads it: `time.time`
            wall = self.time_of_day.now
            seams = replace(
                seams,
                generation=int(wall() * 1e9),
                epoch=lambda: int(wall() * 1000),
                wall=wall,
            )
        self._node = node = Node(self.config, self.address, seams)
        assert node.generation is not None  # a simulated node is always in a cluster
        self.generation = node.generation
        if self._servers is not None and self.ownership is not None:
            self._servers.tap(self.node_id, self.generation, self.ownership)
        if self._deciders is not None:
            self._deciders.tap(self.node_id, self.generation, node.rate_limits.core)
        self.app, self.rate_limits = node.app, node.rate_limits
        async with trio.open_nursery() as nursery:
            network.listen(
                self.node_id,
                self.address,
                lambda stream: nursery.start_soon(self._serve_connection, stream),
            )
            await nursery.start(node.run)
            self.membership, self.semaphores = node.membership, node.semaphores
            task_status.started()

    async def _send_late(self, later: float, remote_id: str, message: object, life: int) -> None:
        """The second copy of `message`, `later` seconds after the first, for the same life of
        `remote_id` (the link drops it if it carries to another by then)."""
        await self.clock.sleep(later)
        cluster = self._node._cluster if self._node is not None else None
        if cluster is not None and not self.crashed:
            cluster.links.link(remote_id).send(message, life)

    @property
    def ownership(self):
        """This life's slot ownership (cluster/ownership.py), once the node is built."""
        node = self._node
        return node._cluster.ownership if node is not None and node._cluster is not None else None

    async def leave(self) -> None:
        """Stop as SIGTERM stops a node: the last changes streamed, a goodbye, then gone.

        A node that stops blocking answers a waiting acquire "not yet" at once, and the client
        asks again at once (`Client._acquire`), round after round, through whichever node it
        talks to, until the node is gone: for a fraction of a second in a real cluster, but
        without end under a virtual clock that moves only when every task waits. So its clients
        are let go first, as a load balancer drains a node before stopping it, and the other
        nodes' requests take a millisecond to reach it while it stops."""
        if self.crashed or self._node is None or self.semaphores is None:
            return
        nodes = {address.split(":")[0] for address in self.config.cluster.join}
        self._network.drain(self.node_id, keep=nodes)
        for node_id in nodes:
            self._network.delay(self.node_id, node_id, STOPPING_LATENCY)
        try:
            await self._node.leave()
        finally:
            for node_id in nodes:
                self._network.delay(self.node_id, node_id, 0)
        self.left = True
        self.crash()

    def crash(self) -> None:
        """Gone at once, memory and all: no goodbye, no hand-over."""
        self.crashed = True
        self._network.crash(self.node_id)
        if self._scope is not None:
            self._scope.cancel()

    async def _dial(self, nursery: trio.Nursery, address: str):
        with self.clock.fail_after(HANDSHAKE_TIMEOUT):
            stream = await self._network.connect(self.node_id, address)
            connection = await handshake(stream, address, "/cluster", MAX_FRAME)
            return _Link(connection, self._network)

    async def _serve_connection(self, stream: trio.abc.Stream) -> None:
        """What the node's port does with a connection: the node's own WebSocket handshake
        (node/websocket.py, as node/listener.py takes it), then its route."""
        NODE.set(self.node_id)  # (the task was started from the dialling side's)

        def route_of(target: str):
            path = target.partition("?")[0]
            route = self.app.websocket_route(path) if self.app and not self.crashed else None
            return None if route is None else (path, route)

        try:
            accepted = await accept_handshake(stream, route_of, MAX_FRAME)
            if accepted is None:
                return
            (path, route), websocket = accepted
            try:
                await route(_Link(websocket, self._network) if path == "/cluster" else websocket)
            finally:
                with self.clock.move_on_after(CLOSE_TIMEOUT):
                    await websocket.aclose()
        except (ConnectionClosed, trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            await trio.aclose_forcefully(stream)


class _Link:
    """A node link's connection as the node uses it, sending twice what the network repeats
    (and, with `--logs`, logging the messages it receives)."""

    __slots__ = ("_connection", "_network")

    # Set by `link_messages`: every message a node receives on a link, logged.
    logging = False
    # Set by `count_link_frames`: hears of every frame a node sends on a link.
    counter: Callable[[bytes], None] | None = None

    def __init__(self, connection, network: SimNetwork) -> None:
        self._connection = connection
        self._network = network

    async def send_message(self, message: bytes) -> None:
        if _Link.counter is not None:
            _Link.counter(message)
        await self._connection.send_message(message)

    async def get_message(self) -> bytes | str:
        message = await self._connection.get_message()
        if _Link.logging and isinstance(message, bytes):
            for item in LINK_CODEC.decode(message):
                if not isinstance(item, Gossip | ownership.Renew | ownership.Renewed):
                    log.debug("received %r", item)
        return message

    async def aclose(self, code: int = 1000, reason: str | None = None) -> None:
        await self._connection.aclose(code, reason)


def link_messages(logged: bool) -> None:
    """Log (at DEBUG) every message nodes receive on their links, but gossip and replicas."""
    _Link.logging = logged


@contextmanager
def count_link_frames(counter: Callable[[bytes], None]) -> Iterator[None]:
    """`counter` hears of every frame nodes send on their links while in the block."""
    _Link.counter = counter
    try:
        yield
    finally:
        _Link.counter = None


def describe(error: BaseException) -> str:
    """An exception (the leaves of a group) in one line each: type, message, where raised."""
    if isinstance(error, BaseExceptionGroup):
        return "; ".join(describe(leaf) for leaf in error.exceptions)
    frames = traceback.extract_tb(error.__traceback__)
    where = f" at {frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].lineno}" if frames else ""
    return f"{type(error).__name__}: {error}{where}"
