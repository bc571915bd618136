"""What a core lets go of in bulk, freed a chunk a step (cluster/graveyard.py)."""

from __future__ import annotations

import math
import random

from sluicegate.cluster.graveyard import FREE_CHUNK, Graveyard
from sluicegate.cluster.semaphore_leases import SemaphoreConfig
from sluicegate.cluster.semaphore_ops import Acquire, NewPeer
from tests.cluster.shards import Shards


def test_what_is_buried_is_freed_a_chunk_a_call_the_last_buried_first():
    graveyard = Graveyard()
    table = {n: (n, "x") for n in range(5)}
    heap = list(range(7))
    graveyard.bury(table)
    graveyard.bury(heap)
    graveyard.bury([])  # nothing to keep
    assert graveyard
    graveyard.free(4)
    assert heap == [0, 1, 2] and len(table) == 5
    graveyard.free(4)
    assert heap == [] and len(table) == 4
    graveyard.free(10)
    assert table == {} and not graveyard


def test_a_stopping_node_frees_its_peers_over_steps_not_in_the_step_that_hands_them_on():
    cluster = Shards({"A": SemaphoreConfig(1)}, ["n1"], seed=4)
    peers = [cluster.call(NewPeer(600), "n1").result for _ in range(3 * FREE_CHUNK)]
    for peer in peers[:100]:
        cluster.submit("n1", Acquire(peer, "A", 1, 600, 600))
    cluster.settle()
    shard = cluster.nodes["n1"]
    graveyard = shard.home.graveyard
    assert not graveyard
    shard.leave(cluster.now)
    assert graveyard and shard.next_deadline() == -math.inf
    steps = 0
    while graveyard:
        shard.tick(cluster.now)
        steps += 1
    # The peers, their expiry heap and their groups: a chunk each step.
    assert 2 <= steps <= math.ceil((2 * len(peers) + 256) / FREE_CHUNK)
    assert shard.next_deadline() > -math.inf
    assert not any(shard.home.peers.has_peer(peer) for peer in random.sample(peers, 50))
