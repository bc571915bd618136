"""A tiny authoritative DNS server on 127.0.0.1 for tests: UDP on a free port, served from a
thread, answering A and AAAA questions from a table the test changes as it goes.

A name in the table answers its addresses of the family asked (none of that family: an empty
answer, as a real server does); a name not in it answers NXDOMAIN; a name marked failing answers
SERVFAIL, and one marked silent gets no answer at all.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
from collections import Counter

import dns.exception
import dns.flags
import dns.message
import dns.name
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import dns.rrset

TTL = 1


class DnsServer:
    def __init__(self) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.settimeout(0.1)  # how long stop() may wait for the thread
        self.port: int = self._sock.getsockname()[1]
        self._lock = threading.Lock()
        self._names: dict[dns.name.Name, list[str]] = {}
        self._failing: set[dns.name.Name] = set()
        self._silent: set[dns.name.Name] = set()
        self._questions: Counter[dns.name.Name] = Counter()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="dns-server", daemon=True)

    @property
    def address(self) -> str:
        """What `--resolver` takes."""
        return f"127.0.0.1:{self.port}"

    def answer(self, name: str, addresses: list[str]) -> None:
        """From now on, `name` has these addresses (and answers)."""
        key = _absolute(name)
        with self._lock:
            self._names[key] = list(addresses)
            self._failing.discard(key)
            self._silent.discard(key)

    def fail(self, name: str) -> None:
        """From now on, questions about `name` are answered SERVFAIL."""
        with self._lock:
            self._failing.add(_absolute(name))

    def ignore(self, name: str) -> None:
        """From now on, questions about `name` get no answer."""
        with self._lock:
            self._silent.add(_absolute(name))

    def questions(self, name: str) -> int:
        """How many questions about `name` (of any type) came so far."""
        with self._lock:
            return self._questions[_absolute(name)]

    def __enter__(self) -> DnsServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopping.set()
        self._thread.join(5)
        self._sock.close()

    def _serve(self) -> None:
        while not self._stopping.is_set():
            try:
                wire, client = self._sock.recvfrom(4096)
            except TimeoutError:
                continue
            try:
                query = dns.message.from_wire(wire)
            except dns.exception.DNSException:
                continue
            response = self._respond(query)
            if response is not None:
                self._sock.sendto(response.to_wire(), client)

    def _respond(self, query: dns.message.Message) -> dns.message.Message | None:
        response = dns.message.make_response(query)
        response.flags |= dns.flags.AA
        if not query.question:
            response.set_rcode(dns.rcode.FORMERR)
            return response
        question = query.question[0]
        with self._lock:
            self._questions[question.name] += 1
            if question.name in self._silent:
                return None
            if question.name in self._failing:
                response.set_rcode(dns.rcode.SERVFAIL)
                return response
            addresses = self._names.get(question.name)
        if addresses is None:
            response.set_rcode(dns.rcode.NXDOMAIN)
            return response
        version = {dns.rdatatype.A: 4, dns.rdatatype.AAAA: 6}.get(question.rdtype)
        matching = [a for a in addresses if ipaddress.ip_address(a).version == version]
        if matching:
            response.answer.append(
                dns.rrset.from_text_list(
                    question.name, TTL, dns.rdataclass.IN, question.rdtype, matching
                )
            )
        return response


def _absolute(name: str) -> dns.name.Name:
    return dns.name.from_text(name)  # relative text is taken as absolute


def loopback_port(addresses: list[str]) -> int:
    """A TCP port free on every one of `addresses` (all of 127.0.0.0/8 is loopback on Linux),
    so that nodes on them share one port, as pods behind one Service do."""
    for _ in range(50):
        with socket.socket() as first:
            first.bind((addresses[0], 0))
            port = first.getsockname()[1]
            if all(_free(address, port) for address in addresses[1:]):
                return port
    raise AssertionError(f"no port free on all of {addresses}")


def _free(address: str, port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((address, port))
        except OSError:
            return False
        return True
