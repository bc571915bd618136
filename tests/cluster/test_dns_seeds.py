"""Seeds found by DNS, without a network: `dns:NAME:PORT` entries, which addresses of an answer
become seeds, how often a failing name is told (cluster/dns_seeds.py), and what membership does
with the seeds found (cluster/membership.py)."""

from __future__ import annotations

import random

import pytest

from sluicegate.cluster.dns_seeds import (
    AddressError,
    AnswerCut,
    DnsName,
    DnsSeeds,
    LookupFailing,
    LookupRecovered,
    SeedsChanged,
    is_dns_entry,
    parse_dns_entry,
    parse_nameserver,
)
from sluicegate.cluster.membership import Gossip, Membership, MemberState

PEERS = DnsName("sluicegate-peers", 8000)


@pytest.mark.parametrize(
    ("entry", "name"),
    [
        ("dns:sluicegate-peers:8000", DnsName("sluicegate-peers", 8000)),
        ("dns:peers.default.svc.cluster.local.:1", DnsName("peers.default.svc.cluster.local.", 1)),
        ("dns:_sluicegate._tcp.example:65535", DnsName("_sluicegate._tcp.example", 65535)),
    ],
)
def test_a_dns_entry_is_a_name_and_a_port(entry, name):
    assert is_dns_entry(entry)
    assert parse_dns_entry(entry) == name
    assert str(name) == entry


@pytest.mark.parametrize(
    ("entry", "said"),
    [
        ("dns:sluicegate-peers", "is not dns:NAME:PORT"),
        ("dns::8000", "is not dns:NAME:PORT"),
        ("dns:peers:0", "is not dns:NAME:PORT"),
        ("dns:peers:65536", "is not dns:NAME:PORT"),
        ("dns:peers:+80", "is not dns:NAME:PORT"),
        ("dns:peers:８０", "is not dns:NAME:PORT"),  # fullwidth digits, which int() takes
        ("dns:10.0.0.1:8000", "names an address, not a name"),
        ("dns:[fd00::1]:8000", "names an address, not a name"),
        ("dns:peers..local:8000", "is not a DNS name"),
        ("dns:-peers:8000", "is not a DNS name"),
        ("dns:pe ers:8000", "is not a DNS name"),
        (f"dns:{'a' * 64}:8000", "is not a DNS name"),
        (f"dns:{'.'.join(['a' * 63] * 4)}:8000", "is not a DNS name"),  # 255 characters
    ],
)
def test_a_wrong_dns_entry_says_what_is_wrong(entry, said):
    with pytest.raises(AddressError, match=said):
        parse_dns_entry(entry)


def test_only_entries_that_start_with_dns_are_names():
    assert not is_dns_entry("10.0.0.1:8000")
    assert not is_dns_entry("dnsmasq:8000")


@pytest.mark.parametrize(
    ("text", "server"),
    [
        ("10.96.0.10:53", ("10.96.0.10", 53)),
        ("127.0.0.1:5353", ("127.0.0.1", 5353)),
        ("[fd00::10]:53", ("fd00::10", 53)),
        ("10.96.0.10", ("10.96.0.10", 53)),
        ("fd00::10", ("fd00::10", 53)),
    ],
)
def test_a_dns_server_is_an_ip_and_a_port(text, server):
    assert parse_nameserver(text) == server


@pytest.mark.parametrize("text", ["dns.google:53", "10.96.0.10:", "10.96.0.10:dns", "", ":53"])
def test_a_dns_server_by_name_or_without_a_port_number_is_refused(text):
    with pytest.raises(AddressError, match="is not a DNS server's IP:PORT"):
        parse_nameserver(text)


def test_every_address_with_the_port_is_a_seed_but_this_nodes_own():
    seeds = DnsSeeds([PEERS], own_address="10.0.0.2:8000")
    events = seeds.answered(PEERS, ["10.0.0.3", "10.0.0.2", "fd00::1", "10.0.0.1"], now=0.0)
    expected = ("10.0.0.1:8000", "10.0.0.3:8000", "[fd00::1]:8000")
    assert events == [SeedsChanged(PEERS, expected)]
    assert seeds.seeds() == expected


def test_the_same_addresses_in_another_order_change_nothing():
    seeds = DnsSeeds([PEERS], own_address="n")
    seeds.answered(PEERS, ["10.0.0.1", "10.0.0.2", "10.0.0.3"], now=0.0)
    assert seeds.answered(PEERS, ["10.0.0.3", "10.0.0.1", "10.0.0.2", "10.0.0.1"], now=5.0) == []


def test_an_address_that_disappears_is_a_seed_no_more_and_a_new_one_is():
    seeds = DnsSeeds([PEERS], own_address="n")
    seeds.answered(PEERS, ["10.0.0.1", "10.0.0.2", "10.0.0.3"], now=0.0)
    events = seeds.answered(PEERS, ["10.0.0.1", "10.0.0.3", "10.0.0.4"], now=5.0)
    assert events == [SeedsChanged(PEERS, ("10.0.0.1:8000", "10.0.0.3:8000", "10.0.0.4:8000"))]


def test_the_seeds_of_several_names_each_once():
    other = DnsName("other", 9000)
    seeds = DnsSeeds([PEERS, other, PEERS], own_address="n")
    assert seeds.names == (PEERS, other)
    seeds.answered(other, ["10.0.0.9"], now=0.0)
    seeds.answered(PEERS, ["10.0.0.1"], now=0.0)
    assert seeds.seeds() == ("10.0.0.1:8000", "10.0.0.9:9000")


def test_a_large_answer_is_cut_to_the_first_addresses_and_told_once_a_minute():
    seeds = DnsSeeds([PEERS], own_address="n", most_addresses=256)
    addresses = [f"10.0.{i // 256}.{i % 256}" for i in range(300)]
    events = seeds.answered(PEERS, list(reversed(addresses)), now=0.0)
    assert events[1:] == [AnswerCut(PEERS, 300, 256)]
    assert seeds.seeds() == tuple(f"{address}:8000" for address in addresses[:256])
    assert seeds.answered(PEERS, addresses, now=59.0) == []
    assert seeds.answered(PEERS, addresses, now=60.0) == [AnswerCut(PEERS, 300, 256)]


def test_a_failing_name_keeps_its_seeds_and_is_told_once_a_minute_with_the_failures_untold():
    seeds = DnsSeeds([PEERS], own_address="n")
    seeds.answered(PEERS, ["10.0.0.1", "10.0.0.2"], now=0.0)
    assert seeds.failed(PEERS, "timed out", now=5.0) == [LookupFailing(PEERS, "timed out", 1, 2)]
    for now in range(10, 65, 5):
        assert seeds.failed(PEERS, "timed out", now=float(now)) == []
    assert seeds.seeds() == ("10.0.0.1:8000", "10.0.0.2:8000")
    assert seeds.failed(PEERS, "SERVFAIL", now=65.0) == [LookupFailing(PEERS, "SERVFAIL", 12, 2)]


def test_no_address_is_a_failure_too_and_the_seeds_stay():
    seeds = DnsSeeds([PEERS], own_address="n")
    seeds.answered(PEERS, ["10.0.0.1"], now=0.0)
    assert seeds.answered(PEERS, [], now=5.0) == [LookupFailing(PEERS, "no address", 1, 1)]
    assert seeds.seeds() == ("10.0.0.1:8000",)


def test_a_recovery_is_told_only_after_a_failure_that_was():
    seeds = DnsSeeds([PEERS], own_address="n")
    seeds.failed(PEERS, "no such name", now=0.0)
    seeds.failed(PEERS, "no such name", now=5.0)
    events = seeds.answered(PEERS, ["10.0.0.1"], now=10.0)
    assert events == [SeedsChanged(PEERS, ("10.0.0.1:8000",)), LookupRecovered(PEERS, 2)]
    # A name that flaps within the minute: the failure is untold, and so is its recovery.
    assert seeds.failed(PEERS, "no such name", now=15.0) == []
    assert seeds.answered(PEERS, ["10.0.0.1"], now=20.0) == []
    # Counted: the untold failures at 5, 15 and 60 s.
    assert seeds.failed(PEERS, "no such name", now=60.0) == [
        LookupFailing(PEERS, "no such name", 3, 1)
    ]


def test_each_name_is_told_on_its_own():
    other = DnsName("other", 9000)
    seeds = DnsSeeds([PEERS, other], own_address="n")
    assert seeds.failed(PEERS, "x", now=0.0) == [LookupFailing(PEERS, "x", 1, 0)]
    assert seeds.failed(other, "x", now=1.0) == [LookupFailing(other, "x", 1, 0)]


def introduced(membership: Membership, now: float) -> set[str]:
    return {target for target, _ in membership.tick(now, random.Random(1))}


def test_a_lone_member_introduces_itself_to_the_seeds_found_in_place_of_those_found_before():
    membership = Membership("n1", "10.0.0.1:8000", 1, ["listed:8000"])
    assert introduced(membership, 0.0) == {"listed:8000"}
    membership.use_found_seeds(["10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"])
    assert introduced(membership, 0.5) == {"listed:8000", "10.0.0.2:8000", "10.0.0.3:8000"}
    membership.use_found_seeds(["10.0.0.3:8000"])
    assert introduced(membership, 1.0) == {"listed:8000", "10.0.0.3:8000"}


def test_a_member_whose_address_disappears_from_dns_stays_a_member():
    membership = Membership("n1", "10.0.0.1:8000", 1)
    membership.use_found_seeds(["10.0.0.2:8000"])
    membership.receive(Gossip("n2", (MemberState("n2", "10.0.0.2:8000", 1, 1),)), now=0.0)
    membership.use_found_seeds([])
    assert membership.live_members() == {"n1": "10.0.0.1:8000", "n2": "10.0.0.2:8000"}
    assert introduced(membership, 0.5) == {"10.0.0.2:8000"}  # gossip, to the member
