"""Raw frames: byte views without copies, and their sizes (what the ledger counts)."""
from __future__ import annotations

import weakref
from typing import Any, Sequence

from fednet.errors import ProtocolError


def as_bytes(frame: Any) -> memoryview:
    """Return a flat byte memoryview over ``frame`` without copying."""
    try:
        if isinstance(frame, memoryview):
            mv = frame
        elif isinstance(frame, (bytes, bytearray)):
            mv = memoryview(frame)
        elif hasattr(frame, "buffer"):
            mv = memoryview(frame.buffer)
        else:
            mv = memoryview(frame)
    except TypeError as exc:
        raise ProtocolError(f"frame of type {type(frame).__name__} is not a buffer") from exc
    if not mv.c_contiguous:
        raise ProtocolError("frame buffer is not contiguous")
    if mv.ndim != 1 or mv.format != "B":
        try:
            mv = mv.cast("B")
        except (TypeError, ValueError) as exc:
            raise ProtocolError(f"frame buffer cannot be viewed as bytes: {exc}") from exc
    return mv


def nbytes(frame: Any) -> int:
    """Length of one frame in bytes."""
    if isinstance(frame, (bytes, bytearray)):
        return len(frame)
    if isinstance(frame, memoryview):
        return frame.nbytes
    if hasattr(frame, "buffer"):
        return memoryview(frame.buffer).nbytes
    return memoryview(frame).nbytes


def frame_bytes(frames: Sequence[Any]) -> tuple[int, int]:
    """Return ``(header_bytes, payload_bytes)`` for a frame list."""
    frames = list(frames)
    if not frames:
        return 0, 0
    return nbytes(frames[0]), sum(nbytes(f) for f in frames[1:])


# Arrays that decode joined from several frames into a buffer of their own: nothing else refers
# to that memory, so the receiver may take it over (models.params.adopt_arrays) instead of
# copying it once more. Keyed by id, holding the array weakly: an entry goes with its array.
_PRIVATE: "weakref.WeakValueDictionary[int, Any]" = weakref.WeakValueDictionary()


def mark_private(arr: object) -> None:
    """Record that `arr` owns memory no one else refers to (decode's joined arrays)."""
    _PRIVATE[id(arr)] = arr


def is_private(arr: object) -> bool:
    """True for an array decode joined into its own buffer (and that still exists)."""
    return _PRIVATE.get(id(arr)) is arr
