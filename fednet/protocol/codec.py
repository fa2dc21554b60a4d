"""Encode and decode messages as ``[header, buf_0, ..., buf_k]`` frames (no pickle, no copies)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import msgpack
import numpy as np

from fednet.errors import ProtocolError
from fednet.protocol import schema as S
from fednet.protocol.frames import as_bytes, mark_private
from fednet.protocol.kinds import ALLOWED_DTYPES, CHUNK_BYTES, PROTOCOL_VERSION, MsgKind

_WIRE_DTYPES: dict[str, np.dtype] = {
    name: np.dtype(name).newbyteorder("<") for name in ALLOWED_DTYPES
}


@dataclass(eq=False)
class Message:
    """One protocol message: routing fields, a msgpack body and named numpy arrays."""

    kind: MsgKind
    sender: str
    run_id: str = ""
    round: int = -1
    task_id: int = -1
    sim_time: float = 0.0
    body: dict[str, Any] = field(default_factory=dict)
    arrays: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass(frozen=True)
class Limits:
    """Size caps enforced by encode and decode."""

    max_header_bytes: int = 1 << 20
    max_arrays: int = 4096
    max_ndim: int = 8
    max_array_bytes: int = 1 << 31
    max_message_bytes: int = (1 << 31) - 1


DEFAULT_LIMITS = Limits()
"""The limits used when none are given."""


_HEADER_KEYS = frozenset({S.K_VERSION, S.K_KIND, S.K_SENDER, S.K_RUN_ID, S.K_ROUND, S.K_TASK_ID,
                          S.K_SIM_TIME, S.K_BODY, S.K_ARRAYS})


class _ExtTypeSeen(Exception):
    """Raised by the ext hook; converted to ProtocolError by decode."""


def _reject_ext(code: int, data: bytes) -> Any:
    raise _ExtTypeSeen(f"msgpack ext type {code} is not allowed")


_NAMES: dict[np.dtype, str | None] = {}  # dtype -> its wire name (None: not allowed)


def _wire_name(dtype: np.dtype) -> str | None:
    """The dtype's name when it may travel, else None (dtype.name costs microseconds: cached)."""
    try:
        return _NAMES[dtype]
    except KeyError:
        ok = dtype.name in ALLOWED_DTYPES and dtype.fields is None
        name = _NAMES[dtype] = dtype.name if ok else None
        return name


def wire_entry(name: Any, arr: Any, limits: Limits) -> tuple[list[Any], np.ndarray]:
    """The header entry of one array and the array as it travels (C order, little-endian;
    no copy when it already is), checked against the limits."""
    if not isinstance(name, str):
        raise ProtocolError(f"array name must be a str, got {type(name).__name__}")
    if not isinstance(arr, np.ndarray):
        try:
            arr = np.asarray(arr)
        except Exception as exc:  # noqa: BLE001 - any conversion failure is a protocol error
            raise ProtocolError(f"array {name!r} cannot be converted to numpy: {exc}") from exc
    dname = _wire_name(arr.dtype)
    if dname is None:
        raise ProtocolError(f"array {name!r}: dtype {arr.dtype.str!r} is not allowed")
    if arr.ndim > limits.max_ndim:
        raise ProtocolError(f"array {name!r}: {arr.ndim} dimensions, limit is {limits.max_ndim}")
    if arr.nbytes > limits.max_array_bytes:
        raise ProtocolError(
            f"array {name!r}: {arr.nbytes} bytes, limit is {limits.max_array_bytes}"
        )
    return [name, dname, list(arr.shape)], np.ascontiguousarray(arr, dtype=_WIRE_DTYPES[dname])


def _wire_array(name: Any, arr: Any, limits: Limits) -> tuple[list[Any], memoryview]:
    """Return the header entry and the zero-copy byte view for one array."""
    entry, flat = wire_entry(name, arr, limits)
    view = memoryview(flat.reshape(-1).view(np.uint8))  # type: ignore[arg-type]  # numpy is a buffer
    return entry, view


def checked_envelope(msg: Message, check: bool = True) -> tuple[MsgKind, Any, Any]:
    """(kind, body, sim_time) of `msg` as encode packs them, checked against the schema as the
    decoder will check them (check=False: only the kind and the arrays' container)."""
    try:
        kind = MsgKind(msg.kind)
    except (ValueError, TypeError) as exc:
        raise ProtocolError(f"unknown message kind {msg.kind!r}") from exc
    if not isinstance(msg.arrays, dict):
        raise ProtocolError(f"arrays must be a dict, got {type(msg.arrays).__name__}")
    if not check:
        return kind, msg.body, msg.sim_time
    S.check_str(msg.sender, "sender", S.SENDER)
    S.check_str(msg.run_id, "run_id", S.RUN_ID)
    S.check_int(msg.round, "round", S.ROUND)
    S.check_int(msg.task_id, "task_id", S.TASK_ID)
    sim_time = S.check_time(msg.sim_time, "sim_time")
    return kind, S.check_message(kind, msg.body, len(msg.arrays)), sim_time


def encode(msg: Message, limits: Limits = DEFAULT_LIMITS, check: bool = True
           ) -> list[bytes | memoryview]:
    """Encode ``msg`` as ``[header, buf_0, ..., buf_k]``; C-contiguous arrays are not copied.

    The message is checked against the schema as the decoder will check it (``check=False``
    only for tests that build wrong messages on purpose)."""
    kind, body, sim_time = checked_envelope(msg, check)
    if len(msg.arrays) > limits.max_arrays:
        raise ProtocolError(f"{len(msg.arrays)} arrays, limit is {limits.max_arrays}")
    entries: list[list[Any]] = []
    bufs: list[memoryview] = []
    for name, arr in msg.arrays.items():
        entry, view = _wire_array(name, arr, limits)
        entries.append(entry)
        if view.nbytes <= CHUNK_BYTES:
            bufs.append(view)
        else:  # zero-copy slices: heartbeats interleave between frames of a long transfer
            bufs.extend(view[j:j + CHUNK_BYTES] for j in range(0, view.nbytes, CHUNK_BYTES))
    header = packed_header(kind, msg, body, sim_time, entries, limits)
    check_total(len(header) + sum(b.nbytes for b in bufs), limits)
    return [header, *bufs]


def packed_header(kind: MsgKind, msg: Message, body: Any, sim_time: Any,
                  entries: list[list[Any]], limits: Limits) -> bytes:
    """The header frame, within the limit on header bytes."""
    header = _pack_header(kind, msg, body, sim_time, entries)
    if len(header) > limits.max_header_bytes:
        raise ProtocolError(
            f"header is {len(header)} bytes, limit is {limits.max_header_bytes}"
        )
    return header


def check_total(total: int, limits: Limits) -> None:
    """A whole message's bytes within the limit."""
    if total > limits.max_message_bytes:
        raise ProtocolError(f"message is {total} bytes, limit is {limits.max_message_bytes}")


def _pack_header(kind: MsgKind, msg: Message, body: Any, sim_time: Any,
                 entries: list[list[Any]]) -> bytes:
    header_map = {
        S.K_VERSION: PROTOCOL_VERSION,
        S.K_KIND: int(kind),
        S.K_SENDER: msg.sender,
        S.K_RUN_ID: msg.run_id,
        S.K_ROUND: msg.round,
        S.K_TASK_ID: msg.task_id,
        S.K_SIM_TIME: sim_time,  # a Python float is always packed as float64
        S.K_BODY: body,
        S.K_ARRAYS: entries,
    }
    try:
        return msgpack.packb(header_map, use_bin_type=True, use_single_float=False)
    except (TypeError, ValueError, OverflowError) as exc:
        raise ProtocolError(f"body cannot be packed: {exc}") from exc


def encoded_sizes(msg: Message, layout: dict[str, tuple[tuple[int, ...], Any]]
                  ) -> tuple[int, int]:
    """(header, payload) bytes that `msg` weighs with arrays of `layout` (name -> (shape,
    dtype)) in place of its own, none of them allocated: what encode() would give (the server
    counts messages it does not see, peers' hand-offs, this way)."""
    entries: list[list[Any]] = []
    payload = 0
    for name, (shape, dtype) in layout.items():
        dname = np.dtype(dtype).name
        entries.append([name, dname, [int(d) for d in shape]])
        payload += math.prod(int(d) for d in shape) * _WIRE_DTYPES[dname].itemsize
    header = _pack_header(MsgKind(msg.kind), msg, msg.body, float(msg.sim_time), entries)
    return len(header), payload


def _chunks(nbytes: int) -> int:
    """Frames that carry an array of nbytes: CHUNK_BYTES each, the last one the rest."""
    return max(1, -(-nbytes // CHUNK_BYTES))


def _unpack_header(buf: memoryview) -> dict[Any, Any]:
    """Unpack the header frame defensively; any failure is a ProtocolError."""
    n = buf.nbytes
    try:
        header = msgpack.unpackb(
            buf,
            raw=False,
            strict_map_key=True,
            use_list=True,
            ext_hook=_reject_ext,
            max_str_len=n,
            max_bin_len=n,
            max_array_len=n,
            max_map_len=n // 2,
            max_ext_len=0,
        )
    except _ExtTypeSeen as exc:
        raise ProtocolError(str(exc)) from None
    except Exception as exc:  # noqa: BLE001 - msgpack raises several unrelated types
        raise ProtocolError(f"header is not valid msgpack: {type(exc).__name__}: {exc}") from None
    if not isinstance(header, dict):
        raise ProtocolError(f"header must be a msgpack map, got {type(header).__name__}")
    return header


def _field(header: dict[Any, Any], key: str) -> Any:
    if key not in header:
        raise ProtocolError(f"header field {key!r} is missing")
    return header[key]


def decode(frames: Sequence[Any], limits: Limits = DEFAULT_LIMITS, release: bool = False
           ) -> Message:
    """Decode frames produced by :func:`encode`; arrays are zero-copy views of the frames.

    An array that came in several frames is joined once into its own buffer (marked private:
    frames.is_private). With release=True and a list of frames, decode drops each of those
    frames from the list once it is joined, so the message is not held twice in memory (the
    caller keeps the list's other frames, the header included)."""
    if not (release and isinstance(frames, list)):
        try:
            frames = list(frames)
        except TypeError as exc:
            raise ProtocolError(f"frames must be a sequence, got {type(frames).__name__}") from exc
    if not frames:
        raise ProtocolError("message has no frames")
    hbuf = as_bytes(frames[0])
    if hbuf.nbytes > limits.max_header_bytes:
        raise ProtocolError(
            f"header is {hbuf.nbytes} bytes, limit is {limits.max_header_bytes}"
        )
    header = _unpack_header(hbuf)
    kind, fields = _envelope(header)
    entries = _field(header, S.K_ARRAYS)
    if not isinstance(entries, list):
        raise ProtocolError(f"header field {S.K_ARRAYS!r} must be a list")
    if len(entries) > limits.max_arrays:
        raise ProtocolError(f"{len(entries)} arrays, limit is {limits.max_arrays}")
    unknown = set(header) - _HEADER_KEYS
    if unknown:
        raise ProtocolError(f"unexpected header fields {sorted(map(str, unknown))[:5]}")
    body = S.check_message(kind, _field(header, S.K_BODY), len(entries))
    specs = _specs(entries, limits)
    check_total(hbuf.nbytes + sum(nbytes for *_, nbytes in specs), limits)
    counts = [_chunks(nbytes) for *_, nbytes in specs]
    _check_frames(frames, specs, counts)
    return Message(kind, *fields, body, _arrays(frames, specs, counts, release))


def unpacked(header: bytes) -> tuple[tuple[str, str, int, int, float], Any]:
    """The routing fields (sender, run id, round, task id, sim time) and the body of a header
    that encode's own path packed here (checked_envelope, then packed_header): what decode
    reads from it. Its checks are not run again: they are encode's, and msgpack gives back
    values of the types they accept."""
    h = _unpack_header(memoryview(header))
    return (h[S.K_SENDER], h[S.K_RUN_ID], h[S.K_ROUND], h[S.K_TASK_ID], h[S.K_SIM_TIME]), \
        h[S.K_BODY]


def _envelope(header: dict[Any, Any]) -> tuple[MsgKind, tuple[str, str, int, int, float]]:
    """The header's version (checked), kind, and (sender, run id, round, task id, sim time)."""
    version = S.check_int(_field(header, S.K_VERSION), S.K_VERSION)
    if version != PROTOCOL_VERSION:
        raise ProtocolError(
            f"unsupported protocol version {version} (expected {PROTOCOL_VERSION})"
        )
    kind_no = S.check_int(_field(header, S.K_KIND), S.K_KIND)
    try:
        kind = MsgKind(kind_no)
    except ValueError:
        raise ProtocolError(f"unknown message kind {kind_no}") from None
    sender = S.check_str(_field(header, S.K_SENDER), S.K_SENDER, S.SENDER)
    run_id = S.check_str(_field(header, S.K_RUN_ID), S.K_RUN_ID, S.RUN_ID)
    rnd = S.check_int(_field(header, S.K_ROUND), S.K_ROUND, S.ROUND)
    task_id = S.check_int(_field(header, S.K_TASK_ID), S.K_TASK_ID, S.TASK_ID)
    sim_time = S.check_time(_field(header, S.K_SIM_TIME), S.K_SIM_TIME)
    return kind, (sender, run_id, rnd, task_id, sim_time)


def _specs(entries: list[Any], limits: Limits) -> list[tuple[str, np.dtype, tuple[int, ...], int]]:
    """(name, dtype, shape, bytes) of each array entry, every one checked against the limits."""
    specs: list[tuple[str, np.dtype, tuple[int, ...], int]] = []
    seen: set[str] = set()
    for i, entry in enumerate(entries):
        if not isinstance(entry, list) or len(entry) != 3:
            raise ProtocolError(f"array entry {i} must be [name, dtype, shape]")
        name, dname, shape = entry
        if not isinstance(name, str):
            raise ProtocolError(f"array entry {i}: name must be a str")
        if name in seen:
            raise ProtocolError(f"duplicate array name {name!r}")
        seen.add(name)
        if not isinstance(dname, str) or dname not in ALLOWED_DTYPES:
            raise ProtocolError(f"array {name!r}: dtype {dname!r} is not allowed")
        dtype = _WIRE_DTYPES[dname]
        dims = S.check_shape(shape, name, limits.max_ndim)
        nbytes = math.prod(dims) * dtype.itemsize  # exact Python int: no overflow
        if nbytes > limits.max_array_bytes:
            raise ProtocolError(
                f"array {name!r}: {nbytes} bytes, limit is {limits.max_array_bytes}"
            )
        specs.append((name, dtype, dims, nbytes))
    return specs


def _check_frames(frames: Sequence[Any], specs: list[tuple[str, np.dtype, tuple[int, ...], int]],
                  counts: list[int]) -> None:
    """Every array frame has the size its spec says (all checked before any join)."""
    if len(frames) - 1 != sum(counts):
        raise ProtocolError(f"header lists {len(specs)} arrays in {sum(counts)} frames but "
                            f"{len(frames) - 1} array frames arrived")
    i = 1
    for (name, _, dims, nbytes), k in zip(specs, counts):
        for j in range(k):
            got = as_bytes(frames[i + j]).nbytes
            want = min(CHUNK_BYTES, nbytes - j * CHUNK_BYTES) if nbytes else 0
            if got != want:
                raise ProtocolError(f"array {name!r}: shape {list(dims)} needs {nbytes} bytes "
                                    f"in {k} frame(s); frame {j} has {got}")
        i += k


def _arrays(frames: list[Any], specs: list[tuple[str, np.dtype, tuple[int, ...], int]],
            counts: list[int], release: bool) -> dict[str, np.ndarray]:
    """The arrays: a view of its frame, or (several frames) joined once into a private buffer."""
    arrays: dict[str, np.ndarray] = {}
    i = 1
    for (name, dtype, dims, nbytes), k in zip(specs, counts):
        if k == 1:  # the common case: a view of the frame, no copy
            arrays[name] = np.frombuffer(as_bytes(frames[i]), dtype=dtype).reshape(dims)
        else:  # a large array arrives in chunks: joined once, into its own buffer
            joined = np.empty(nbytes, dtype=np.uint8)
            for j in range(k):
                part = as_bytes(frames[i + j])
                joined[j * CHUNK_BYTES:j * CHUNK_BYTES + part.nbytes] = np.frombuffer(part, np.uint8)
                if release:
                    del part
                    frames[i + j] = None  # this frame's memory goes now, not with the message
            arr = joined.view(dtype).reshape(dims)
            mark_private(arr)
            arrays[name] = arr
        i += k
    return arrays


def peek_kind(frames: Sequence[Any], limits: Limits = DEFAULT_LIMITS) -> MsgKind | None:
    """The kind a message's header names, nothing else checked (decode checks everything);
    None when the header cannot be read."""
    return peek(frames, limits)[0]


def peek(frames: Sequence[Any], limits: Limits = DEFAULT_LIMITS) -> tuple[MsgKind | None, int | None]:
    """(kind, task id) as a message's header names them, nothing else checked (decode checks
    everything); None for what the header does not hold or cannot be read."""
    try:
        hbuf = as_bytes(frames[0])
        if hbuf.nbytes > limits.max_header_bytes:
            return None, None
        h = _unpack_header(hbuf)
        kind, tid = h.get(S.K_KIND), h.get(S.K_TASK_ID)
        return (MsgKind(kind) if isinstance(kind, int) else None,
                tid if isinstance(tid, int) and not isinstance(tid, bool) else None)
    except (ProtocolError, ValueError, TypeError, IndexError):
        return None, None


def stage_of(msg: Message) -> str:
    """The stage of a staged protocol a TASK, HANDOFF or RESULT belongs to (its `stage` field,
    set by the strategy that runs the protocol), '' for others: what the ledger files its bytes
    under beside their direction."""
    if msg.kind not in (MsgKind.TASK, MsgKind.RESULT, MsgKind.HANDOFF):
        return ""
    stage = msg.body.get("stage", "") if isinstance(msg.body, dict) else ""
    return stage if isinstance(stage, str) else ""


def tensor_bytes(msg: Message) -> int:
    """Return the total number of array bytes in ``msg``."""
    return sum(int(np.asarray(a).nbytes) for a in msg.arrays.values())
