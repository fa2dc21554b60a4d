"""Tests for fednet.protocol: round trips, zero-copy behaviour, byte accounting and rejection."""
from __future__ import annotations

import time
from typing import Any

import msgpack  # only to craft hostile headers by hand
import numpy as np
import pytest

from fednet.protocol import (
    DEFAULT_LIMITS,
    PROTOCOL_VERSION,
    Limits,
    Message,
    MsgKind,
    ProtocolError,
    decode,
    encode,
    frame_bytes,
    tensor_bytes,
)
from fednet.protocol.kinds import ALLOWED_DTYPES
from tests.schema_examples import msg as M
from tests.schema_examples import valid_body
from fednet.protocol.schema import WITH_ARRAYS

# ---------------------------------------------------------------- helpers


def _sample_arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "w": rng.standard_normal((3, 4)).astype(np.float32),
        "b": np.arange(5, dtype=np.int64),
        "mask": np.array([True, False, True]),
        "scalar": np.array(2.5, dtype=np.float64),
        "empty": np.zeros((0, 7), dtype=np.float16),
    }


def _msg(**kw: Any) -> Message:
    base: dict[str, Any] = dict(
        kind=MsgKind.TASK,
        sender="server",
        run_id="run-1",
        round=3,
        task_id=17,
        sim_time=12.5,
        body=valid_body(MsgKind.TASK),
        arrays=_sample_arrays(),
    )
    base.update(kw)
    if "kind" in kw and "body" not in kw and kw["kind"] in set(MsgKind):
        base["body"] = valid_body(kw["kind"])
    return Message(**base)


def _assert_same(a: Message, b: Message) -> None:
    assert a.kind == b.kind and isinstance(b.kind, MsgKind)
    assert (a.sender, a.run_id, a.round, a.task_id) == (b.sender, b.run_id, b.round, b.task_id)
    assert float(a.sim_time) == b.sim_time
    assert a.body == b.body
    assert list(a.arrays) == list(b.arrays)
    for name, arr in a.arrays.items():
        got = b.arrays[name]
        assert got.dtype == arr.dtype, name
        assert got.shape == arr.shape, name
        np.testing.assert_array_equal(got, arr)


def _header_map(msg: Message | None = None) -> dict[str, Any]:
    return msgpack.unpackb(encode(msg or _msg())[0], raw=False)


def _frames_with(header: Any, msg: Message | None = None) -> list[Any]:
    frames = encode(msg or _msg())
    return [msgpack.packb(header, use_bin_type=True), *frames[1:]]


def _reject(frames: Any, match: str | None = None, limits: Limits = DEFAULT_LIMITS) -> None:
    with pytest.raises(ProtocolError, match=match):
        decode(frames, limits)


def _base_ptr(buf: Any) -> int:
    return np.frombuffer(buf, dtype=np.uint8).__array_interface__["data"][0]


# ---------------------------------------------------------------- round trips


@pytest.mark.parametrize("kind", sorted(WITH_ARRAYS))
def test_round_trip_every_kind_with_arrays(kind: MsgKind) -> None:
    msg = _msg(kind=kind)
    _assert_same(msg, decode(encode(msg)))


@pytest.mark.parametrize("kind", sorted(set(MsgKind) - WITH_ARRAYS))
def test_kinds_without_arrays_refuse_arrays(kind: MsgKind) -> None:
    with pytest.raises(ProtocolError, match="carries no arrays"):
        encode(_msg(kind=kind))
    frames = encode(_msg(kind=kind), check=False)
    _reject(frames, "carries no arrays")


@pytest.mark.parametrize("kind", list(MsgKind))
def test_round_trip_every_kind_without_arrays(kind: MsgKind) -> None:
    msg = M(kind=kind, sender="c0007")
    frames = encode(msg)
    assert len(frames) == 1
    out = decode(frames)
    _assert_same(msg, out)
    assert out.run_id == "" and out.round == -1 and out.task_id == -1 and out.sim_time == 0.0


@pytest.mark.parametrize("dtype", sorted(ALLOWED_DTYPES))
def test_round_trip_every_allowed_dtype(dtype: str) -> None:
    arr = (np.arange(24) % 7).astype(dtype).reshape(2, 3, 4)
    msg = M(MsgKind.RESULT, "c0001", arrays={"x": arr})
    _assert_same(msg, decode(encode(msg)))


def test_round_trip_zero_d_and_empty_arrays() -> None:
    arrays = {
        "zero_d": np.array(7, dtype=np.int32),
        "empty_1d": np.array([], dtype=np.float32),
        "empty_2d": np.zeros((4, 0), dtype=np.uint8),
        "zero_d_bool": np.array(True),
    }
    msg = M(MsgKind.RESULT, "c0001", arrays=arrays)
    frames = encode(msg)
    assert [len(memoryview(f)) for f in frames[1:]] == [4, 0, 0, 1]
    _assert_same(msg, decode(frames))


def test_round_trip_non_contiguous_input_arrays() -> None:
    base = np.arange(60, dtype=np.float64).reshape(6, 10)
    arrays = {"t": base.T, "s": base[::2, 1::3], "f": np.asfortranarray(base)}
    msg = M(MsgKind.HANDOFF, "c0002", arrays=arrays)
    _assert_same(msg, decode(encode(msg)))


def test_round_trip_big_endian_input_is_sent_little_endian() -> None:
    arr = np.arange(6, dtype=">i4").reshape(2, 3)
    out = decode(encode(M(MsgKind.RESULT, "c1", arrays={"x": arr})))
    assert out.arrays["x"].dtype == np.dtype("<i4")
    np.testing.assert_array_equal(out.arrays["x"], arr)


def test_round_trip_body_nested_values() -> None:
    body = {
        "none": None,
        "flags": [True, False],
        "f": -1.25e-7,
        "i": -(2**40),
        "blob": b"\x00\xffraw",
        "text": "héllo",
        "nested": {"a": [1, [2, {"b": None}]], "c": {"d": {"e": 1.5}}},
        "empty": {},
        "lst": [],
    }
    outer = dict(valid_body(MsgKind.TASK), body=body)
    out = decode(encode(Message(MsgKind.TASK, "server", body=outer)))
    assert out.body["body"] == body
    assert isinstance(out.body["body"]["blob"], bytes)


def test_round_trip_tuples_become_lists() -> None:
    body = {"n": 1, "body": {"t": (1, (2, 3))}}
    out = decode(encode(Message(MsgKind.RESULT, "c0000", body=body)))
    assert out.body["body"] == {"t": [1, [2, 3]]}


def test_round_trip_preserves_array_order() -> None:
    names = [f"layer{i}.weight" for i in (5, 1, 9, 0, 3)]
    arrays = {n: np.full((2,), i, dtype=np.float32) for i, n in enumerate(names)}
    out = decode(encode(M(MsgKind.RESULT, "c3", arrays=arrays)))
    assert list(out.arrays) == names


def test_round_trip_accepts_int_kind_and_int_sim_time() -> None:
    out = decode(encode(M(4, "c9", sim_time=3)))  # type: ignore[arg-type]
    assert out.kind is MsgKind.RESULT and out.sim_time == 3.0 and isinstance(out.sim_time, float)


class _FakeZmqFrame:
    """Stands in for zmq.Frame received with copy=False (exposes .buffer and .bytes)."""

    def __init__(self, data: Any) -> None:
        self.buffer = memoryview(data)
        self.bytes = bytes(data)


@pytest.mark.parametrize("wrap", ["bytes", "bytearray", "memoryview", "buffer_attr", "ndarray"])
def test_decode_accepts_frame_types(wrap: str) -> None:
    msg = _msg()
    raw = [bytes(memoryview(f)) for f in encode(msg)]
    conv = {
        "bytes": lambda b: b,
        "bytearray": bytearray,
        "memoryview": memoryview,
        "buffer_attr": _FakeZmqFrame,
        "ndarray": lambda b: np.frombuffer(b, dtype=np.uint8),
    }[wrap]
    _assert_same(msg, decode([conv(b) for b in raw]))


# ---------------------------------------------------------------- zero copy


@pytest.mark.parametrize("wrap", [bytes, bytearray, memoryview])
def test_decode_does_not_copy(wrap: Any) -> None:
    msg = _msg()
    frames = [wrap(bytes(memoryview(f))) for f in encode(msg)]
    out = decode(frames)
    for (name, arr), frame in zip(out.arrays.items(), frames[1:]):
        if arr.nbytes == 0:
            continue
        owner = np.frombuffer(frame, dtype=np.uint8)
        assert np.shares_memory(arr, owner), name
        assert arr.__array_interface__["data"][0] == _base_ptr(frame), name


def test_decode_does_not_copy_buffer_attr_frames() -> None:
    raw = [bytearray(memoryview(f)) for f in encode(_msg())]
    out = decode([_FakeZmqFrame(b) for b in raw])
    assert np.shares_memory(out.arrays["w"], np.frombuffer(raw[1], dtype=np.uint8))


def test_encode_does_not_copy_contiguous_array() -> None:
    arr = np.arange(1000, dtype=np.float32).reshape(10, 100)
    frames = encode(M(MsgKind.RESULT, "c1", arrays={"x": arr}))
    view = frames[1]
    assert isinstance(view, memoryview) and view.nbytes == arr.nbytes
    assert np.shares_memory(np.frombuffer(view, dtype=np.uint8), arr)
    arr[0, 0] = 42.0  # the frame is a live view
    assert np.frombuffer(view, dtype=np.float32)[0] == 42.0


def test_encode_copies_non_contiguous_array_into_c_order() -> None:
    arr = np.arange(12, dtype=np.int16).reshape(3, 4).T
    frames = encode(M(MsgKind.RESULT, "c1", arrays={"x": arr}))
    assert bytes(frames[1]) == np.ascontiguousarray(arr).tobytes()


def test_decode_then_encode_forwards_without_copy() -> None:
    raw = [bytes(memoryview(f)) for f in encode(_msg())]
    again = encode(decode(raw))
    sent = np.frombuffer(again[1], dtype=np.uint8)
    assert np.shares_memory(sent, np.frombuffer(raw[1], dtype=np.uint8))


# ---------------------------------------------------------------- byte accounting


def test_header_length_independent_of_sim_time_and_array_values() -> None:
    lengths = set()
    rng = np.random.default_rng(1)
    for sim_time in (0.0, 1.0, 1e-300, 123456789.125, 3.0, 0, 7):
        arrays = {
            k: rng.integers(0, 100, size=v.shape).astype(v.dtype)
            for k, v in _sample_arrays().items()
        }
        frames = encode(_msg(sim_time=sim_time, arrays=arrays))
        lengths.add(len(frames[0]))
    assert len(lengths) == 1


def test_header_length_depends_only_on_layout() -> None:
    a = encode(_msg(arrays={"x": np.zeros((4, 4), np.float32)}))
    b = encode(_msg(arrays={"x": np.full((4, 4), np.pi, np.float32)}))
    assert len(a[0]) == len(b[0])
    assert a[0] == b[0]  # identical header bytes, values only live in payload frames


def test_frame_bytes_and_tensor_bytes() -> None:
    msg = _msg()
    frames = encode(msg)
    hdr, payload = frame_bytes(frames)
    assert hdr == len(frames[0])
    assert payload == tensor_bytes(msg) == sum(a.nbytes for a in msg.arrays.values())
    assert frame_bytes([bytes(memoryview(f)) for f in frames]) == (hdr, payload)
    assert frame_bytes([_FakeZmqFrame(bytes(memoryview(f))) for f in frames]) == (hdr, payload)
    assert frame_bytes([]) == (0, 0)
    assert tensor_bytes(M(MsgKind.BYE, "c0")) == 0


# ---------------------------------------------------------------- encode rejections


@pytest.mark.parametrize(
    "arr",
    [
        np.array([object(), 1], dtype=object),
        np.array(["ab", "cd"]),
        np.zeros(2, dtype="V8"),
        np.zeros(2, dtype=[("a", "<f4")]),
        np.zeros(2, dtype=np.complex64),
        np.zeros(2, dtype=np.int8).view("S1"),  # bytes strings: not numbers
        np.array(["2020-01-01"], dtype="datetime64[D]"),
    ],
)
def test_encode_rejects_bad_dtype(arr: np.ndarray) -> None:
    with pytest.raises(ProtocolError, match="dtype"):
        encode(M(MsgKind.RESULT, "c1", arrays={"x": arr}))


@pytest.mark.parametrize("body", [{1: "x"}, {"ok": {b"k": 1}}, {"ok": [{None: 1}]}])
def test_encode_rejects_non_str_body_keys(body: Any) -> None:
    with pytest.raises(ProtocolError, match="key"):
        encode(Message(MsgKind.TASK, "server", body=dict(valid_body(MsgKind.TASK), body=body)))


@pytest.mark.parametrize("value", [object(), np.int64(3), {1, 2}, 2**70, np.zeros(2)])
def test_encode_rejects_unpackable_body_values(value: Any) -> None:
    with pytest.raises(ProtocolError):
        encode(Message(MsgKind.TASK, "server", body={"v": [value]}))


def test_encode_rejects_body_that_is_not_a_dict() -> None:
    with pytest.raises(ProtocolError):
        encode(Message(MsgKind.TASK, "server", body=[1, 2]))  # type: ignore[arg-type]


def test_encode_rejects_too_many_arrays() -> None:
    arrays = {f"a{i}": np.zeros(1, np.float32) for i in range(5)}
    with pytest.raises(ProtocolError, match="arrays"):
        encode(M(MsgKind.RESULT, "c1", arrays=arrays), Limits(max_arrays=4))


def test_encode_rejects_header_over_cap() -> None:
    with pytest.raises(ProtocolError, match="header"):
        msg = Message(MsgKind.TASK, "server",
                      body=dict(valid_body(MsgKind.TASK), body={"s": "x" * 4000}))
        encode(msg, Limits(max_header_bytes=1024))


def test_encode_rejects_array_and_message_size_limits() -> None:
    arr = np.zeros(1000, np.float64)
    with pytest.raises(ProtocolError):
        encode(M(MsgKind.RESULT, "c1", arrays={"x": arr}), Limits(max_array_bytes=100))
    with pytest.raises(ProtocolError):
        encode(M(MsgKind.RESULT, "c1", arrays={"x": arr}), Limits(max_message_bytes=4000))
    with pytest.raises(ProtocolError):
        encode(M(MsgKind.RESULT, "c1", arrays={"x": arr.reshape((1,) * 9 + (1000,))}))


@pytest.mark.parametrize(
    "kw",
    [
        {"kind": 99},
        {"sender": 5},
        {"run_id": None},
        {"round": 1.5},
        {"task_id": True},
        {"sim_time": float("nan")},
        {"sim_time": "soon"},
        {"arrays": {1: np.zeros(1)}},
    ],
)
def test_encode_rejects_bad_fields(kw: dict[str, Any]) -> None:
    with pytest.raises(ProtocolError):
        encode(_msg(**kw))


# ---------------------------------------------------------------- decode rejections


def test_decode_rejects_no_frames() -> None:
    _reject([], "no frames")


def test_decode_rejects_non_buffer_frames() -> None:
    _reject(["not bytes"])
    _reject([encode(_msg())[0], 12345, 1, 2, 3, 4])
    _reject(None)


def test_decode_rejects_truncated_header() -> None:
    header = bytes(encode(_msg())[0])
    for cut in (1, len(header) // 2, len(header) - 1):
        _reject([header[:cut]])


def test_decode_rejects_truncated_array_frame() -> None:
    frames = [bytes(memoryview(f)) for f in encode(_msg())]
    frames[1] = frames[1][:-1]
    _reject(frames, "needs")


def test_decode_rejects_wrong_length_buffer() -> None:
    frames = [bytes(memoryview(f)) for f in encode(_msg())]
    frames[2] = frames[2] + b"\x00" * 8
    _reject(frames, "needs")


def test_decode_rejects_extra_frame() -> None:
    _reject([*encode(_msg()), b"extra"], "frames")


def test_decode_rejects_missing_frame() -> None:
    _reject(encode(_msg())[:-1], "frames")


def test_decode_rejects_oversized_header_before_unpacking(monkeypatch: pytest.MonkeyPatch) -> None:
    import fednet.protocol.codec as codec

    def boom(*a: Any, **k: Any) -> Any:
        raise AssertionError("unpackb must not be called")

    monkeypatch.setattr(codec.msgpack, "unpackb", boom)
    garbage = np.random.default_rng(2).integers(0, 256, 2 << 20, dtype=np.uint8).tobytes()
    _reject([garbage], "limit", Limits(max_header_bytes=4096))
    _reject([garbage], "limit")  # 2 MiB is also over the default 1 MiB cap


def test_decode_rejects_wrong_version() -> None:
    h = _header_map()
    h["v"] = PROTOCOL_VERSION + 1
    _reject(_frames_with(h), "version")
    h["v"] = "1"
    _reject(_frames_with(h))
    del h["v"]
    _reject(_frames_with(h), "missing")


@pytest.mark.parametrize("kind", [0, 13, -1, 2**40, "TASK", None, True])
def test_decode_rejects_unknown_kind(kind: Any) -> None:
    h = _header_map()
    h["k"] = kind
    _reject(_frames_with(h))


@pytest.mark.parametrize(
    "dtype", ["object", "O", "<U4", "V8", "garbage!!", "", "float128", "<f4", 5, None]
)
def test_decode_rejects_bad_dtype(dtype: Any) -> None:
    h = _header_map()
    h["a"][0][1] = dtype
    _reject(_frames_with(h), "dtype")


@pytest.mark.parametrize(
    "shape",
    [[-1, 4], [3, -4], [2**62, 2**62], [2**64 - 1], [1.5, 8], "34", [True, 12], None, [[3], 4]],
)
def test_decode_rejects_negative_huge_or_malformed_shape(shape: Any) -> None:
    h = _header_map()
    h["a"][0][2] = shape
    _reject(_frames_with(h))


def test_decode_rejects_ndim_over_limit() -> None:
    h = _header_map()
    h["a"][0][2] = [1] * 9 + [12]
    _reject(_frames_with(h), "dimensions")


@pytest.mark.parametrize(
    "entry",
    [["w", "float32"], "w", None, [1, "float32", [3, 4]], ["w", "float32", [3, 4], 0]],
)
def test_decode_rejects_malformed_array_entry(entry: Any) -> None:
    h = _header_map()
    h["a"][0] = entry
    _reject(_frames_with(h))


def test_decode_rejects_duplicate_array_names() -> None:
    h = _header_map()
    h["a"][1][0] = h["a"][0][0]
    _reject(_frames_with(h), "duplicate")


@pytest.mark.parametrize("header", [[1, 2, 3], 7, "str", None, b"bin", 1.5])
def test_decode_rejects_header_that_is_not_a_map(header: Any) -> None:
    _reject([msgpack.packb(header, use_bin_type=True)], "map")


def test_decode_rejects_non_str_map_keys() -> None:
    raw = msgpack.packb({1: "x", "v": 1}, use_bin_type=True)
    _reject([raw])
    h = _header_map()
    h["b"] = dict(h["b"], **{"body": {b"bytes-key": 1}})
    _reject(_frames_with(h), "key")
    h["b"] = dict(h["b"], **{"body": {"ok": {b"nested": 1}}})
    _reject(_frames_with(h), "key")


@pytest.mark.parametrize(
    "ext",
    [
        msgpack.ExtType(5, b"abc"),
        msgpack.ExtType(42, b""),
        msgpack.Timestamp(1, 0),
        msgpack.Timestamp(2**40, 5),
    ],
)
def test_decode_rejects_msgpack_ext_types(ext: Any) -> None:
    h = _header_map()
    h["b"] = {"x": ext}
    _reject(_frames_with(h))
    h = _header_map()
    h["s"] = ext
    _reject(_frames_with(h))


@pytest.mark.parametrize(
    "field,value",
    [("s", 5), ("run", None), ("rnd", 1.5), ("tid", "x"), ("t", "now"), ("t", float("inf")),
     ("b", [1]), ("a", {}), ("rnd", False)],
)
def test_decode_rejects_wrong_typed_fields(field: str, value: Any) -> None:
    h = _header_map()
    h[field] = value
    _reject(_frames_with(h))


@pytest.mark.parametrize("field", ["k", "s", "run", "rnd", "tid", "t", "b", "a"])
def test_decode_rejects_missing_fields(field: str) -> None:
    h = _header_map()
    del h[field]
    _reject(_frames_with(h), "missing")


def test_decode_rejects_too_many_arrays_and_oversized_message() -> None:
    frames = encode(_msg())
    _reject(frames, "limit", Limits(max_arrays=2))
    _reject(frames, "limit", Limits(max_message_bytes=100))
    _reject(frames, "limit", Limits(max_array_bytes=16))


def test_decode_rejects_trailing_bytes_after_header() -> None:
    frames = encode(_msg())
    _reject([bytes(frames[0]) + b"\x00", *frames[1:]])


def test_decode_rejects_deeply_nested_body() -> None:
    raw = bytes([0x81, 0xA1, ord("b")]) + b"\x91" * 100_000 + b"\xc0"
    _reject([raw])


def test_decode_rejects_huge_declared_lengths() -> None:
    # str32 / array32 / map32 that claim 4 GiB but carry only a few bytes
    for prefix in (b"\xdb", b"\xc6", b"\xdd", b"\xdf"):
        _reject([prefix + b"\xff\xff\xff\xff" + b"abc"])


# ---------------------------------------------------------------- fuzzing


def _decode_or_protocol_error(frames: list[Any]) -> None:
    try:
        out = decode(frames)
    except ProtocolError:
        return
    assert isinstance(out, Message)
    assert sum(a.nbytes for a in out.arrays.values()) == frame_bytes(frames)[1]


def test_fuzz_random_frames_and_mutated_messages() -> None:
    rng = np.random.default_rng(12345)
    start = time.perf_counter()
    # 1) purely random frame lists, some starting with a plausible map marker
    for _ in range(2000):
        frames: list[Any] = []
        for _ in range(int(rng.integers(0, 5))):
            n = int(rng.integers(0, 80))
            frames.append(rng.integers(0, 256, n, dtype=np.uint8).tobytes())
        if frames and rng.random() < 0.5:
            frames[0] = bytes([0x80 | int(rng.integers(0, 16))]) + frames[0]
        _decode_or_protocol_error(frames)
    # 2) mutations of valid messages
    seeds = [
        [bytes(memoryview(f)) for f in encode(m)]
        for m in (
            _msg(),
            M(MsgKind.HEARTBEAT, "c0001"),
            _msg(kind=MsgKind.HANDOFF, body=dict(valid_body(MsgKind.HANDOFF),
                                                 body={"path": ["c1"], "meta": {"y": b"z"}})),
        )
    ]
    for _ in range(3000):
        frames = list(seeds[int(rng.integers(0, len(seeds)))])
        op = int(rng.integers(0, 6))
        header = bytearray(frames[0])
        if op in (0, 1):  # flip 1..4 bytes in the header
            for _ in range(int(rng.integers(1, 5))):
                header[int(rng.integers(0, len(header)))] = int(rng.integers(0, 256))
            frames[0] = bytes(header)
        elif op == 2:  # cut the header
            frames[0] = bytes(header[: int(rng.integers(0, len(header)))])
        elif op == 3 and len(frames) > 1:  # cut an array frame
            i = int(rng.integers(1, len(frames)))
            frames[i] = frames[i][: int(rng.integers(0, len(frames[i]) + 1))]
        elif op == 4:  # drop or add a frame
            if len(frames) > 1 and rng.random() < 0.5:
                del frames[int(rng.integers(1, len(frames)))]
            else:
                extra = rng.bytes(int(rng.integers(0, 16)))
                frames.insert(int(rng.integers(1, len(frames) + 1)), extra)
        else:  # insert random bytes into the header
            pos = int(rng.integers(0, len(header) + 1))
            junk = rng.bytes(int(rng.integers(1, 6)))
            frames[0] = bytes(header[:pos]) + junk + bytes(header[pos:])
        _decode_or_protocol_error(frames)
    # 3) structured mutations: valid msgpack, hostile field values
    pool: list[Any] = [
        None, True, -1, 0, 1, 12, 2**31, 2**63, -(2**63), 1.5, float("nan"), "", "float32",
        "object", "<U4", b"x", [], [0], [-1], [2**62, 2**62], [3, 4], {}, {"k": 1}, {b"k": 1},
        ["w", "float32", [3, 4]], [["w", "float32", [3, 4]]], [["w", "float32"]], [1, 2, 3],
    ]
    header_keys = list(_header_map())
    base_frames = seeds[0]
    for _ in range(2000):
        h = msgpack.unpackb(base_frames[0], raw=False)
        for _ in range(int(rng.integers(1, 3))):
            value = pool[int(rng.integers(0, len(pool)))]
            where = rng.random()
            if where < 0.5:
                h[header_keys[int(rng.integers(0, len(header_keys)))]] = value
            elif where < 0.9 and isinstance(h.get("a"), list) and h["a"]:
                entry = h["a"][int(rng.integers(0, len(h["a"])))]
                if isinstance(entry, list) and entry:
                    entry[int(rng.integers(0, len(entry)))] = value
            else:
                h.pop(header_keys[int(rng.integers(0, len(header_keys)))], None)
        _decode_or_protocol_error([msgpack.packb(h, use_bin_type=True), *base_frames[1:]])
    assert time.perf_counter() - start < 10.0


# ---------------------------------------------------------------- hygiene


def test_protocol_does_not_import_torch_zmq_or_pickle() -> None:
    import pathlib

    import fednet.protocol as proto

    src = "".join(p.read_text() for p in pathlib.Path(proto.__file__).parent.glob("*.py"))
    for mod in ("torch", "zmq", "pickle"):
        for banned in (f"import {mod}", f"from {mod}"):
            assert banned not in src


# ---------------------------------------------------------------- large arrays in chunks


def test_large_arrays_travel_in_chunks_and_join_exactly() -> None:
    from fednet.protocol.kinds import CHUNK_BYTES

    big = np.arange(CHUNK_BYTES // 2 + 5, dtype=np.float32)  # 3 chunks, the last 20 bytes
    exact = np.ones(CHUNK_BYTES // 8, dtype=np.float64)  # exactly one chunk
    msg = _msg(kind=MsgKind.RESULT, arrays={"big": big, "exact": exact, "s": np.zeros(3)})
    frames = encode(msg)
    sizes = [memoryview(f).nbytes for f in frames[1:]]
    assert sizes == [CHUNK_BYTES, CHUNK_BYTES, big.nbytes - 2 * CHUNK_BYTES, CHUNK_BYTES, 24]
    assert frame_bytes(frames)[1] == big.nbytes + exact.nbytes + 24  # the ledger: same bytes
    out = decode(frames)
    np.testing.assert_array_equal(out.arrays["big"], big)
    np.testing.assert_array_equal(out.arrays["exact"], exact)
    assert out.arrays["big"].flags.c_contiguous and out.arrays["big"].dtype == np.float32
    assert _base_ptr(frames[4]) == out.arrays["exact"].__array_interface__["data"][0]  # no copy


def test_a_wrongly_split_large_array_is_refused() -> None:
    from fednet.protocol.kinds import CHUNK_BYTES

    big = np.zeros(CHUNK_BYTES // 4 + 10, dtype=np.float32)  # 2 chunks
    frames = [bytes(memoryview(f)) for f in encode(_msg(kind=MsgKind.RESULT, arrays={"b": big}))]
    whole = frames[1] + frames[2]
    _reject([frames[0], whole], "frames")  # one frame where two are due
    _reject([frames[0], whole[:100], whole[100:]], "frame 0 has")  # split elsewhere
    _reject([frames[0], frames[1], frames[2], b""], "frames")  # a frame too many
