"""A message handed to a receiver in the same process (the in-process runtime, fednet local):
what encode, the network's copy into the receiver's memory and decode would give the receiver,
and the bytes its frames would weigh, without building the frames.

The header is checked and packed by encode's own path and unpacked again, so the receiver gets
the body decode would give it (fresh objects, msgpack's types); decode's checks are not run a
second time (they are encode's). The arrays' bytes follow from their layout (dtype and shape),
and each array is copied once into memory of the receiver's own, flagged as decode flags it:
read-only (a view of a received frame), or writable and private when it travels in several
frames (decode joins those into a buffer of its own: frames.is_private). tests/test_handover.py
checks, on every message kind, that the header is the encoder's byte for byte, the payload its
frames' size, and the message the receiver gets decode's.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from fednet.errors import ProtocolError
from fednet.protocol.codec import (DEFAULT_LIMITS, Limits, Message, MsgKind, check_total,
                                   checked_envelope, packed_header, unpacked, wire_entry)
from fednet.protocol.frames import mark_private
from fednet.protocol.kinds import CHUNK_BYTES


def _header(msg: Message, limits: Limits
            ) -> tuple[MsgKind, bytes, list[list[Any]], list[np.ndarray], int]:
    """(kind, the header frame encode() would send, its array entries, each array as it would
    travel (contiguous, little-endian: the sender's own memory when it already is), the payload
    bytes), every limit checked as encode checks it."""
    kind, body, sim_time = checked_envelope(msg)
    if len(msg.arrays) > limits.max_arrays:
        raise ProtocolError(f"{len(msg.arrays)} arrays, limit is {limits.max_arrays}")
    entries: list[list[Any]] = []
    flats: list[np.ndarray] = []
    for name, arr in msg.arrays.items():
        entry, flat = wire_entry(name, arr, limits)
        entries.append(entry)
        flats.append(flat)
    header = packed_header(kind, msg, body, sim_time, entries, limits)
    payload = sum(f.nbytes for f in flats)
    check_total(len(header) + payload, limits)
    return kind, header, entries, flats, payload


def sizes(msg: Message, limits: Limits = DEFAULT_LIMITS) -> tuple[int, int]:
    """(header bytes, payload bytes) of encode(msg)'s frames (frame_bytes), nothing copied."""
    _, header, _, _, payload = _header(msg, limits)
    return len(header), payload


def handover(msg: Message, limits: Limits = DEFAULT_LIMITS) -> tuple[Message, int, int]:
    """(the message as decode(encode(msg)) gives it to a receiver, header bytes, payload
    bytes); the same ProtocolError as encode for a message it refuses."""
    kind, header, entries, flats, payload = _header(msg, limits)
    fields, body = unpacked(header)
    arrays = {name: _received(flat, shape) for (name, _, shape), flat in zip(entries, flats)}
    return Message(kind, *fields, body, arrays), len(header), payload


def _received(flat: np.ndarray, shape: list[int]) -> np.ndarray:
    """The receiver's copy of one array, flagged as decode flags it."""
    out = flat.copy()
    if out.ndim != len(shape):  # a 0-d array travels as one element
        out = out.reshape(shape)
    if out.nbytes > CHUNK_BYTES:  # more than one frame: decode joins it into its own buffer
        mark_private(out)
    else:
        out.flags.writeable = False
    return out
