"""The wire protocol: msgpack headers plus raw zero-copy array frames (no pickle)."""
from __future__ import annotations

from fednet.errors import ProtocolError
from fednet.protocol.codec import (
    DEFAULT_LIMITS,
    Limits,
    Message,
    decode,
    encode,
    encoded_sizes,
    peek,
    peek_kind,
    stage_of,
    tensor_bytes,
)
from fednet.protocol.frames import frame_bytes
from fednet.protocol.kinds import ALLOWED_DTYPES, PROTOCOL_VERSION, MsgKind

__all__ = [
    "ALLOWED_DTYPES",
    "DEFAULT_LIMITS",
    "Limits",
    "Message",
    "MsgKind",
    "PROTOCOL_VERSION",
    "ProtocolError",
    "decode",
    "encode",
    "encoded_sizes",
    "frame_bytes",
    "peek",
    "peek_kind",
    "stage_of",
    "tensor_bytes",
]
