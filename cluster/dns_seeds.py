"""Seeds found by DNS: what a `dns:NAME:PORT` entry of `[cluster] join` is, which addresses of a
name's answers become seeds, and when a name that fails is worth a warning.

A name is looked up again and again (node/dns_discovery.py does the lookups), as a Kubernetes
headless Service is: every A and AAAA address it answers, with the entry's port, is a seed as if
it were listed. Each answer replaces what the name gave before, so an address that disappears
stops being dialled as a seed; members already known stay members, since membership decides
that, not DNS. A lookup that gives no address (no answer, a server failure, a name that does not
exist or has no address) keeps the name's last seeds: a DNS server that blinks must not make a
node that is still alone forget where the others are.

Rules, by what comes in:

| what a lookup gives        | the name's seeds                 | told, per name                  |
|----------------------------|----------------------------------|---------------------------------|
| addresses                  | the first `most_addresses` in    | the seeds, if they changed; a   |
|                            | order, this node's own skipped   | cut, at most once a `warn_every`|
| no address, or no answer   | kept                             | the failure, at most once a     |
|                            |                                  | `warn_every`, with those untold |
| addresses after a failure  | as for addresses                 | the recovery, if the failure    |
|                            |                                  | was told                        |

Pure: `now` comes in as an argument, and what to tell the operator comes out as events.
"""

from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

PREFIX = "dns:"
# A name's answer may hold thousands of addresses (a large answer comes over TCP): each would be
# a seed, and alone a node introduces itself to every seed at once.
MOST_ADDRESSES = 256
# Lookups repeat every few seconds; a name that keeps failing is told once a minute.
WARN_EVERY = 60.0

_LABEL = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")
_LONGEST_NAME = 253


class AddressError(ValueError):
    """A `dns:NAME:PORT` entry or a DNS server's address that cannot be used; `str()` says why."""


@dataclass(frozen=True, slots=True)
class DnsName:
    """A name whose every address, with `port`, is a seed."""

    name: str
    port: int

    def __str__(self) -> str:
        return f"{PREFIX}{self.name}:{self.port}"

    def seed(self, address: str) -> str:
        """The seed an address of this name gives, as a member's address is written."""
        return f"[{address}]:{self.port}" if ":" in address else f"{address}:{self.port}"


def is_dns_entry(entry: str) -> bool:
    return entry.startswith(PREFIX)


def parse_dns_entry(entry: str) -> DnsName:
    """`dns:NAME:PORT` as a `DnsName`; AddressError says what is wrong with it."""
    name, _, port_text = entry.removeprefix(PREFIX).rpartition(":")
    port = _port(port_text)
    if not name or port is None:
        raise AddressError(
            f"{entry!r} is not dns:NAME:PORT, such as dns:sluicegate-peers:8000 (a port 1-65535)"
        )
    if _is_ip_address(name.strip("[]")):
        raise AddressError(f"{entry!r} names an address, not a name: list it without dns:")
    labels = name.removesuffix(".").split(".")
    if len(name) > _LONGEST_NAME or not all(_LABEL.fullmatch(label) for label in labels):
        raise AddressError(
            f"{entry!r}: {name!r} is not a DNS name (labels of letters, digits, '-' and '_', "
            "up to 63 characters each, between dots)"
        )
    return DnsName(name, port)


def parse_nameserver(text: str) -> tuple[str, int]:
    """A DNS server's `IP:PORT`, `[IPv6]:PORT` or bare IP (port 53) as (IP, port)."""
    if _is_ip_address(text):
        return text, 53
    host, _, port_text = text.rpartition(":")
    port = _port(port_text)
    if port is None or not _is_ip_address(host.removeprefix("[").removesuffix("]")):
        raise AddressError(
            f"{text!r} is not a DNS server's IP:PORT, such as 10.96.0.10:53 or [fd00::10]:53 "
            "(an address, not a name: a name would need a DNS server of its own)"
        )
    return host.removeprefix("[").removesuffix("]"), port


def _port(text: str) -> int | None:
    if not text.isascii() or not text.isdigit() or len(text) > 5:
        return None
    port = int(text)
    return port if 1 <= port <= 65535 else None


def _is_ip_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


# -- what is told -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SeedsChanged:
    """The name gives other seeds than before (this node's own address not among them)."""

    name: DnsName
    seeds: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class AnswerCut:
    """The name answered more addresses than a name may give; the first `kept` are seeds."""

    name: DnsName
    answered: int
    kept: int


@dataclass(frozen=True, slots=True)
class LookupFailing:
    """Lookups of the name gave no address, `failures` of them since the last such warning;
    `reason` is the latest one's."""

    name: DnsName
    reason: str
    failures: int
    kept: int  # seeds kept from the name's last answer with addresses


@dataclass(frozen=True, slots=True)
class LookupRecovered:
    """The name answers addresses again after `failures` lookups that gave none."""

    name: DnsName
    failures: int


DnsEvent = SeedsChanged | AnswerCut | LookupFailing | LookupRecovered


class _NameState:
    __slots__ = ("seeds", "failures", "failure_told", "untold", "failure_told_at", "cut_told_at")

    def __init__(self) -> None:
        self.seeds: tuple[str, ...] = ()
        self.failures = 0  # lookups in a row that gave no address
        self.failure_told = False  # whether a warning told of those
        self.untold = 0  # lookups that gave no address since the last warning
        self.failure_told_at = -math.inf
        self.cut_told_at = -math.inf


class DnsSeeds:
    """The seeds every `dns:` name of the join list gives now."""

    def __init__(
        self,
        names: Iterable[DnsName],
        own_address: str,
        *,
        most_addresses: int = MOST_ADDRESSES,
        warn_every: float = WARN_EVERY,
    ) -> None:
        """`own_address` is the one this node advertises: among the answers, it is skipped as
        a listed seed equal to it is."""
        self.names: tuple[DnsName, ...] = tuple(dict.fromkeys(names))
        self._own_address = own_address
        self._most_addresses = most_addresses
        self._warn_every = warn_every
        self._states = {name: _NameState() for name in self.names}

    def seeds(self) -> tuple[str, ...]:
        """Every seed the names give, each once, in the order of the names."""
        return tuple(dict.fromkeys(seed for state in self._states.values() for seed in state.seeds))

    def answered(self, name: DnsName, addresses: Sequence[str], now: float) -> list[DnsEvent]:
        """The addresses the name has now, each an A or AAAA record of its answer."""
        if not addresses:
            return self.failed(name, "no address", now)
        state = self._states[name]
        events: list[DnsEvent] = []
        if state.failure_told:
            events.append(LookupRecovered(name, state.failures))
        state.failures, state.failure_told = 0, False
        # Sorted, so that a server that rotates its answer does not change the seeds it cuts.
        unique = sorted(set(addresses), key=_address_order)
        if len(unique) > self._most_addresses and now >= state.cut_told_at + self._warn_every:
            state.cut_told_at = now
            events.append(AnswerCut(name, len(unique), self._most_addresses))
        seeds = tuple(
            seed
            for seed in (name.seed(address) for address in unique[: self._most_addresses])
            if seed != self._own_address
        )
        if seeds != state.seeds:
            state.seeds = seeds
            events.insert(0, SeedsChanged(name, seeds))
        return events

    def failed(self, name: DnsName, reason: str, now: float) -> list[DnsEvent]:
        """The lookup gave no address (`reason` says why): the name keeps its seeds."""
        state = self._states[name]
        state.failures += 1
        state.untold += 1
        if now < state.failure_told_at + self._warn_every:
            return []
        state.failure_told_at, state.failure_told = now, True
        told, state.untold = state.untold, 0
        return [LookupFailing(name, reason, told, len(state.seeds))]


def _address_order(address: str) -> tuple[int, int, str]:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return (7, 0, address)  # not an address: last, and dialling it will say why
    return (ip.version, int(ip), address)
