"""DNS discovery against a DNS server of our own on loopback (tests/dns_server.py), never the
internet: the lookups of node/dns_discovery.py in a trio task, then real nodes on 127.0.0.2 to
127.0.0.5 that share one port, as the pods behind a Kubernetes headless Service do, and find each
other through `--join dns:NAME:PORT`."""

from __future__ import annotations

import json
import logging
import urllib.request

import pytest
import trio

from sluicegate.cluster.dns_seeds import DnsName, DnsSeeds
from sluicegate.node.dns_discovery import DnsDiscovery, dns_resolver
from tests.dns_server import DnsServer, loopback_port
from tests.nodes import NodeProcess, is_ready, wait_until

NAME = "sluicegate.test"
EVERY = 0.05  # between lookups, in the tests in-process


class Seeds:
    """What discovery hands membership, and a way to wait for it."""

    def __init__(self) -> None:
        self.now: tuple[str, ...] = ()
        self.handed = 0

    def use(self, seeds: tuple[str, ...]) -> None:
        self.now = seeds
        self.handed += 1

    async def become(self, expected: tuple[str, ...], timeout: float = 5.0) -> None:
        with trio.fail_after(timeout):
            while self.now != expected:
                await trio.sleep(0.01)


def discovery(server: DnsServer, seeds: Seeds, own: str = "127.0.0.9:8000") -> DnsDiscovery:
    return DnsDiscovery(
        DnsSeeds([DnsName(NAME, 8000)], own),
        dns_resolver(server.address, timeout=0.3),
        seeds.use,
        every=EVERY,
    )


def told(caplog, level: int) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "sluicegate.discovery" and r.levelno == level
    ]


async def test_the_seeds_follow_the_answer_as_it_changes_and_skip_this_node():
    seeds = Seeds()
    with DnsServer() as server:
        server.answer(NAME, ["127.0.0.2", "127.0.0.3", "127.0.0.9", "::1"])
        async with trio.open_nursery() as nursery:
            await nursery.start(discovery(server, seeds).run)
            await seeds.become(("127.0.0.2:8000", "127.0.0.3:8000", "[::1]:8000"))
            server.answer(NAME, ["127.0.0.3", "127.0.0.4"])
            await seeds.become(("127.0.0.3:8000", "127.0.0.4:8000"))
            asked = server.questions(NAME)
            await trio.sleep(10 * EVERY)
            # Asked again and again (A and AAAA each time); handed on only when changed.
            assert server.questions(NAME) >= asked + 8
            assert seeds.handed == 2
            nursery.cancel_scope.cancel()


async def test_a_failing_lookup_is_told_once_retried_and_its_seeds_kept(caplog):
    caplog.set_level(logging.INFO, logger="sluicegate.discovery")
    seeds = Seeds()
    with DnsServer() as server:
        server.answer(NAME, ["127.0.0.2"])
        async with trio.open_nursery() as nursery:
            await nursery.start(discovery(server, seeds).run)
            await seeds.become(("127.0.0.2:8000",))
            server.fail(NAME)
            with trio.fail_after(5):
                while server.questions(NAME) < 20:  # SERVFAIL, again and again
                    await trio.sleep(0.01)
            server.ignore(NAME)  # then no answer at all: timeouts
            asked = server.questions(NAME)
            with trio.fail_after(5):
                while server.questions(NAME) < asked + 4:
                    await trio.sleep(0.01)
            assert seeds.now == ("127.0.0.2:8000",)
            server.answer(NAME, ["127.0.0.2", "127.0.0.4"])
            await seeds.become(("127.0.0.2:8000", "127.0.0.4:8000"))
            nursery.cancel_scope.cancel()
    warnings = told(caplog, logging.WARNING)
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith(f"Cannot look up dns:{NAME}:8000: ")
    assert "SERVFAIL" in warnings[0] and "the 1 seeds it gave last are kept" in warnings[0]
    infos = told(caplog, logging.INFO)
    assert any(line.startswith(f"dns:{NAME}:8000 answers again, after ") for line in infos)


async def test_a_name_that_does_not_exist_is_a_failure_too(caplog):
    seeds = Seeds()
    with DnsServer() as server:
        async with trio.open_nursery() as nursery:
            await nursery.start(discovery(server, seeds).run)
            with trio.fail_after(5):
                while server.questions(NAME) < 6:
                    await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
    warnings = told(caplog, logging.WARNING)
    assert warnings == [
        f"Cannot look up dns:{NAME}:8000: no such name (1 lookups failed since the last such "
        f"line). It is looked up again every {EVERY:g} s; the 0 seeds it gave last are kept."
    ]
    assert seeds.handed == 0


# -- real nodes ---------------------------------------------------------------------------------

ADDRESSES = ["127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"]
CONFIG = '[semaphores]\nA = 3\n[cluster]\ndown_after = "1s"\ngossip_interval = "200ms"\n'
SECRET = {"SLUICEGATE_CLUSTER_SECRET": "dns-discovery-secret-0123456789"}


def members(node: NodeProcess) -> dict[str, str]:
    """Each member `node` knows of, and its state (up, down or left); {} if it does not answer."""
    try:
        with urllib.request.urlopen(f"{node.url}/status.json", timeout=2) as answer:
            status = json.loads(answer.read())
    except OSError:
        return {}
    return {member["id"]: member["state"] for member in status["members"]}


@pytest.mark.process
def test_nodes_find_each_other_by_a_name_and_a_node_added_to_it_joins(tmp_path):
    port = loopback_port(ADDRESSES)
    nodes: list[NodeProcess] = []
    with DnsServer() as server:

        def start(index: int) -> NodeProcess:
            name = f"n{index + 1}"
            join = ["--join", f"dns:{NAME}:{port}", "--resolver", server.address]
            node = NodeProcess(
                CONFIG,
                port=port,
                address=ADDRESSES[index],
                workdir=tmp_path / name,
                args=["--node-id", name, *join],
                env=SECRET,
            )
            nodes.append(node)
            return node.start()

        try:
            server.answer(NAME, ADDRESSES[:3])
            for index in range(3):
                start(index)
            three = {"n1": "up", "n2": "up", "n3": "up"}
            wait_until(lambda: all(members(n) == three for n in nodes), 30, "one cluster of 3")
            wait_until(lambda: all(is_ready(n.url) for n in nodes), 30, "all three ready")

            # The name gains an address: the nodes that run look it up again and dial it.
            server.answer(NAME, ADDRESSES)
            found = f"dns:{NAME}:{port} gives 3 seeds"  # the three others, each node's own not
            wait_until(lambda: all(found in n.new_log() for n in nodes), 20, "the new address")
            start(3)
            four = {**three, "n4": "up"}
            wait_until(lambda: all(members(n) == four for n in nodes), 30, "one cluster of 4")
            wait_until(lambda: all(is_ready(n.url) for n in nodes), 30, "all four ready")
            for node in nodes:
                assert "Refused a node link" not in node.new_log()  # nobody dialled itself
        finally:
            for node in nodes:
                node.kill()
