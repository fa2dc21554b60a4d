"""Protocol constants: the wire version, message kinds and the dtype allowlist."""
from __future__ import annotations

import enum

PROTOCOL_VERSION = 2
"""Version number written into every header; decode rejects any other value.
(2: arrays larger than CHUNK_BYTES travel as several frames.)"""

CHUNK_BYTES = 1 << 18
"""An array of more bytes than this travels as consecutive frames of this size (the last one
shorter). ZeroMQ sends its heartbeats only between frames: with one frame per array, a peer
receiving a model slower than the heartbeat timeout (45 MB at 100 Mbit/s is 3.6 s) would be
dropped as dead. 256 KiB is 2 s even at 1 Mbit/s."""


class MsgKind(enum.IntEnum):
    """The kind of a message, sent as a small integer in the header."""

    READY = 1
    WELCOME = 2
    TASK = 3
    RESULT = 4
    HANDOFF = 5
    HANDOFF_ACK = 6
    HOP_DONE = 7
    FAILURE = 8
    SHUTDOWN = 9
    HEARTBEAT = 10
    BYE = 11
    REJECT = 12


ALLOWED_DTYPES: frozenset[str] = frozenset(
    {
        "float16",
        "float32",
        "float64",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",  # secure aggregation's masked vectors: elements of Z_2^32 or Z_2^64
        "uint64",
        "bool",
    }
)
"""numpy dtype names allowed on the wire (little-endian); never object, void or str."""
