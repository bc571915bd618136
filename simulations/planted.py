"""Bugs to plant in the node's code, to show the checkers catch them (`run --plant NAME`).

Each is a realistic mistake in one rule, patched in for the whole run of this process.
"""

from __future__ import annotations

from collections.abc import Callable

from sluicegate.cluster import peers, semaphore_leases


def fencing_counter_stays_on_takeover() -> None:
    """A new owner goes on counting tokens from its own counter, not above its predecessor's."""
    merge = semaphore_leases.SemaphoreLeases.merge

    def merge_keeping_the_counter(self, records, now, epoch, names):
        names = list(names)
        counters = {name: self._semaphores[name].next_token for name in names}
        merge(self, records, now, epoch, names)
        for name, counter in counters.items():
            self._semaphores[name].next_token = counter

    semaphore_leases.SemaphoreLeases.merge = merge_keeping_the_counter


def grace_period_ignored() -> None:
    """A new owner grants at once, before the holders' homes have re-asserted their locks."""
    semaphore_leases.SemaphoreLeases.start_grace = lambda self, until, names=None: None


def expiry_early() -> None:
    """A node expires a peer half a second before the expiry its client counts on."""
    set_expiry, add = peers.PeerTable._set_expiry, peers.PeerTable._add

    def set_expiry_early(self, peer, peer_id, expires_at):
        set_expiry(self, peer, peer_id, expires_at - 0.5)

    def add_early(self, peer_id, peer):
        peer.expires_at -= 0.5
        add(self, peer_id, peer)

    peers.PeerTable._set_expiry = set_expiry_early
    peers.PeerTable._add = add_early


PLANTED: dict[str, Callable[[], None]] = {
    "fencing-counter-stays-on-takeover": fencing_counter_stays_on_takeover,
    "grace-period-ignored": grace_period_ignored,
    "expiry-early": expiry_early,
}
