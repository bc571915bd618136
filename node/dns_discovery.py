"""DNS discovery: a trio task looks up every `dns:NAME:PORT` entry of the join list again and
again, and hands the seeds their answers give to membership. The rules (which addresses become
seeds, when a failing name is worth a warning) are cluster/dns_seeds.py's; this module asks DNS
and logs what the rules tell.

Lookups go by the system's resolver configuration (/etc/resolv.conf: its servers and its search
domains, so that a Kubernetes Service's short name resolves in a pod as it does for any program
there), or to the one DNS server `[cluster] resolver` names. dnspython asks, on trio (it finds
trio through sniffio), with no cache of its own: every lookup is a fresh question.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import dns.asyncresolver
import dns.exception
import dns.nameserver
import dns.resolver
import trio

from sluicegate.cluster.dns_seeds import (
    AnswerCut,
    DnsEvent,
    DnsName,
    DnsSeeds,
    LookupFailing,
    LookupRecovered,
    SeedsChanged,
    parse_nameserver,
)

from .clock import TRIO_CLOCK, Clock

log = logging.getLogger("sluicegate.discovery")

# Kubernetes' DNS (CoreDNS) answers for a Service with a time to live of 5 s: asking more often
# gets the same answer, asking less often finds a new pod later. A pod that appears is found
# within about 10 s, while a new member settles for `down_after` anyway.
LOOKUP_EVERY = 5.0
# Both queries of a lookup (AAAA, then A) must end well within one interval.
LOOKUP_TIMEOUT = 2.0
# Past this, a lookup is given up whatever the resolver does.
LOOKUP_BOUND = 5.0


class LookupFailed(Exception):
    """A lookup gave no address; `str()` says why."""


# A name to every A and AAAA address it has now; raises LookupFailed.
Resolve = Callable[[str], Awaitable[list[str]]]


def dns_resolver(nameserver: str | None = None, timeout: float = LOOKUP_TIMEOUT) -> Resolve:
    """Look names up by the system's configuration, or ask only `nameserver` (IP:PORT).

    The configuration is read at the first lookup, not before: a node whose /etc/resolv.conf is
    missing or wrong starts all the same, and says so at each warning."""
    server = None if nameserver is None else parse_nameserver(nameserver)
    resolver: dns.asyncresolver.Resolver | None = None

    async def resolve(name: str) -> list[str]:
        nonlocal resolver
        try:
            if resolver is None:
                resolver = _resolver(server, timeout)
            # With the search domains, as glibc does: `sluicegate-peers` is the Service in the
            # pod's own namespace.
            answer = await resolver.resolve_name(name, search=True)
        except dns.resolver.NXDOMAIN:
            raise LookupFailed("no such name") from None
        except dns.resolver.NoAnswer:
            raise LookupFailed("the name has no A or AAAA record") from None
        except dns.exception.DNSException as error:
            raise LookupFailed(str(error) or type(error).__name__) from None
        except OSError as error:
            raise LookupFailed(f"{type(error).__name__}: {error}") from None
        return list(answer.addresses())

    return resolve


def _resolver(server: tuple[str, int] | None, timeout: float) -> dns.asyncresolver.Resolver:
    if server is None:
        resolver = dns.asyncresolver.Resolver()
    else:
        try:
            # The system's search domains still apply to the server named.
            resolver = dns.asyncresolver.Resolver()
        except (dns.exception.DNSException, OSError):
            resolver = dns.asyncresolver.Resolver(configure=False)
        resolver.nameservers = [dns.nameserver.Do53Nameserver(*server)]
    resolver.timeout = timeout
    resolver.lifetime = timeout
    return resolver


class DnsDiscovery:
    """Each name looked up every `every` seconds, in a task of its own, its seeds handed on."""

    def __init__(
        self,
        seeds: DnsSeeds,
        resolve: Resolve,
        use_seeds: Callable[[tuple[str, ...]], None],
        *,
        every: float = LOOKUP_EVERY,
        clock: Clock = TRIO_CLOCK,
    ) -> None:
        """`use_seeds(seeds)` receives every seed the names give, each time that changes."""
        self._seeds = seeds
        self._resolve = resolve
        self._use_seeds = use_seeds
        self._every = every
        self._clock = clock

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            for name in self._seeds.names:
                nursery.start_soon(self._follow, name)
            # Not after the first answers: a DNS server that is down must not hold the node up.
            task_status.started()

    async def _follow(self, name: DnsName) -> None:
        while True:
            started = self._clock.now()
            events = await self._look_up(name)
            for event in events:
                _tell(event, self._every)
            if any(isinstance(event, SeedsChanged) for event in events):
                self._use_seeds(self._seeds.seeds())
            await self._clock.sleep_until(started + self._every)

    async def _look_up(self, name: DnsName) -> list[DnsEvent]:
        try:
            # dnspython times its queries by the wall clock; this bounds them by the node's.
            with self._clock.fail_after(LOOKUP_BOUND):
                addresses = await self._resolve(name.name)
        except LookupFailed as error:
            return self._seeds.failed(name, str(error), self._clock.now())
        except trio.TooSlowError:
            reason = f"no answer within {LOOKUP_BOUND:g} s"
            return self._seeds.failed(name, reason, self._clock.now())
        return self._seeds.answered(name, addresses, self._clock.now())


def _tell(event: DnsEvent, every: float) -> None:
    if isinstance(event, SeedsChanged):
        log.info(
            "%s gives %d seeds: %s", event.name, len(event.seeds), ", ".join(event.seeds) or "-"
        )
    elif isinstance(event, AnswerCut):
        log.warning(
            "%s answered %d addresses; only the first %d are seeds.",
            event.name,
            event.answered,
            event.kept,
        )
    elif isinstance(event, LookupFailing):
        log.warning(
            "Cannot look up %s: %s (%d lookups failed since the last such line). It is looked "
            "up again every %g s; the %d seeds it gave last are kept.",
            event.name,
            event.reason,
            event.failures,
            every,
            event.kept,
        )
    elif isinstance(event, LookupRecovered):
        log.info("%s answers again, after %d lookups that failed.", event.name, event.failures)
