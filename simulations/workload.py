"""What the simulated clients do, and how their requests are seen on the wire.

Each client (`sluicegate.client.Client`, over the simulated network) runs
* `LOCKERS` locker tasks: each takes a lock of A (max 1) or B (max 3, count 1 or 2), waiting
  for it up to `LOCK_TIMEOUT` or (one time in `TRY_ONCE_ONE_IN`) not at all, sometimes A nested
  inside B (levels: B is 1, A is 0), holds it a while (one time in ten beyond a peer's expiry,
  so only heartbeats keep it) and lets go; holders of A write to the `FencedResource` with
  their fencing token;
* one rate task: `check`s of a limiter in exact mode, of one in gossip mode and of one in lease
  mode (bursts, decided by the client from its slices), and `wait`s (`rate_limited`) on the
  exact one.

`Tap` wraps a client's WebSocket: it records every rate-limit request as it leaves and its
answer as it arrives (a request the client sends again after a broken connection, or one the
network repeats, is another send, and may be another decision), and while the simulated network
duplicates it sends the client's request frames twice. The chaos clients
(simulations/chaos_client.py) wrap real WebSockets in it too, and run the same rate task.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

import msgpack
import trio

from sluicegate.client.client import Client

from .history import History
from .network import SimNetwork

LOCKERS = 2
EXPIRES_IN = 5.0
LOCK_TIMEOUT = 10.0
# One outermost lock in this many is asked for without waiting (granted now, or refused).
TRY_ONCE_ONE_IN = 6
# A lock body lasts up to `SHORT_HOLD` seconds, or, one time in `LONG_HOLD_ONE_IN`, longer than
# a peer's expiry: heartbeats alone keep it.
SHORT_HOLD = 0.5
LONG_HOLD = (EXPIRES_IN * 0.6, EXPIRES_IN * 1.6)
LONG_HOLD_ONE_IN = 10
# One lock in this many takes A while holding B (a nested lock, one peer for both).
NESTED_ONE_IN = 5
# A write to the protected resource usually arrives at once; one in this many is held up on its
# way for up to `WRITE_DELAY_MAX` seconds, and may arrive after its lease ended.
SLOW_WRITE_ONE_IN = 8
WRITE_DELAY_MAX = 2 * EXPIRES_IN
# Rate limits the rate tasks use (simulations/run.py configures them): keys and a wait's timeout.
EXACT_KEYS = ("k0", "k1")
GOSSIP_KEYS = ("k0",)
LEASED_KEYS = ("k0", "k1")
RATE_WAIT_TIMEOUT = 1.5


@dataclass
class RateSend:
    """One rate-limit request on the wire: sent at `sent`, to `node`; answered at `answered`
    with a decision per time asked (`goes`, and what `remaining` after each), or an error;
    unanswered if the connection broke. `retry_ids`: one per time asked; every try of a call
    carries the same (a copy the network repeats too). `given_up`: when the client left the
    connection with the request unanswered (it connected to another node); an answer that
    arrives after that is seen on the wire, but the client never takes it."""

    client: str
    node: str
    op: str  # "check" or "wait"
    limiter: str
    key: str
    n: int
    times: int
    retry_ids: tuple[int, ...]
    sent: float
    answered: float | None = None
    goes: list[bool] | None = None
    remaining: list[int] | None = None
    error: str = ""
    given_up: float | None = None


@dataclass
class FencedResource:
    """A resource that A's holders write to, with their fencing token: it applies a write whose
    token is at least the highest it has applied, and rejects one below (a holder whose lease
    lapsed while another took over)."""

    history: History
    highest: int = -1
    writes: list[tuple[float, str, int, bool]] = field(default_factory=list)

    def write(self, who: str, token: int) -> None:
        applied = token >= self.highest
        if applied:
            self.highest = token
        self.writes.append((trio.current_time(), who, token, applied))
        self.history.wrote(who, token, applied)


class Tap:
    """A client's WebSocket to `node`, seen from the wire (see the module doc).

    `node` may be None where the client cannot tell which node it reached (behind a load
    balancer): the node's welcome names it. `network` is the simulated network, whose
    duplicating the Tap carries out; None for a real socket, which nothing duplicates on.
    `clock` stamps the sends and answers: the nodes' clock, so that the checkers place each
    decision in the nodes' fixed windows."""

    # Set by `run --logs`: every request and answer, in the history (as notes).
    logging = False

    __slots__ = (
        "_ws",
        "_client",
        "_node",
        "_history",
        "_network",
        "_clock",
        "_waiting",
        "_greeted",
    )

    def __init__(
        self,
        ws,
        client: str,
        node: str | None,
        history: History,
        network: SimNetwork | None = None,
        clock: Callable[[], float] = trio.current_time,
    ):
        self._ws = ws
        self._client = client
        self._node = node
        self._history = history
        self._network = network
        self._clock = clock
        # Request id -> its sends still unanswered on this connection, the oldest first.
        self._waiting: dict[int, list[RateSend]] = {}
        self._greeted = False  # the first message is the hello, sent once

    @property
    def closed(self):
        return self._ws.closed

    async def send_message(self, message: bytes) -> None:
        if not self._greeted:
            self._greeted = True
            await self._ws.send_message(message)
            return
        copies = 2 if self._network is not None and self._network.duplicating else 1
        for _ in range(copies):
            if Tap.logging:
                self._history.note(f"{self._client} to {self._node}: {msgpack.unpackb(message)}")
            if b"check" in message or b"wait" in message:
                self._sending(msgpack.unpackb(message))
            await self._ws.send_message(message)
        if copies == 2:
            self._network.duplicated += 1

    async def get_message(self) -> bytes:
        message = await self._ws.get_message()
        if self._node is None:  # the first message is the welcome
            self._node = str(msgpack.unpackb(message).get("node", "?"))
        if Tap.logging:
            answers = msgpack.unpackb(message, strict_map_key=False)
            self._history.note(f"{self._client} from {self._node}: {answers}")
        if self._waiting:
            answers = msgpack.unpackb(message, strict_map_key=False)
            if isinstance(answers, list):
                for answer in answers:
                    self._answered(answer)
        return message

    async def aclose(self) -> None:
        await self._ws.aclose()

    def replaces(self, previous: Tap | None) -> Tap:
        """This connection takes the place of the client's `previous` one: the client has left
        that one (it broke, or was retired), and the requests still unanswered on it with it.
        Returns self."""
        if previous is not None:
            now = previous._clock()
            for sends in previous._waiting.values():
                for send in sends:
                    if send.given_up is None:
                        send.given_up = now
        return self

    def _sending(self, requests: list[dict]) -> None:
        now = self._clock()
        for request in requests:
            if request.get("op") not in ("check", "wait"):
                continue
            send = RateSend(
                self._client,
                self._node,
                request["op"],
                request["limiter"],
                request.get("key", ""),
                request.get("n", 1),
                request.get("times", 1),
                tuple(request.get("retry_ids") or [request["retry_id"]]),
                now,
            )
            self._history.rate_sent(send)
            self._waiting.setdefault(request["id"], []).append(send)

    def _answered(self, answer: dict) -> None:
        sends = self._waiting.get(answer.get("id"))
        if not sends:
            return
        send = sends.pop(0)
        if not sends:
            del self._waiting[answer["id"]]
        decisions = None
        if "ok" in answer:
            decisions = answer["ok"] if isinstance(answer["ok"], list) else [answer["ok"]]
        self._history.rate_answered(send, self._clock(), decisions, answer.get("error", ""))


async def client(
    name: str, network: SimNetwork, urls: list[str], history: History, resource, seed: int
) -> None:
    rng = random.Random(seed)

    current: Tap | None = None

    async def open_websocket(url: str):
        nonlocal current
        address = url.split("//", 1)[1].split("/", 1)[0]
        ws = await network.open_websocket(name, address)
        history.note(f"{name} connected to {address}")
        current = Tap(ws, name, address.split(":")[0], history, network).replaces(current)
        return current

    urls = list(urls)
    rng.shuffle(urls)
    lib = Client(
        [url + "/ws" for url in urls],
        expires_in=EXPIRES_IN,
        rng=random.Random(rng.getrandbits(64)),
        open_websocket=open_websocket,
    )
    async with lib:
        async with trio.open_nursery() as tasks:
            for number in range(LOCKERS):
                tasks.start_soon(
                    _locker,
                    f"{name}.{number}",
                    lib,
                    history,
                    resource,
                    random.Random(rng.getrandbits(64)),
                )
            tasks.start_soon(rates, f"{name}.r", lib, history, random.Random(rng.getrandbits(64)))


async def _locker(
    name: str, client: Client, history: History, resource: FencedResource, rng: random.Random
) -> None:
    async with trio.open_nursery() as writes:
        while True:
            semaphore, count = rng.choice([("A", 1), ("B", 1), ("B", 2)])
            nested = semaphore == "B" and rng.randrange(NESTED_ONE_IN) == 0
            timeout = 0.0 if rng.randrange(TRY_ONCE_ONE_IN) == 0 else LOCK_TIMEOUT
            await _hold(
                name, client, history, resource, rng, writes, semaphore, count, nested, timeout
            )
            await trio.sleep(rng.uniform(0, 0.2))


async def _hold(
    name: str,
    client: Client,
    history: History,
    resource: FencedResource,
    rng: random.Random,
    writes: trio.Nursery,
    semaphore: str,
    count: int,
    nested: bool,
    timeout: float = LOCK_TIMEOUT,
) -> None:
    """Take the lock (waiting at most `timeout`), hold it a while (writing to the resource if
    it is A, taking A inside if `nested`), let go; every outcome goes to the history."""
    history.asked(name, semaphore, count)
    try:
        async with client.lock(semaphore, count=count, timeout=timeout) as lease:
            history.granted(name, semaphore, count, lease.fencing_token, lease.peer_id)
            try:
                if semaphore == "A":
                    _write(name, lease.fencing_token, resource, rng, writes)
                long = rng.randrange(LONG_HOLD_ONE_IN) == 0
                await trio.sleep(rng.uniform(*LONG_HOLD) if long else rng.uniform(0, SHORT_HOLD))
                if nested:
                    await _hold(name, client, history, resource, rng, writes, "A", 1, False)
                elif semaphore == "A" and rng.random() < 0.5:
                    _write(name, lease.fencing_token, resource, rng, writes)
            finally:
                history.released(name, semaphore, count, lease.lost)
    except Exception as error:  # noqa: BLE001 (every refusal is part of the history)
        history.refused(name, semaphore, type(error).__name__)


def _write(
    name: str, token: int | None, resource: FencedResource, rng: random.Random, writes
) -> None:
    """Send a write to the resource: it arrives at once, or (sometimes) later."""
    if token is None:
        return
    history = resource.history
    history.write_sent(name, token)
    if rng.randrange(SLOW_WRITE_ONE_IN):
        resource.write(name, token)
        return

    async def arrive_later(delay: float) -> None:
        await trio.sleep(delay)
        resource.write(name, token)

    writes.start_soon(arrive_later, rng.uniform(0, WRITE_DELAY_MAX))


async def rates(name: str, client: Client, history: History, rng: random.Random) -> None:
    """The rate task: checks of "gossip" and "exact", and waits on "exact", until cancelled.
    What the nodes answered is recorded by the client's `Tap`; here only calls that raised."""
    while True:
        n = 2 if rng.random() < 0.2 else 1
        choice = rng.random()
        try:
            if choice < 0.55:
                await client.check("gossip", rng.choice(GOSSIP_KEYS), n)
            elif choice < 0.75:
                await client.check("exact", rng.choice(EXACT_KEYS), n)
            elif choice < 0.9:
                # A burst from the client's slice of the key, asking for the next as it goes.
                key = rng.choice(LEASED_KEYS)
                for _ in range(rng.randint(1, 6)):
                    if (await client.check("leased", key, n)).go:
                        history.lease_went(name, "leased", key, n)
            else:
                async with client.rate_limited(
                    "exact", rng.choice(EXACT_KEYS), n, timeout=RATE_WAIT_TIMEOUT
                ):
                    pass
        except Exception as error:  # noqa: BLE001 (the wire's record says what happened)
            history.note(f"{name} rate call: {type(error).__name__}")
        await trio.sleep(rng.uniform(0.02, 0.4))
