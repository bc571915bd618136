"""The client's WebSocket framing (client/websocket.py) beside wsproto's, the library it could use
instead, side by side in one run:

    python bench/websocket_framing.py [--frames 200000]

* read: server frames (unmasked) of typical sizes, fed in 64 KiB reads as a socket gives them,
  each parsed into a whole message;
* write: client frames (masked) of the same sizes.

Both sides do exactly the framing the client needs, with nothing of the network; the figures
are microseconds per frame. The wire bytes are wsproto's (the reference), and both sides must
count the same messages in them. Whether they decode alike is
tests/client/test_websocket_conformance.py.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from wsproto.frame_protocol import FrameProtocol, Opcode

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from sluicegate.client.websocket import BINARY, FrameReader, frame  # noqa: E402

# An answer to one lock (about 40 bytes of msgpack), a frame of 32 of them, and a big one.
SIZES = (40, 1300, 60_000)
READ_SIZE = 65536


def wire_of(size: int, frames: int) -> list[bytes]:
    server = FrameProtocol(client=False, extensions=[])
    stream = b"".join(bytes(server.send_data(os.urandom(size))) for _ in range(frames))
    return [stream[at : at + READ_SIZE] for at in range(0, len(stream), READ_SIZE)]


def read_ours(reads: list[bytes]) -> int:
    reader, messages = FrameReader(), 0
    for data in reads:
        reader.feed(data)
        while reader.next_event() is not None:
            messages += 1
    return messages


def read_wsproto(reads: list[bytes]) -> int:
    protocol, messages = FrameProtocol(client=True, extensions=[]), 0
    parts: list[bytes] = []
    for data in reads:
        protocol.receive_bytes(data)
        for received in protocol.received_frames():
            parts.append(received.payload)
            if received.message_finished:
                b"".join(parts)
                parts = []
                messages += 1
    return messages


def write_ours(payload: bytes, frames: int) -> None:
    for _ in range(frames):
        frame(BINARY, payload, os.urandom(4))


def write_wsproto(payload: bytes, frames: int) -> None:
    client = FrameProtocol(client=True, extensions=[])
    for _ in range(frames):
        client._serialize_frame(Opcode.BINARY, payload)  # send_data, without its checks


def timed(function, *args) -> float:
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        function(*args)
        best = min(best, time.perf_counter() - started)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=200_000, help="frames of 40 bytes")
    args = parser.parse_args()
    print("WebSocket framing, microseconds per frame (best of 3)")
    print(f"  {'size':>7}  {'read: ours':>10}  {'wsproto':>8}  {'write: ours':>11}  {'wsproto':>8}")
    for size in SIZES:
        frames = max(200, args.frames * 40 // size)
        reads = wire_of(size, frames)
        assert read_ours(reads) == read_wsproto(reads) == frames
        payload = os.urandom(size)
        figures = [
            timed(read_ours, reads),
            timed(read_wsproto, reads),
            timed(write_ours, payload, frames),
            timed(write_wsproto, payload, frames),
        ]
        us = [seconds / frames * 1e6 for seconds in figures]
        print(f"  {size:>7}  {us[0]:>10.2f}  {us[1]:>8.2f}  {us[2]:>11.2f}  {us[3]:>8.2f}")


if __name__ == "__main__":
    main()
