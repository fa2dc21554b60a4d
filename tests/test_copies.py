"""Big models without extra copies: decode joins a large array once into its own buffer and
releases each frame as it goes; a FedAvg client takes that buffer over as its model's memory."""
from __future__ import annotations

import numpy as np
import torch
import zmq

from fednet.metrics.accounting import Ledger
from fednet.models.arrays import adopt_arrays, load_arrays, state_arrays
from fednet.protocol import Message, MsgKind, decode, encode
from fednet.protocol.frames import is_private
from fednet.protocol.kinds import CHUNK_BYTES
from fednet.transport.channels import Channel


def _msg(arrays):
    return Message(MsgKind.TASK, "server", "r", 1, 7, 0.0,
                   body={"route": [0], "hop": 0, "body": {}, "kind": "train"}, arrays=arrays)


def test_decode_releases_each_joined_frame_and_marks_the_joined_array_private():
    big = np.arange(3 * CHUNK_BYTES // 4 + 5, dtype=np.float32)  # 4 frames
    small = np.ones(10, dtype=np.float32)
    frames = [bytes(f) for f in encode(_msg({"big": big, "small": small}))]
    assert len(frames) == 1 + 4 + 1
    kept = list(frames)
    msg = decode(frames, release=True)
    assert frames[1:5] == [None] * 4  # the big array's frames are gone from the list
    assert frames[0] is kept[0] and frames[5] is kept[5]  # header and the small array's view
    np.testing.assert_array_equal(msg.arrays["big"], big)
    np.testing.assert_array_equal(msg.arrays["small"], small)
    assert is_private(msg.arrays["big"]) and msg.arrays["big"].flags.writeable
    assert not is_private(msg.arrays["small"])  # a read-only view of its frame
    again = decode(kept)  # without release the caller's frames stay
    assert all(f is not None for f in kept) and not is_private(big)
    np.testing.assert_array_equal(again.arrays["big"], big)


def test_decode_checks_every_frame_size_before_releasing_any():
    import pytest

    from fednet.errors import ProtocolError

    frames = [bytes(f) for f in encode(_msg({"big": np.zeros(CHUNK_BYTES // 2, np.float32)}))]
    frames[-1] = frames[-1][:-4]
    with pytest.raises(ProtocolError, match="frame 1 has"):
        decode(frames, release=True)
    assert None not in frames


def test_adopted_arrays_become_the_model_memory_and_load_arrays_then_copies_nothing():
    model = torch.nn.Sequential(torch.nn.Linear(300, 200), torch.nn.BatchNorm1d(200))
    received = {k: np.array(v, copy=True) + 1 for k, v in state_arrays(model).items()}
    ro = received["1.running_var"]
    ro.setflags(write=False)  # not adoptable: copied by load_arrays
    n = adopt_arrays(model, {k: v for k, v in received.items() if k != "0.bias"})
    w = model[0].weight
    assert n == received["0.weight"].nbytes + received["1.weight"].nbytes + \
        received["1.bias"].nbytes + received["1.running_mean"].nbytes  # the counter: a scalar
    assert w.data_ptr() == received["0.weight"].ctypes.data and isinstance(w, torch.nn.Parameter)
    assert model[1].running_var.data_ptr() != ro.ctypes.data
    load_arrays(model, received)  # the rest is copied; adopted entries are left as they are
    for k, v in state_arrays(model).items():
        np.testing.assert_array_equal(v, received[k])
    with torch.no_grad():
        w.add_(1.0)  # the model trains in the adopted buffer itself
    assert received["0.weight"][0, 0] == w[0, 0].item()


def test_a_received_model_over_real_sockets_is_joined_once_and_adopted():
    ctx = zmq.Context()
    try:
        a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
        port = a.bind_to_random_port("tcp://127.0.0.1")
        b.connect(f"tcp://127.0.0.1:{port}")
        model = torch.nn.Linear(1000, 500)
        sent = {k: np.array(v, copy=True) * 2 for k, v in state_arrays(model).items()}
        Channel(a, Ledger(), "server", router=False).send(_msg(sent), "client")
        got = Channel(b, Ledger(), "client", router=False).recv()
        assert got is not None and is_private(got.msg.arrays["weight"])
        adopt_arrays(model, {k: v for k, v in got.msg.arrays.items() if is_private(v)})
        assert model.weight.data_ptr() == got.msg.arrays["weight"].ctypes.data
        load_arrays(model, got.msg.arrays)
        for k, v in state_arrays(model).items():
            np.testing.assert_array_equal(v, sent[k])
    finally:
        ctx.destroy(linger=0)
