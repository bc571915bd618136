"""Bugs to plant in the node's code, to show the checkers catch them (`run --plant NAME`).

Each is a realistic mistake in one rule, patched in for the whole run of this process.
"""

from __future__ import annotations

from collections.abc import Callable

from sluicegate.cluster import ownership, peers, rate_algorithms, rate_limits, semaphore_leases
from sluicegate.node import clock


def tokens_restart_on_takeover() -> None:
    """A new owner of a semaphore counts fencing tokens from the start of the era, not on from
    the counter its predecessor committed."""
    load = semaphore_leases.SemaphoreLeases.load

    def load_without_the_counter(self, records, now, epoch):
        load(self, records, now, epoch)
        for record in records:
            if isinstance(record, semaphore_leases.SemaphoreRecord):
                self._semaphores[record.name].next_token = (
                    epoch << semaphore_leases.TOKEN_EPOCH_SHIFT
                )

    semaphore_leases.SemaphoreLeases.load = load_without_the_counter


def adopt_any_copy() -> None:
    """A new owner of a slot starts from the copy of whichever acceptor promised first, not
    from the latest copy its quorum holds."""
    ownership.latest = lambda promises: next(iter(promises), None)


def lease_overrun() -> None:
    """An owner acts on a slot for three leases past its quorum's last confirmation, not one:
    cut off or paused, it goes on granting after the others may have taken the slot."""
    init = ownership.Ownership.__init__

    def init_overrunning(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.usable_lease *= 3

    ownership.Ownership.__init__ = init_overrunning


def expiry_early() -> None:
    """A node expires a peer a second before the expiry it would set (0.8 s before the one
    its client counts on, with the home's stretch for clock drift)."""
    set_expiry = peers.PeerTable._set_expiry

    def set_expiry_early(self, peer_id, expires_at):
        set_expiry(self, peer_id, expires_at - 1.0)

    peers.PeerTable._set_expiry = set_expiry_early


def gossip_merged_by_sum() -> None:
    """Gossiped "go" events are added up as they come, every copy of them: the highest
    sequence number seen per origin (the max that makes merging idempotent) is not consulted,
    so an event that arrives twice counts twice."""
    rate_limits._Seen.first_time = lambda self, seq: True


def fifo_skipped_for_small_counts() -> None:
    """A count of 1 is granted as soon as it fits beside the holders, though larger counts
    wait before it: the fit test leaves the waiters out for the smallest requests."""
    request = semaphore_leases.SemaphoreLeases.request

    def request_small_first(self, peer_id, semaphore, count, now, ticket=0):
        sem = self._semaphore(semaphore)
        new = peer_id not in sem.tickets
        if count == 1 and new and sem.grace_until is None and sem.acquired + count <= sem.max:
            self._hold(sem, peer_id, count)
            sem.tickets[peer_id] = ticket
            self._in_use.add(sem.name)
            return True
        return request(self, peer_id, semaphore, count, now, ticket)

    semaphore_leases.SemaphoreLeases.request = request_small_first


def duplicated_grant_on_retry() -> None:
    """A lock request that comes again (a home's retry, or the network's repeat) after it was
    granted is granted again: its count is added to the semaphore once more."""
    request = semaphore_leases.SemaphoreLeases.request

    def request_granting_again(self, peer_id, semaphore, count, now, ticket=0):
        sem = self._semaphore(semaphore)
        if sem.holders.get(peer_id) == count and sem.tickets.get(peer_id) == ticket:
            self._hold(sem, peer_id, count)
            return True
        return request(self, peer_id, semaphore, count, now, ticket)

    semaphore_leases.SemaphoreLeases.request = request_granting_again


def rate_retry_decided_again() -> None:
    """A rate-limit check or wait that comes again (the client's retry, or the network's
    repeat) is decided again: the goes remembered by retry id are never found."""
    rate_limits.RememberedGoes.find = lambda self, key, retry_id: None


def leased_keys_start_whole() -> None:
    """A node that gains a slot starts its lease-mode keys whole, as a new era does, though the
    holders still spend the slices its predecessor handed out."""
    gain_slot = rate_limits.RateLimits.gain_slot

    def gain_slot_whole(self, slot, now, ballot, previous, cold=False):
        gain_slot(self, slot, now, ballot, previous, cold)
        self._leased_since.pop(slot, None)

    rate_limits.RateLimits.gain_slot = gain_slot_whole


def tokens_shared_by_concurrent_holders() -> None:
    """A semaphore held by several at once gives a newcomer the token of the latest holder, as
    if tokens fenced only exclusive locks: the counter advances only when the semaphore was
    free. (A, of max 1, never has a holder beside a newcomer: only its tokens stay right.)"""
    hold = semaphore_leases.SemaphoreLeases._hold

    def hold_sharing(self, sem, peer_id, count):
        if sem.holders and peer_id not in sem.holders:
            sem.next_token -= 1
        hold(self, sem, peer_id, count)

    semaphore_leases.SemaphoreLeases._hold = hold_sharing


def adopt_latest_ballot_any_version() -> None:
    """A new owner of a slot adopts a copy of the latest ballot its quorum accepted, but not
    the latest version of it: the first promise of that ballot, which may lack its owner's
    last committed writes."""
    ownership.latest = lambda promises: max(promises, key=lambda p: p.accepted, default=None)


def rate_limits_on_the_stepped_time_of_day() -> None:
    """Rate limits decide on the time of day as it reads, steps and all, not on the time of day
    without its steps: a step forward opens the next window at once."""
    clock.SteadyWall.now = lambda self: self._wall()


def handover_window_by_the_senders_clock() -> None:
    """A hand-over carries a window's end as the sender's clock reads it, and the receiver
    takes that reading for one of its own: from a clock behind, the window has ended already."""

    def values(self, state, now):
        return (float(state.start + self.window), float(state.count), float(state.previous))

    def from_values(self, values, now, ratio=1.0):
        state = rate_algorithms._WindowState(values[0] - self.window)
        state.count, state.previous = int(values[1]), int(values[2])
        return state

    rate_algorithms._Windows.values = values
    rate_algorithms._Windows.from_values = from_values


PLANTED: dict[str, Callable[[], None]] = {
    "tokens-restart-on-takeover": tokens_restart_on_takeover,
    "adopt-any-copy": adopt_any_copy,
    "lease-overrun": lease_overrun,
    "expiry-early": expiry_early,
    "gossip-merged-by-sum": gossip_merged_by_sum,
    "fifo-skipped-for-small-counts": fifo_skipped_for_small_counts,
    "duplicated-grant-on-retry": duplicated_grant_on_retry,
    "rate-retry-decided-again": rate_retry_decided_again,
    "leased-keys-start-whole": leased_keys_start_whole,
    "tokens-shared-by-concurrent-holders": tokens_shared_by_concurrent_holders,
    "adopt-latest-ballot-any-version": adopt_latest_ballot_any_version,
    "rate-limits-on-the-stepped-time-of-day": rate_limits_on_the_stepped_time_of_day,
    "handover-window-by-the-senders-clock": handover_window_by_the_senders_clock,
}
