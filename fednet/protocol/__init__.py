"""The wire protocol: msgpack headers plus raw zero-copy array frames (no pickle)."""
from __future__ import annotations

from fednet.errors import ProtocolError
from fednet.protocol.codec import (
    DEFAULT_LIMITS,
    Limits,
    Message,
    decode,
    encode,
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
    "frame_bytes",
    "peek_kind",
    "stage_of",
    "tensor_bytes",
]
