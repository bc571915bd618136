"""Faults, one at a time, of the kinds a seed enabled; after each heals, the cluster must be
whole again (every node serving, every node agreeing on the members) before the next.

* `crash`: a node is gone, memory and all, then starts again (a new life, empty).
* `leave`: a node stops as SIGTERM stops it (last changes streamed, goodbye), then joins again.
* `partition`: a node cut off from the other nodes, both ways (a minority of one: with three
  nodes that is the only split that leaves a majority).
* `one_way`: a node's packets to the other nodes are lost, theirs to it arrive.
* `split` (five nodes or more): a minority of the nodes, the victim among them, cut off from
  the majority, both ways.
* `client_cut`: a client cut off from every node.
* `delay`: everything to and from a node takes 50 to 500 ms.
* `clog`: two or three of the links between nodes stall (bytes wait, connections stay up), then
  are released one by one. With all three stalled no two nodes can talk: an outage (no majority
  anywhere) until the first is released.
* `pause`: a node's traffic, in and out, waits longer than a peer's expiry, then flows again in
  order: to the others and to its clients the node has stopped, as under SIGSTOP. (Its own
  timers run meanwhile, so it notices the silence as a cut-off node does; the moment after a
  real SIGSTOP, when a node wakes with its old state before its timers have run, is `freeze`'s,
  below.)
* `duplicate`: requests are delivered twice: clients' request frames, and, on node links, the
  messages between homes and owners and rate-limit gossip.

Four more kinds come only on request (`run --with skew,freeze,overlap,wall`; `EXTRA_FAULTS`), each
enabled per seed as the others are, drawn from a random source of their own so that the seed's
other choices stay the same:

* `skew`: one node's clock (simulations/clocks.py) runs 1% fast or 1% slow, in every life of
  the node, for the whole run (set up before the nodes boot; not one of the faults in turn).
* `freeze`: a node stops as under SIGSTOP, in the middle of writing to one of its connections:
  that write's first part arrives, the rest waits (`SimNetwork.freeze_mid_write`); its traffic
  is held both ways, its tasks that write or read wait, and its clock fires no timer until the
  thaw, when the overdue ones fire at once. Half the freezes are short (0.2 to 1 s), half
  longer than a peer's expiry, as pauses are.
* `overlap`: faults come in bursts on different members at once, never more than a minority
  faulty (one of three, up to two of five): for each faulty member, maybe a crash (restarted
  within 0.5 s, or later), and maybe, overlapping it, a cut from the others (both ways or one),
  slow links (0.5 to 0.7 s each way), or clogged ones, each starting at its own moment, so that
  a member restarts into a cut, crashes while another is cut or clogged, or two crash together.
  A third of the bursts repeat messages too (`duplicate`'s), half of the second copies a
  moment later, behind what was sent meanwhile (`SimNetwork.late_repeat`). Half the bursts
  change the members too, once: a faulty member leaves gracefully; or it crashes, stays down,
  and a live member that is not faulty forgets it (`forget`, as `sluicegate forget` asks), and
  it starts again, a new life and a member again; or a new member (an id no life had) joins
  through the seeds and leaves gracefully at the heal, once the cluster with it is whole.
  Until it serves, a joiner counts as faulty, and it raises n: of four, one may be faulty, of
  six two, so the faults beyond wait until it serves. Another member may crash while one
  leaves or is forgotten. After the burst, everything heals at once. Half the seeds with
  `overlap` also run two of their nodes' clocks at the full drift the protocol allows
  (cluster/slots.py's DRIFT, one fast and one slow), in every life.
* `wall`: each node reads a time of day of its own (simulations/clocks.py's `TimeOfDay`), a
  few seconds off the true one, or hours, and stepped forwards and backwards during the run
  (`times_of_day`, `step_times_of_day`); its generations, eras and rate limits read it, and it
  keeps a state directory, as a cluster whose clocks may step back must.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Awaitable, Callable

import trio

from sluicegate.cluster.slots import DRIFT

from .availability import PLACE as PROBE
from .clocks import TimeOfDay
from .history import History

FAULTS = (
    "crash",
    "partition",
    "one_way",
    "client_cut",
    "delay",
    "clog",
    "pause",
    "leave",
    "duplicate",
)
# Kinds a run adds only on request (`run --with`): every seed's history would change if they
# were drawn by default.
EXTRA_FAULTS = ("skew", "freeze", "overlap", "wall")
# How fast or slow a skewed node's clock runs.
SKEW = 0.01
# The clock rates of `overlap`'s two drifting nodes: as fast and as slow as the protocol allows.
DRIFTS = (1 + DRIFT, 1 - DRIFT)
# A freeze waits this long for the victim's next write to start in; then it starts anyway.
FREEZE_ARMED_FOR = 0.5
# How far the time of day steps (seconds, either way), but for one step in six, by an hour or two.
STEP = (0.5, 3.0)
# A cluster not whole again this long after a fault healed is a failure of its own.
RECOVERY_LIMIT = 20.0
# The changes of the members an overlap burst may make besides its faults, one at most.
MEMBER_CHANGES = ("leave", "forget", "join")
# How long an operator keeps asking a member to forget a crashed one (it must count it down,
# and the members must have settled since they last changed), and then waits for every member
# up to hear of it, as `sluicegate forget` does.
FORGET_PATIENCE = 10.0
# One part of a burst: what acts (`Injector._crash_in_burst`, ...), on what, and its randomness.
Plan = tuple[Callable[..., Awaitable[None]], tuple, random.Random]


def extra_faults(seed: int, wanted: tuple[str, ...], nodes: list[str]) -> tuple[list[str], dict]:
    """Which of the `wanted` extra kinds `seed` enables (each with probability 1/2), and the
    clock rate of each node (the skewed one's differs), from a random source of their own."""
    rng = random.Random(f"extra faults {seed}")
    enabled = [kind for kind in ("skew", "freeze") if kind in wanted and rng.random() < 0.5]
    rates = {}
    if "skew" in enabled:
        rates[rng.choice(nodes)] = rng.choice((1 + SKEW, 1 - SKEW))
    # Drawn apart, so that the kinds before it choose as they did before it came.
    overlapping = random.Random(f"overlapping faults {seed}")
    if "overlap" in wanted and overlapping.random() < 0.5:
        enabled.append("overlap")
        if overlapping.random() < 0.5:
            fast, slow = overlapping.sample([node for node in nodes if node not in rates], 2)
            rates[fast], rates[slow] = DRIFTS
    return enabled, rates


def times_of_day(
    seed: int, wanted: tuple[str, ...], nodes: list[str], until: float
) -> tuple[dict[str, TimeOfDay], list[tuple[float, str, float]]]:
    """If `seed` enables `wall` (with probability 1/2, from a random source of its own), each
    node's time of day, and its steps before `until`: (when, node, by), in order."""
    rng = random.Random(f"times of day {seed}")
    if "wall" not in wanted or rng.random() >= 0.5:
        return {}, []
    offsets = {node: rng.uniform(-2.0, 2.0) for node in nodes}
    if rng.random() < 0.25:
        offsets[rng.choice(nodes)] += rng.choice((-1, 1)) * rng.uniform(3600, 3 * 3600)
    steps = []
    for node in nodes:
        for _ in range(rng.randint(0, 2)):
            hours = rng.random() < 1 / 6
            size = rng.uniform(3600, 2 * 3600) if hours else rng.uniform(*STEP)
            steps.append((rng.uniform(2.0, until - 2.0), node, rng.choice((-1, 1)) * size))
    return {node: TimeOfDay(offset) for node, offset in offsets.items()}, sorted(steps)


async def step_times_of_day(steps, cluster, history: History) -> None:
    """Step each node's time of day as `steps` say, but never while the node is frozen or in
    the first second of a life: a node sees a step by reading its time of day against its
    monotonic clock at least every 0.25 s (node/rate_limit_service.py's `READ_INTERVAL`), and a
    step within a longer gap (a freeze), or before its first reading, could pass as a slew
    (node/clock.py's `SteadyWall`), which the checkers, judging each node on its clock without
    its steps, would take for a fault."""
    for at, node_id, by in steps:
        await trio.sleep_until(at)
        while True:
            node = cluster.nodes[node_id]
            if (
                node.crashed
                or node.left
                or not (node.clock.frozen or trio.current_time() < node.began + 1)
            ):
                break
            await trio.sleep(0.1)
        history.times_of_day[node_id].step(by)
        history.note(f"time of day of {node_id} stepped {by:+.3f} s")


class Injector:
    """Faults of `kinds` on `cluster` (simulations/run.py's `_Cluster`) until `stop`."""

    def __init__(
        self,
        cluster,
        clients: list[str],
        history: History,
        kinds: list[str],
        rng: random.Random,
        expires_in: float,
        restart: Callable[[str], Awaitable[None]],
    ) -> None:
        self.cluster = cluster
        self.network = cluster.network
        self.clients = clients
        self.history = history
        self.kinds = kinds
        self.rng = rng
        self.expires_in = expires_in
        self.restart = restart
        self.fired: Counter = Counter()
        self._ending = False
        self._waiting: trio.CancelScope | None = None

    def stop(self) -> None:
        """End the fault in progress now (healing it) and start no other."""
        self._ending = True
        if self._waiting is not None:
            self._waiting.cancel()

    async def run(self) -> None:
        rng = self.rng
        while True:
            await self._wait(rng.uniform(1.0, 4.0))
            if self._ending:
                return
            kind = rng.choice(self.kinds)
            nodes = self.cluster.ids
            victim = rng.choice(self.clients if kind == "client_cut" else nodes)
            if kind == "duplicate":
                victim = "all"  # every client and every link
            lasting = rng.uniform(0.5, 6.0)
            if kind == "pause":
                lasting = rng.uniform(self.expires_in + 0.5, 1.6 * self.expires_in)
            elif kind == "overlap":
                lasting = rng.uniform(1.0, 6.0)
            elif kind == "freeze":
                if rng.random() < 0.5:
                    lasting = rng.uniform(0.2, 1.0)
                else:
                    lasting = rng.uniform(self.expires_in + 0.5, 1.6 * self.expires_in)
            self.fired[kind] += 1
            self.history.fault(kind, victim, lasting)
            await getattr(self, "_" + kind)(victim, lasting)
            self.history.healed(kind, victim)
            if not await self.until_whole():
                return

    async def until_whole(self) -> bool:
        """Wait until every node serves and all agree on the members; False (and a `stuck` in
        the history) if that takes more than `RECOVERY_LIMIT`."""
        healed = trio.current_time()
        while not self.cluster.whole():
            if trio.current_time() > healed + RECOVERY_LIMIT:
                self.history.stuck(
                    f"not every node serves and agrees on the members {RECOVERY_LIMIT:g} s "
                    f"after the heal: {self.cluster.views()}"
                )
                return False
            await trio.sleep(0.1)
        self.history.whole()
        return True

    async def _wait(self, seconds: float) -> None:
        """Sleep, unless `stop` ends it early."""
        if self._ending:
            return
        with trio.CancelScope() as self._waiting:
            await trio.sleep(seconds)
        self._waiting = None

    def _others(self, victim: str) -> list[str]:
        return [node_id for node_id in self.cluster.ids if node_id != victim]

    def _places(self, victim: str) -> list[str]:
        """Every place but `victim` that may talk to it: the other nodes and the clients (the
        workload's, the one that probes the cluster at the end, and the availability probe)."""
        return self._others(victim) + self.clients + ["probe", PROBE]

    async def _crash(self, victim: str, lasting: float) -> None:
        self.cluster.nodes[victim].crash()
        self.history.down(victim)
        await self._wait(lasting)
        await self.restart(victim)

    async def _leave(self, victim: str, lasting: float) -> None:
        await self.cluster.nodes[victim].leave()
        self.history.down(victim, left=True)
        await self._wait(lasting)
        await self.restart(victim)

    async def _partition(self, victim: str, lasting: float) -> None:
        for other in self._others(victim):
            self.network.cut(victim, other)
        await self._wait(lasting)
        self.network.heal()

    async def _split(self, victim: str, lasting: float) -> None:
        others = self._others(victim)
        minority = [victim, *self.rng.sample(others, len(self.cluster.ids) // 2 - 1)]
        self.history.note("split off " + ", ".join(sorted(minority)))
        for a in minority:
            for b in self.cluster.ids:
                if b not in minority:
                    self.network.cut(a, b)
        await self._wait(lasting)
        self.network.heal()

    async def _one_way(self, victim: str, lasting: float) -> None:
        for other in self._others(victim):
            self.network.cut(victim, other, both_ways=False)
        await self._wait(lasting)
        self.network.heal()

    async def _client_cut(self, victim: str, lasting: float) -> None:
        for node_id in self.cluster.ids:
            self.network.cut(victim, node_id)
        await self._wait(lasting)
        self.network.heal()

    async def _delay(self, victim: str, lasting: float) -> None:
        latency = self.rng.uniform(0.05, 0.5)
        self.history.note(f"latency to and from {victim}: {latency:.3f}s")
        for place in self._places(victim):
            self.network.delay(victim, place, latency)
        await self._wait(lasting)
        for place in self._places(victim):
            self.network.delay(victim, place, 0)

    async def _clog(self, victim: str, lasting: float) -> None:
        """Links between nodes stall (the victim's, and maybe one between two others), then are
        released one by one."""
        others = self._others(victim)
        links = [(victim, other) for other in others]
        if self.rng.random() < 0.5:
            links.append(tuple(others) if len(others) == 2 else tuple(self.rng.sample(others, 2)))
        for a, b in links:
            self.network.hold(a, b)
        self.history.note("clogged " + ", ".join(f"{a}-{b}" for a, b in links))
        nodes = len(self.cluster.ids)
        everyone = len(links) == nodes * (nodes - 1) // 2
        if everyone:  # no two nodes can talk: no majority anywhere, until a link is released
            self.history.outage(True)
        await self._wait(lasting)
        self.rng.shuffle(links)
        for a, b in links:
            self.network.release(a, b)
            self.history.note(f"released {a}-{b}")
            if everyone and (a, b) == links[0]:
                self.history.outage(False)
            if (a, b) != links[-1]:
                await self._wait(self.rng.uniform(0.2, 1.5))

    async def _pause(self, victim: str, lasting: float) -> None:
        self.network.pause(victim)
        await self._wait(lasting)
        self.network.resume(victim)

    async def _freeze(self, victim: str, lasting: float) -> None:
        clock = self.cluster.nodes[victim].clock
        frozen = trio.Event()

        def stopped(detail: str) -> None:
            clock.freeze()
            self.history.note(f"{victim} frozen {detail}")
            frozen.set()

        self.network.freeze_mid_write(victim, random.Random(self.rng.getrandbits(64)), stopped)
        with trio.move_on_after(FREEZE_ARMED_FOR):
            await frozen.wait()
        self.network.freeze(victim, stopped)  # no write came: frozen between two
        await self._wait(lasting)
        # The clock first: its overdue timers fire as the held bytes arrive.
        clock.thaw()
        self.network.thaw(victim)

    async def _duplicate(self, victim: str, lasting: float) -> None:
        self.network.duplicating = True
        await self._wait(lasting)
        self.network.duplicating = False

    # -- overlap -------------------------------------------------------------------------------

    async def _overlap(self, victim: str, lasting: float) -> None:
        """A burst of faults on a minority of members, overlapping, for about `lasting`, maybe
        with a change of the members; then everything heals at once."""
        rng = self.rng
        ids = self.cluster.ids
        faulty = [victim]
        if (len(ids) - 1) // 2 > 1 and rng.random() < 0.7:
            faulty.append(rng.choice(self._others(victim)))
        self.history.note("overlapping faults on " + ", ".join(faulty))
        duplicating = rng.random() < 1 / 3
        if duplicating:
            self.network.duplicating = self.network.repeating_late = True
            self.history.note("messages repeated")
            self.fired["overlap:duplicate"] += 1
        faults: list[tuple[Callable[..., Awaitable[None]], tuple]] = []
        for member in faulty:
            crash = rng.random() < 0.6
            # A member that does not crash has its links cut, slowed or clogged.
            links = rng.choice(("cut", "one_way", "slow", "clog", None if crash else "cut"))
            if crash:
                faults.append((self._crash_in_burst, (member,)))
            if links is not None:
                faults.append((self._links_in_burst, (member, links)))
        plans = [(act, args, random.Random(rng.getrandbits(64))) for act, args in faults]
        # Drawn after the faults, so that a burst draws them as it did before changes came.
        plans, joiner = self._change_members(plans, faulty, random.Random(rng.getrandbits(64)))
        async with trio.open_nursery() as nursery:
            for act, args, plan_rng in plans:
                nursery.start_soon(act, *args, lasting, plan_rng)
        self.network.heal()
        for member in faulty:
            for place in ids:
                if place != member:
                    self.network.delay(member, place, 0)
                    self.network.release(member, place)
        if duplicating:
            self.network.duplicating = self.network.repeating_late = False
        for member in faulty:
            if self.cluster.nodes[member].crashed:
                await self.restart(member)
        if joiner is not None:
            await self._joiner_leaves(joiner)
        self.history.note("burst healed")

    def _change_members(
        self, plans: list[Plan], faulty: list[str], rng: random.Random
    ) -> tuple[list[Plan], str | None]:
        """In half the bursts, one change of the members besides the faults (one: the voters
        of any two members must differ by one member at most, docs/cluster.md): a faulty
        member leaves gracefully, or crashes and is forgotten, or a new member joins. The
        burst's plans with it, and the joiner, if one joins."""
        if rng.random() >= 0.5:
            return plans, None
        change = rng.choice(MEMBER_CHANGES)
        if change == "join":
            joiner = self.cluster.fresh_id()
            plan_rng = random.Random(rng.getrandbits(64))
            return [
                *self._beside_a_join(plans, faulty, joiner),
                (self._join_in_burst, (joiner,), plan_rng),
            ], joiner
        member = rng.choice(faulty)
        if change == "leave":
            departure: Plan = (self._leave_in_burst, (member,), random.Random(rng.getrandbits(64)))
        else:
            asker = rng.choice([node_id for node_id in self.cluster.ids if node_id not in faulty])
            plan_rng = random.Random(rng.getrandbits(64))
            departure = (self._forgotten_in_burst, (member, asker), plan_rng)
        return [*self._beside_a_departure(plans, member), departure], None

    def _beside_a_departure(self, plans: list[Plan], departing: str) -> list[Plan]:
        """`plans`, but the departing member's own crash: its departure takes its place.
        Another member's crash stays, and may come while the departure is not yet settled
        (docs/cluster.md, "A departure, then a crash")."""
        return [plan for plan in plans if plan[:2] != (self._crash_in_burst, (departing,))]

    def _beside_a_join(self, plans: list[Plan], faulty: list[str], joiner: str) -> list[Plan]:
        """`plans`, those of the faulty members beyond a minority put off until `joiner`
        serves. Until then the joiner is a member without its memory, as a restarted life is,
        so one of the faulty: of n + 1 members, n // 2 may be (one of four, two of six)."""
        alongside = faulty[: len(self.cluster.ids) // 2 - 1]
        return [
            plan if plan[1][0] in alongside else (self._once_joined, (joiner, *plan[:2]), plan[2])
            for plan in plans
        ]

    async def _once_joined(
        self,
        joiner: str,
        act: Callable[..., Awaitable[None]],
        args: tuple,
        lasting: float,
        rng: random.Random,
    ) -> None:
        """`act(*args, ...)` once `joiner` serves; nothing if it does not within
        `RECOVERY_LIMIT` (the cluster, not whole after the heal, then fails of its own)."""
        with trio.move_on_after(RECOVERY_LIMIT):
            while not self._serves(joiner):
                await trio.sleep(0.1)
        if self._serves(joiner):
            await act(*args, lasting, rng)

    def _serves(self, node_id: str) -> bool:
        node = self.cluster.nodes.get(node_id)
        return bool(node and not node.crashed and node.semaphores and node.semaphores.ready)

    async def _crash_in_burst(self, member: str, lasting: float, rng: random.Random) -> None:
        """Crash `member` at some moment of the burst; start it again within 0.5 s (half the
        time) or later in the burst, whatever its links are by then."""
        await trio.sleep(rng.uniform(0, lasting / 2))
        self.cluster.nodes[member].crash()
        self.history.down(member)
        self.history.note(f"{member} crashed")
        self.fired["overlap:crash"] += 1
        quick = rng.random() < 0.5
        await trio.sleep(rng.uniform(0.05, 0.5) if quick else rng.uniform(0.5, lasting))
        self.fired["overlap:restart-quick" if quick else "overlap:restart"] += 1
        self.history.note(f"{member} restarts")
        await self.restart(member)

    async def _links_in_burst(
        self, member: str, how: str, lasting: float, rng: random.Random
    ) -> None:
        """Cut `member` from some of the other nodes (both ways; `one_way`: its packets are
        lost, theirs arrive), slow those links (`slow`: 0.5 to 0.7 s each way) or clog them,
        from some moment of the burst until its end, or a little before."""
        others = self._others(member)
        links = sorted(rng.sample(others, rng.randint(1, len(others))))
        await trio.sleep(rng.uniform(0, lasting / 2))
        self.fired[f"overlap:{how}"] += 1
        self.history.note(f"{how} {member} from {', '.join(links)}")
        for other in links:
            if how == "cut":
                self.network.cut(member, other)
            elif how == "one_way":
                self.network.cut(member, other, both_ways=False)
            elif how == "slow":
                self.network.delay(member, other, rng.uniform(0.5, 0.7))
            else:
                self.network.hold(member, other)
        await trio.sleep(rng.uniform(lasting / 2, lasting))
        if rng.random() < 0.5:
            return  # it heals with the rest, at the end of the burst
        self.history.note(f"{how} of {member} healed")
        for other in links:
            if how in ("cut", "one_way"):
                self.network.uncut(member, other)
            elif how == "slow":
                self.network.delay(member, other, 0)
            else:
                self.network.release(member, other)

    async def _leave_in_burst(self, member: str, lasting: float, rng: random.Random) -> None:
        """`member` leaves gracefully at some moment of the burst, as SIGTERM stops it, while
        the others' faults go on; it starts again later in the burst (half the time) or at
        its end."""
        await trio.sleep(rng.uniform(0, lasting / 2))
        node = self.cluster.nodes[member]
        self.history.note(f"{member} leaves")
        await node.leave()
        if not node.left:
            return  # a task of it raised: it is down already, and the heal starts it again
        self.history.down(member, left=True)
        self.fired["overlap:leave"] += 1
        if rng.random() < 0.5:
            await trio.sleep(rng.uniform(0.5, lasting))
            self.history.note(f"{member} restarts")
            await self.restart(member)

    async def _forgotten_in_burst(
        self, member: str, asker: str, lasting: float, rng: random.Random
    ) -> None:
        """`member` crashes at some moment of the burst and stays down, and an operator has
        `asker` (a live member, not faulty) forget it while the others' faults go on. Once
        every member up knows, it starts again later in the burst (half the time) or at its
        end: a new life, and a member again."""
        await trio.sleep(rng.uniform(0, lasting / 2))
        self.cluster.nodes[member].crash()
        self.history.down(member)
        self.history.note(f"{member} crashed, for good as far as the operator knows")
        if await self._forget(asker, member) and rng.random() < 0.5:
            await trio.sleep(rng.uniform(0, lasting / 2))
            self.history.note(f"{member} restarts")
            await self.restart(member)

    async def _forget(self, asker: str, member: str) -> bool:
        """What `sluicegate forget` does, through the call `POST /forget` makes: ask `asker`
        to forget `member` until it does, then wait until every member up has heard. False if
        it did not forget."""
        if not await self._asked_to_forget(asker, member):
            self.fired["overlap:forget-refused"] += 1
            return False
        self.fired["overlap:forget"] += 1
        self.history.note(f"{asker} forgot {member}")
        with trio.move_on_after(FORGET_PATIENCE):
            while not all(member in node.membership.left_members() for node in self._up()):
                await trio.sleep(0.1)
        unaware = [node.node_id for node in self._up() if member in node.membership.generations()]
        if unaware:  # cut off: they hear at the heal
            self.history.note(f"{', '.join(unaware)} had not heard that {member} is forgotten")
        return True

    async def _asked_to_forget(self, asker: str, member: str) -> bool:
        """Ask until `asker` forgets `member`: it forgets only a member it counts down (silent
        for `down_after`), and only once the members settled since their last change there,
        saying how long that takes. False if it refused for good or took `FORGET_PATIENCE`."""
        deadline = trio.current_time() + FORGET_PATIENCE
        while trio.current_time() < deadline and not self.cluster.nodes[asker].crashed:
            members = self.cluster.nodes[asker].membership
            if member not in members.down_members():
                await trio.sleep(0.1)
                continue
            refused = members.forget(member)
            if refused is None:
                return True
            if not refused.retry_after:
                self.history.note(f"{asker} would not forget {member}: {refused.reason}")
                return False
            await trio.sleep(refused.retry_after)
        self.history.note(f"{asker} did not forget {member} within {FORGET_PATIENCE:g} s")
        return False

    def _up(self) -> list:
        """The nodes whose current life runs."""
        return [node for node in self.cluster.nodes.values() if not node.crashed]

    async def _join_in_burst(self, joiner: str, lasting: float, rng: random.Random) -> None:
        """A new member starts at some moment of the burst and joins through its seeds (the
        first members), while the faults go on."""
        await trio.sleep(rng.uniform(0, lasting / 2))
        self.history.note(f"{joiner} joins")
        self.fired["overlap:join"] += 1
        await self.restart(joiner)

    async def _joiner_leaves(self, joiner: str) -> None:
        """At the heal, once every member serves and counts the joiner among the members (or
        after `RECOVERY_LIMIT`), the joiner leaves gracefully, and the cluster is to be whole
        without it."""
        with trio.move_on_after(RECOVERY_LIMIT):
            while not self.cluster.whole():
                await trio.sleep(0.1)
        node = self.cluster.nodes[joiner]
        self.history.note(f"{joiner} leaves")
        await node.leave()
        if node.left:
            self.history.down(joiner, left=True)
        self.cluster.retire(joiner)
