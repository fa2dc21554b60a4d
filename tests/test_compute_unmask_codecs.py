"""Issue 52: the server's unmask count (the sets and shares it really looks through) and the
codecs' work on a client's clock (compress/codecs.codec_work, charged inside the codec)."""
from __future__ import annotations

import numpy as np
import pytest

from fednet import opcount
from fednet.compress import FEEDBACK_PASSES, FLAT_PASSES, encode_result, parse
from fednet.compress.codecs import PASSES, QSGD_DRAW_PASSES, REGISTERED, codec_work, topk_count
from fednet.network.profiles import COLUMNS, OLDER, Profiles
from fednet.secagg import cost
from fednet.secagg.server import Aggregation
from tests import test_secagg


@pytest.mark.parametrize("degree, drop", [(None, {}), (6, {"input": {3}, "unmask": {5}})])
def test_the_unmask_count_is_the_sets_the_server_rebuilt_from(monkeypatch, degree, drop):
    """cost.unmasking reads the first t holders each secret was rebuilt from (agg.windows,
    written by first_windows) and counts the same as finding them again; the shares held beyond
    each secret's t are counted (held)."""
    seen: list[Aggregation] = []
    result = Aggregation.result

    def keep(self, *a, **k):  # type: ignore[no-untyped-def]
        seen.append(self)
        return result(self, *a, **k)
    monkeypatch.setattr(Aggregation, "result", keep)
    (total, weight), own, w = test_secagg._round(12, 50, degree, drop)
    assert np.array_equal(total, own) and weight == w  # (bit for bit, as before)
    agg = seen[0]
    assert agg.windows  # every secret's window, as first_windows took it
    counted = cost.unmasking(agg)
    agg.windows = {}
    assert cost.unmasking(agg) == counted
    secrets = [(v, agg.b_shares) for v in agg.inputs] + [
        (v, agg.s_shares) for v in set(agg.shared()) - agg.inputs]
    assert counted["held"] == sum(len(s[v]) - agg.t[v] for v, s in secrets) > 0
    assert counted["rebuilt"] == sum(agg.t[v] for v, _ in secrets)


def test_u2_is_kept_until_another_share_is_routed():
    agg = Aggregation(0, list(range(4)), {u: 1 for u in range(4)}, None, 0.5, 32,
                      np.random.default_rng(0))
    agg.nbrs = {0: [1, 2, 3], 1: [0, 2, 3]}
    sealed = np.zeros((3, 8), np.uint8)
    assert agg.take_shares(0, np.array([1, 2, 3]), sealed) == "" and agg.shared() == [0]
    assert agg.take_shares(1, np.array([0, 2, 3]), sealed) == "" and agg.shared() == [0, 1]
    agg.shared().append(7)  # (a copy: the kept list stays)
    assert agg.shared() == [0, 1]


def test_each_codec_charges_its_passes_on_the_open_meter_only():
    x = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    sizes = [600, 400]
    got = {}
    for name in ("fp16", "int8", "qsgd", "topk", "sign"):
        spec = REGISTERED[name]
        arg = spec.arg if spec.arg is not None else 0.0
        rng = np.random.default_rng(1) if spec.random else None
        with opcount.counted() as enc:
            wire = spec.encode(x, sizes, rng, arg)
        with opcount.counted() as dec:
            spec.decode(wire, sizes, arg)
        spec.encode(x, sizes, np.random.default_rng(1) if spec.random else None, arg)  # no meter
        got[name] = (enc, dec)
        assert enc == codec_work(name, 1000, k=topk_count(1000, arg) if name == "topk" else 0)
        assert enc["code"] > 0 and dec["code"] > 0
    assert got["int8"][0] == {"code": 9000.0}
    k = topk_count(1000, 0.01)
    assert got["topk"][0] == {"code": 3.0 * k, "select": 1000.0}
    assert got["qsgd"][0] == {"code": (22 + QSGD_DRAW_PASSES + 1 / 8) * 1000}  # (no "noise":
    # a uniform draw is counted in passes, not at the Gaussian noise rate)
    # QSGD's decode reads its M nonzero levels: the count follows the data it was sent
    m = int(np.count_nonzero(np.unpackbits(got_wire(x, sizes))[:1000]))
    assert got["qsgd"][1] == {"code": PASSES["qsgd"][1] * 1000.0 + 5 * m}
    assert codec_work("a-plugin", 1000) == {} and codec_work("int8", 0) == {}


def test_encode_result_charges_its_own_flattening_and_residual_passes():
    g = np.random.default_rng(0)
    arrays = {"w": g.standard_normal((30, 20)).astype(np.float32),
              "b": g.standard_normal(400).astype(np.float32),
              "n": np.arange(3)}  # (not floating: travels as it is, not counted)
    reference = {"w": np.zeros((30, 20), np.float32)}  # b has none (SCAFFOLD's deltas' case)
    for name in ("int8", "topk"):
        spec = parse(name)
        with opcount.counted() as got:
            encode_result(spec, arrays, reference, np.zeros(1000, np.float32), None)
        k = topk_count(1000, spec.arg)
        codec = opcount.add(codec_work(name, 1000, k=k),
                            codec_work(name, 1000, decode=True, k=k) if spec.feedback else {})
        own = FLAT_PASSES[True] * 600 + FLAT_PASSES[False] * 400 + (
            FEEDBACK_PASSES * 1000 if spec.feedback else 0)
        assert got == opcount.add(dict(codec), {"code": own})
    encode_result(parse("int8"), arrays, reference, None, None)  # outside a meter: no error


def got_wire(x: np.ndarray, sizes: list[int]) -> np.ndarray:
    spec = REGISTERED["qsgd"]
    return spec.encode(x, sizes, np.random.default_rng(1), spec.arg)["@qsgd.nz"]


def test_a_profile_table_without_the_codec_rates_reads_them_as_free():
    old = OLDER[13]
    row = np.arange(1, len(old) + 1, dtype=np.float64)
    p = Profiles(row[None, :])[0]
    for c in COLUMNS:
        assert getattr(p, c) == (row[old.index(c)] if c in old else 0.0), c
    assert p.code_per_s == 0.0 and p.select_per_s == 0.0 and p.s_per_conv == row[-1]


def test_a_profile_table_without_the_field_rate_reads_it_as_free():
    old = OLDER[15]  # (the widths before: code and select added, field not yet)
    assert old == tuple(c for c in COLUMNS if c != "field_per_s")
    row = np.arange(1, len(old) + 1, dtype=np.float64)
    p = Profiles(row[None, :])[0]
    for c in COLUMNS:
        assert getattr(p, c) == (row[old.index(c)] if c in old else 0.0), c
    assert p.field_per_s == 0.0 and p.code_per_s == row[old.index("code_per_s")]
    assert p.s_per_conv == row[-1] and Profiles(row[None, :]).table.shape == (1, len(COLUMNS))


def test_the_field_work_is_its_own_operation_at_its_own_rate():
    """SecAgg's quantize and pack are charged as "field", at a profile's field_per_s (not at
    the codecs' code rate, which moves with memory bandwidth while this work does not)."""
    from fednet.network.ops import EDGE, SERVERS
    from fednet.secagg import cost

    assert "field" in opcount.OPS and "field_per_s" in opcount.CLIENT_RATES
    assert EDGE["field_per_s"] > 0 and SERVERS["xeon-core"]["field_per_s"] > 0
    ops = opcount.add(cost.quantized(1000), cost.packed(1000))
    assert opcount.seconds(ops, {"code_per_s": 1e9}) == 0.0  # (the code rate does not price it)
    assert opcount.seconds(ops, {"field_per_s": 1e9}) == pytest.approx(
        (cost.QUANTIZE_PASSES + cost.PACK_PASSES) * 1000 / 1e9)


def test_the_field_grids_quantize_pack_and_unpack_charge_the_open_meter():
    from fednet.secagg import cost, field

    x = np.random.default_rng(0).standard_normal(1000)
    with opcount.counted() as got:
        q = field.quantize(x, 1.0, 16, 1, 32, np.random.default_rng(1), 254)
    assert got == cost.quantized(1000) == {"field": cost.QUANTIZE_PASSES * 1000.0}
    with opcount.counted() as got:
        buf = field.pack(q, 13)
    assert got == cost.packed(1000)
    with opcount.counted() as got:  # (unpack's own measured passes, not pack's)
        assert np.array_equal(field.unpack(buf, 13, 1000, np.dtype(np.uint32)), q)
    assert got == cost.unpacked(1000) == {"field": cost.UNPACK_PASSES * 1000.0}
    arrays = {"sa.partners": np.arange(3), "sa.from": np.arange(4)}
    first = cost.of_task("input", {"wbits": 13, "levels": 254}, arrays, 1000, 4, "sa.")
    again = cost.of_task("input", {"wbits": 13, "levels": 254, "again": True}, arrays, 1000, 4,
                         "sa.")
    plain = cost.of_task("input", {}, arrays, 1000, 4, "sa.")
    masked = cost.masked(1000, 4, 3)
    assert again == opcount.add(dict(masked), cost.packed(1000))  # (not quantized again)
    assert first["field"] == (cost.FLATTEN_PASSES + cost.GRID_PASSES + cost.QUANTIZE_PASSES
                              + cost.PACK_PASSES) * 1000  # (flattened, clipped and weighted)
    assert plain["field"] == (cost.FLATTEN_PASSES + cost.QUANTIZE_PASSES) * 1000
    assert cost.bound(10, 1000)["field"] >= 2 * first["field"]
