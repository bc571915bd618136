"""The node links' codec (node/wire.py, node/link_codec.py) on the frames of a cluster lock:

    python bench/link_codec.py [--rounds 5]

Each frame holds one message, as nearly every frame of a lock's path does (docs/benchmarks.md,
"What a lock costs the cluster"): the home's and the owner's writes (`Accept` of a peer record,
of a semaphore and its lock), their acknowledgement, the forwards between home and owner, and a
lease round of 80 slots. It prints microseconds per frame to encode and to decode, the best of
`--rounds`, nothing of the network.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from sluicegate.cluster.lock_messages import (  # noqa: E402
    LockAnswer,
    LockRelease,
    LockReleased,
    LockRequest,
    LockTaken,
)
from sluicegate.cluster.ownership import Renew  # noqa: E402
from sluicegate.cluster.peers import PeerRecord  # noqa: E402
from sluicegate.cluster.replication import Accept, Accepted  # noqa: E402
from sluicegate.cluster.semaphore_leases import LockRecord, SemaphoreRecord  # noqa: E402
from sluicegate.cluster.slots import Ballot  # noqa: E402
from sluicegate.node.link_codec import LINK_CODEC  # noqa: E402

BALLOT = Ballot(1_700_000_000_000, 7, "n2")
PEER = PeerRecord(123456, 60.0, 60.0, {"lock-1": 1}, None, 3, {"lock-1": 7}, {}, 1, 0)
FRAMES = {
    "Accept, a peer": Accept(3, BALLOT, 22, False, [PEER], []),
    "Accept, a lock": Accept(
        5,
        BALLOT,
        9,
        False,
        [SemaphoreRecord("lock-1", 9, 2), LockRecord("lock-1", 123456, 1, 7, 8, False, 0)],
        [],
    ),
    "Accepted": Accepted(3, BALLOT, 22),
    "LockRequest": LockRequest(123456, "lock-1", 1, 7),
    "LockAnswer": LockAnswer(123456, "lock-1", 7, True, 4194311),
    "LockRelease": LockRelease(123456, "lock-1", 7, True),
    "LockReleased": LockReleased(123456, "lock-1", 7),
    "LockTaken": LockTaken(123456, "lock-1", 7),
    "Renew, 80 slots": Renew(
        40, BALLOT.era, list(range(80)), [7] * 80, False, 1_764_000_000_000_000_000
    ),
}
TIMES = 20_000


def best_of(rounds: int, step) -> float:
    """Microseconds per call of `step`, the best of `rounds` runs of `TIMES` calls."""
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(TIMES):
            step()
        best = min(best, (time.perf_counter() - started) / TIMES * 1e6)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    total_encode = total_decode = 0.0
    print(f"{'frame':18} {'bytes':>5} {'encode':>9} {'decode':>9}")
    for name, message in FRAMES.items():
        frame = LINK_CODEC.encode([message])
        assert LINK_CODEC.decode(frame) == [message]
        encode = best_of(args.rounds, lambda m=message: LINK_CODEC.encode([m]))
        decode = best_of(args.rounds, lambda f=frame: LINK_CODEC.decode(f))
        total_encode, total_decode = total_encode + encode, total_decode + decode
        print(f"{name:18} {len(frame):5} {encode:7.2f}us {decode:7.2f}us")
    print(f"{'all nine':18} {'':5} {total_encode:7.2f}us {total_decode:7.2f}us")


if __name__ == "__main__":
    main()
