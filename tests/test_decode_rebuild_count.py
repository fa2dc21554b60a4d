"""A --compress-down task's decoding (issue 52's follow-up): the client's copy of the decoded
values into the task's arrays writes memory it has just allocated (new every task), measured at
about two code passes a value in place (compress.DECODE_PASSES), not the one pass of a copy
into memory already touched that it was counted at: bench_compute's client decode cells sat
about 20 % low against their CPU seconds."""
from __future__ import annotations

import numpy as np
import pytest

from fednet import opcount
from fednet.compress import decode_work, parse
from fednet.compress.codecs import codec_work
from fednet.compress.downlink import decode, encode_values


def test_a_rebuild_without_a_reference_is_two_passes_a_value():
    assert decode_work(1000, False) == {"code": 2000.0}
    assert decode_work(1000, True) == {"code": 4000.0}  # (a result's: unchanged)
    assert decode_work(0, False) == {}


@pytest.mark.parametrize("name", ["fp16", "int8"])
def test_a_clients_decoding_of_a_task_counts_its_codec_and_two_passes_a_value(name):
    g = np.random.default_rng(0)
    arrays = {"w": g.standard_normal((30, 20)).astype(np.float32),
              "b": g.standard_normal(400).astype(np.float32), "n": np.arange(3)}
    wire = encode_values(parse(name, True), arrays, 0, "compress-down", 0)
    with opcount.counted() as got:
        out = decode(parse(name, True), wire)
    n = 1000
    assert got == {"code": codec_work(name, n, decode=True)["code"] + 2.0 * n}
    assert {k: (v.shape, v.dtype) for k, v in out.items()} == {
        k: (v.shape, v.dtype) for k, v in arrays.items()}
