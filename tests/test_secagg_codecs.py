"""--compress int8 and qsgd under --secagg full|plus (compress/field.py): each client clips its
update to the server's bound and rounds it onto one grid for every client, the server unmasks
the integer sum and dequantizes it once; the masked vector travels in the fewest bits the sum can
need, packed. Codecs without a common grid (top-k, sign, fp16) are refused at validate, before
any data loads, from their declared facts; a plugin's codec declares a grid the same way."""
from __future__ import annotations

import json

import numpy as np
import pytest

from fednet.algorithms import secagg as S
from fednet.algorithms import secagg_client
from fednet.algorithms.checks import validate
from fednet.compress.codecs import CodecSpec, fp16_decode, fp16_encode
from fednet.compress.field import FIELD_GRIDS, FieldGrid, grid_levels
from fednet.core.inproc import run_local
from fednet.errors import ConfigError
from fednet.secagg import client as C
from fednet.secagg import field
from fednet.secagg.server import Aggregation
from tests.conftest import small_config
from tests.harness import BYTE_KEYS, DIGITS_MODEL_BYTES, byte_totals, final_model, same_arrays


def _protocol(xs: list[np.ndarray], examples: list[int], clip: float, levels: int,
              seed: int = 0):
    """Secure aggregation of the clients' xs in one process (no dropouts), each clipped, scaled
    by its examples over the largest (FedAvg's weight in the values), quantized on the common
    grid of `levels` steps, masked, packed in the fewest bits and unpacked at the server: (the
    unmasked sum modulo 2^wbits, the clients' own integer vectors, the inputs' count)."""
    n, d = len(xs), xs[0].size
    w = dict.fromkeys(range(n), 1)  # (every input counts 1: its weight is in its values)
    fbits = field.field_bits(n, 16, 0, levels)
    wbits = field.wire_bits(n, levels)
    agg = Aggregation(5, list(range(n)), w, None, 0.5, fbits, np.random.default_rng(seed))
    for u in range(n):
        pk = C.keys(u, 5, np.random.default_rng([seed, u, 0]))
        agg.take_keys(u, pk["c_pk"], pk["s_pk"])
    req = agg.share_requests()
    for u in range(n):
        out = C.shares(C.session(u, 5), req[u]["nbrs"], req[u]["c_pks"], req[u]["s_pks"],
                       agg.t[u], np.random.default_rng([seed, u, 1]))
        agg.take_shares(u, out["to"], out["sealed"])
    req = agg.input_requests()
    qs = []
    for u in range(n):
        s = C.session(u, 5)
        C.open_shares(s, req[u]["from"], req[u]["sealed"])
        x = np.clip(xs[u], -clip, clip) * (examples[u] / max(examples))
        q = field.quantize(x, clip, 16, 1, fbits, np.random.default_rng([seed, u, 2]), levels)
        qs.append(q)
        y = field.pack(C.masked(s, q, req[u]["partners"]), wbits)
        assert y.dtype == np.uint8 and y.size == field.packed_size(d, wbits)
        agg.take_input(u, field.unpack(y, wbits, d, field.dtype_of(fbits)))
    req = agg.unmask_requests()
    for u in range(n):
        agg.take_unmask(u, C.unmask(C.session(u, 5), req[u]["survivors"], req[u]["dropped"]),
                        req[u])
    low = (1 << wbits) - 1
    total, weight = agg.result(levels, lambda t, k: int(np.count_nonzero(
        (t & t.dtype.type(low)) > t.dtype.type(levels * k))))
    return total & total.dtype.type(low), qs, weight


def test_golden_three_clients_on_the_int8_grid():
    """clip 127 and int8's grid (127 steps a side): a step is 1, so integer updates of clients
    of equal examples land on the grid exactly (no rounding): the unmasked sum is the sum of
    the grid's integers, 11 bits a value (254 x 3 < 2^10, and the guard bit), and its mean the
    clients' mean."""
    xs = [np.array([1.0, -2.0, 5.0, 200.0]), np.array([0.0, 3.0, -127.0, -1.0]),
          np.array([-4.0, 0.0, 7.0, 2.0])]
    levels = grid_levels("int8", 0.0)
    assert levels == 254 and field.wire_bits(3, levels) == 11
    total, qs, k = _protocol(xs, [50, 50, 50], 127.0, levels)
    # the grid's integers (offset by 127): sum_u (x_u + 127), x clipped to 127
    assert total.tolist() == [128 + 127 + 123, 125 + 130 + 127, 132 + 0 + 134, 254 + 126 + 129]
    assert k == 3
    mean = field.dequantize(total, k, 127.0, 16, levels)
    assert mean.tolist() == pytest.approx([-1, 1 / 3, -115 / 3, 128 / 3], abs=1e-12)


@pytest.mark.parametrize("levels", [254, 8])  # int8; qsgd:4
def test_the_unmasked_sum_is_the_clients_quantized_sum_exactly(levels):
    rng = np.random.default_rng(3)
    xs = [rng.normal(0, 0.3, 301) for _ in range(3)]
    total, qs, k = _protocol(xs, [17, 5, 40], 0.5, levels, seed=2)
    plain = sum(q.astype(np.uint64) for q in qs)
    assert np.array_equal(total.astype(np.uint64), plain)
    assert int(plain.max()) < 1 << field.sum_bits(3, levels)  # the packed width holds it
    # dequantized once and divided by sum_u n_u / n_top: FedAvg's weighted mean within the
    # rounding (one grid step over sum_u n_u / n_top)
    mean = field.dequantize(total, k, 0.5, 16, levels) * (k * 40 / 62)
    exact = sum(n * np.clip(x, -0.5, 0.5) for n, x in zip([17, 5, 40], xs)) / 62
    assert np.abs(mean - exact).max() <= 2 * 0.5 / levels * 3 * 40 / 62


def test_packing_round_trips_at_every_width():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 1 << 63, 999, dtype=np.uint64)
    for w in (1, 5, 8, 19, 31, 32, 47, 64):
        got = field.unpack(field.pack(y, w), w, y.size, np.dtype(np.uint64))
        assert np.array_equal(got, y if w == 64 else y & np.uint64((1 << w) - 1)), w
        assert field.pack(y, w).size == (999 * w + 7) // 8


def test_the_guard_bit_leaves_half_the_range_outside_every_honest_sum():
    """wire_bits: every honest sum k L fits, and at least half of Z_{2^w} lies above it (what
    a wrong input's uniform values fall into, for the server's check to see)."""
    for levels in (2, 8, 32, 254):
        for k in range(1, 3000):
            w = field.wire_bits(k, levels)
            assert k * levels < 1 << (w - 1) and w == field.sum_bits(k, levels) + 1


def _cfg(tmp_path, name, rounds=1, clients=4, **net):
    return small_config(clients=clients, rounds=rounds, out=str(tmp_path / name), net=net)


@pytest.mark.parametrize("mode, spec", [("plus", "int8"), ("full", "qsgd:4")])
def test_a_run_unmasks_the_sum_of_the_clients_grid_integers(tmp_path, monkeypatch, mode, spec):
    """The server's unmasked sum is the sum of what the clients quantized (spied on the clients'
    side) exactly, and the round's model is the model it began with plus that sum dequantized
    once, bit for bit; the row names the bits a masked value travelled in."""
    qs: list[tuple[np.ndarray, int, int]] = []
    seen: list[tuple[np.ndarray, dict, dict]] = []
    quant, unmasked = field.quantize, S.SecAggServer._unmasked

    def spy(x, clip, bits, weight, fbits, rng, levels=0):
        q = quant(x, clip, bits, weight, fbits, rng, levels)
        qs.append((q, weight, levels))
        return q

    def spy_unmasked(self, rnd, total, weight):
        seen.append((total.copy(), {k: v.copy() for k, v in self.inner.state.model.items()},
                     dict(self.examples)))
        return unmasked(self, rnd, total, weight)
    monkeypatch.setattr(secagg_client, "quantize", spy)
    monkeypatch.setattr(S.SecAggServer, "_unmasked", spy_unmasked)
    s = run_local(_cfg(tmp_path, "sa", secagg=mode, secagg_clip=0.5, compress=spec), quiet=True)
    assert s["status"] == "completed" and not s["failures"]
    kind, _, arg = spec.partition(":")
    levels = grid_levels(kind, float(arg or 0))
    assert len(qs) == 4 and all(lv == levels for _, _, lv in qs)
    row = json.loads((tmp_path / "sa" / "metrics.jsonl").read_text().splitlines()[0])
    assert all(n == 1 for _, n, _ in qs)  # (each input counts 1: its weight is in its values)
    assert row["secagg_wire_bits"] == field.sum_bits(4, levels) + 1 < row["secagg_field_bits"]
    (total, base, examples), = seen
    assert np.array_equal(total.astype(np.uint64), sum(q.astype(np.uint64) for q, _, _ in qs))
    top, mass = max(examples.values()), sum(examples.values())
    mean = field.dequantize(total, 4, 0.5, 16, levels) * (4 * top / mass)
    got, i = final_model(tmp_path / "sa"), 0
    for n in sorted(k for k, a in base.items() if a.dtype.kind == "f"):
        a = base[n]
        want = (a.astype(np.float64) + mean[i:i + a.size].reshape(a.shape)).astype(a.dtype)
        assert np.array_equal(got[n], want), n
        i += a.size
    assert i == mean.size - 1  # (the last value: the mean training loss)


def test_uplink_bytes_are_the_packed_width(tmp_path):
    """The input stage's masked vector: ceil((d + 1) wbits / 8) bytes a client in place of
    4 (d + 1) (a 32-bit field); nothing else in the ledger moves (same headers aside)."""
    dense = run_local(_cfg(tmp_path, "dense", secagg="plus", secagg_clip=0.5), quiet=True)
    s = run_local(_cfg(tmp_path, "int8", secagg="plus", secagg_clip=0.5, compress="int8"),
                  quiet=True)
    row = json.loads((tmp_path / "int8" / "metrics.jsonl").read_text().splitlines()[0])
    assert row["secagg_field_bits"] == 32
    d1 = DIGITS_MODEL_BYTES // 4 + 1  # the model's values and the loss
    per = field.packed_size(d1, row["secagg_wire_bits"])
    assert per == -(-d1 * row["secagg_wire_bits"] // 8)
    assert dense["bytes"]["tensor_bytes"] - s["bytes"]["tensor_bytes"] == 4 * (4 * d1 - per)


@pytest.mark.parametrize("spec, says", [
    ("topk:0.1", "each client keeps other coordinates"),
    ("sign", "each client's signs carry its own scale"),
    ("fp16", "its floats do not add")])
def test_codecs_without_a_common_grid_are_refused_before_any_data(tmp_path, monkeypatch, spec,
                                                                  says):
    import fednet.core.session as session

    def no_data(*a, **k):
        raise AssertionError("the data loaded before the refusal")
    monkeypatch.setattr(session, "load_dataset", no_data)
    for mode in ("full", "plus"):
        with pytest.raises(ConfigError, match=f"^--secagg {mode}: --compress {spec}: {says}.*"
                           "use a codec with a common grid"):
            run_local(_cfg(tmp_path, f"{mode}{spec}", secagg=mode, compress=spec), quiet=True)


def test_what_the_grid_sets_is_not_set_twice():
    with pytest.raises(ConfigError, match="^--secagg-bits 12: --compress int8 sets"):
        validate(small_config(clients=4, net={"secagg": "plus", "compress": "int8",
                                              "secagg_bits": 12}))
    with pytest.raises(ConfigError, match="--compress qsgd: --dp distributed rounds"):
        validate(small_config(clients=6, net={"secagg": "plus", "compress": "qsgd"},
                              dp={"mode": "distributed", "noise": 1.0}))


def test_a_plugin_codec_declares_its_grid(tmp_path):
    """A codec's grid is its declared fact: the same codec is refused without one and runs
    with one (here fp16's coding under a new name, given 3 steps a side)."""
    from fednet import api

    api.register_codec(CodecSpec("half16", fp16_encode, fp16_decode, frozenset({"@half16"}),
                                 why="its floats do not add"))
    cfg = small_config(clients=4, net={"secagg": "plus", "compress": "half16"})
    with pytest.raises(ConfigError, match="--compress half16: its floats do not add"):
        validate(cfg)
    try:
        api.register_field_grid(api.FieldGrid("half16", lambda a: 3))
        validate(cfg)
    finally:
        FIELD_GRIDS.pop("half16", None)
    with pytest.raises(ConfigError, match="registered twice"):
        api.register_field_grid(FieldGrid("int8", lambda a: 5))


@pytest.mark.net
@pytest.mark.slow
@pytest.mark.parametrize("mode, spec", [("plus", "int8"), ("full", "qsgd:8")])
def test_launch_gives_the_local_run_bit_for_bit(tmp_path, mode, spec):
    from fednet.server.main import run_zmq

    over = dict(secagg=mode, compress=spec, secagg_clip=0.5)
    a = run_local(_cfg(tmp_path, "local", 2, 5, **over), quiet=True)
    b = run_zmq(_cfg(tmp_path, "launch", 2, 5, **over), quiet=True)
    assert a["status"] == b["status"] == "completed"
    assert same_arrays(final_model(tmp_path / "local"), final_model(tmp_path / "launch"))
    assert byte_totals(a, BYTE_KEYS) == byte_totals(b, BYTE_KEYS)
    assert a["bytes_by_stage"] == b["bytes_by_stage"] and a["sim_time_s"] == b["sim_time_s"]


def test_a_wrong_masked_input_fails_the_round_by_the_grids_bound(tmp_path, monkeypatch):
    """A client whose masked vector is not what its masks make (here: uniform values, as masks
    left in): the unmasked sum modulo 2^wbits leaves [0, k (L - 1)] (the guard bit's half of
    the range), so the round fails at unmask, named, and the model is kept."""
    packed = secagg_client._packed
    done: list[int] = []

    def wrong(y, asked):
        if asked.get("wbits") and not done:  # (the first input: one client's)
            done.append(1)
            y = np.random.default_rng(0).integers(0, 1 << 32, y.size, dtype=np.uint64
                                                  ).astype(y.dtype)
        return packed(y, asked)
    monkeypatch.setattr(secagg_client, "_packed", wrong)
    run_local(_cfg(tmp_path, "bad", secagg="plus", secagg_clip=0.5, compress="int8"),
              quiet=True)
    row = json.loads((tmp_path / "bad" / "metrics.jsonl").read_text().splitlines()[0])
    assert done and "outside the bound honest clients' sums keep" in row["secagg_failed"]
