"""fednet local hands messages over without frames (protocol/handover.py): the counts must be
the encoder's byte for byte, and the receiver must get what decode(encode(msg)) gives it, on
every message kind."""
from __future__ import annotations

import numpy as np
import pytest

from fednet.errors import ProtocolError
from fednet.protocol import Limits, Message, MsgKind, decode, encode, frame_bytes
from fednet.protocol.frames import is_private
from fednet.protocol.handover import handover, sizes
from fednet.protocol.kinds import CHUNK_BYTES
from fednet.protocol.schema import WITH_ARRAYS
from tests.schema_examples import msg as example


def _arrays() -> dict[str, np.ndarray]:
    """One array of every allowed kind of layout: dtypes, 0-d, empty, a transposed (not C
    order) one, a big-endian one, and one over CHUNK_BYTES (several frames)."""
    rng = np.random.default_rng(0)
    return {
        "w": rng.normal(size=(16, 1, 3, 3)).astype(np.float32),
        "b": np.arange(5, dtype=np.int64),
        "half": np.array([1.5, -2.25], np.float16),
        "d": np.array(3.25),  # 0-d float64
        "none": np.zeros((0, 4), np.uint8),
        "mask": np.array([True, False, True]),
        "t": np.arange(12, dtype=np.int32).reshape(3, 4).T,
        "be": np.arange(6, dtype=">u4"),
        "big": rng.normal(size=CHUNK_BYTES // 4 + 3).astype(np.float32),
    }


def _messages() -> list[Message]:
    out = []
    for kind in MsgKind:
        m = example(kind, run_id="r" * 32, round=3, task_id=17, sim_time=0.125)
        if kind in WITH_ARRAYS:
            m.arrays = _arrays()
        out.append(m)
    return out


@pytest.mark.parametrize("m", _messages(), ids=lambda m: m.kind.name)
def test_handover_counts_the_encoders_bytes_and_delivers_what_decode_gives(m):
    frames = [bytes(f) for f in encode(m)]
    want = decode(frames)
    got, header, payload = handover(m)
    assert (header, payload) == frame_bytes(frames) == sizes(m)
    assert header == len(frames[0]) and payload == sum(len(f) for f in frames[1:])
    assert (got.kind, got.sender, got.run_id, got.round, got.task_id, got.sim_time, got.body) == \
        (want.kind, want.sender, want.run_id, want.round, want.task_id, want.sim_time, want.body)
    assert list(got.arrays) == list(want.arrays) == list(m.arrays)
    for name, a in want.arrays.items():
        b = got.arrays[name]
        assert (b.dtype.str, b.shape) == (a.dtype.str, a.shape)
        assert b.tobytes() == a.tobytes()
        assert (b.flags.writeable, is_private(b)) == (a.flags.writeable, is_private(a))
        assert not np.shares_memory(b, m.arrays[name])  # the receiver's own copy


def test_handover_sends_a_copy_taken_when_sent():
    m = example(MsgKind.RESULT, run_id="r" * 32)
    m.arrays = {"w": np.ones(4, np.float32)}
    got, _, _ = handover(m)
    m.arrays["w"][:] = 7  # the sender trains on: what was sent stays as sent
    assert got.arrays["w"].tolist() == [1.0] * 4
    with pytest.raises(ValueError):
        got.arrays["w"][0] = 2  # read-only, as decode's view of a received frame


def test_the_big_array_is_private_and_the_small_ones_read_only():
    m = _messages()[MsgKind.TASK - 1]
    got, _, _ = handover(m)
    assert is_private(got.arrays["big"]) and got.arrays["big"].flags.writeable
    assert not any(is_private(a) for n, a in got.arrays.items() if n != "big")


@pytest.mark.parametrize("change, limits", [
    (lambda m: m.body.pop("n"), Limits()),                                  # body schema
    (lambda m: m.arrays.update(s=np.array(["x"])), Limits()),               # dtype
    (lambda m: setattr(m, "round", True), Limits()),                        # header field
    (lambda m: None, Limits(max_arrays=2)),
    (lambda m: None, Limits(max_message_bytes=CHUNK_BYTES)),
    (lambda m: None, Limits(max_header_bytes=40)),
])
def test_handover_refuses_what_encode_refuses_with_the_same_error(change, limits):
    m = example(MsgKind.RESULT, run_id="r" * 32)
    m.arrays = _arrays()
    change(m)
    with pytest.raises(ProtocolError) as want:
        encode(m, limits)
    with pytest.raises(ProtocolError) as got:
        handover(m, limits)
    assert str(got.value) == str(want.value)
