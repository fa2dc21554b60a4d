"""Compressed updates (fednet/compress): wire sizes, decoding against the server's own layout
and reference, refusals of what does not decode, error feedback, and whole runs."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fednet.compress import CompressionError, decode_result, encode_result, parse
from fednet.compress.client import RESIDUAL
from fednet.algorithms.checks import validate
from fednet.errors import ConfigError
from fednet.core.inproc import run_local
from tests.conftest import small_config

SHAPES = {"conv.weight": (32, 16, 3, 3), "conv.bias": (32,), "fc.weight": (64, 128),
          "fc.bias": (64,), "steps": ()}


def _model(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {n: rng.normal(size=s).astype(np.float32) for n, s in SHAPES.items() if n != "steps"}
    out["steps"] = np.array(7, np.int64)
    return out


def _case(spec: str, seed: int = 0):
    sent = _model(seed)
    trained = {n: (a + np.float32(0.01) * np.random.default_rng(seed + 1).normal(size=a.shape)
                   .astype(np.float32)) if a.dtype.kind == "f" else a for n, a in sent.items()}
    expect = {n: (a.shape, a.dtype) for n, a in sent.items()}
    wire, residual = encode_result(parse(spec), trained, sent, None, np.random.default_rng(3))
    return sent, trained, expect, wire, residual


@pytest.mark.parametrize("spec,most", [("fp16", 0.51), ("int8", 0.26), ("qsgd:16", 0.16),
                                       ("topk:0.01", 0.025), ("sign", 0.04)])
def test_each_codec_sends_what_it_promises_and_decodes_against_the_reference(spec, most):
    sent, trained, expect, wire, residual = _case(spec)
    dense = sum(a.nbytes for a in trained.values())
    assert sum(a.nbytes for a in wire.values()) <= most * dense
    assert all(n.startswith("@") for n in wire if n != "steps") and wire["steps"] == 7
    got = decode_result(parse(spec), wire, expect, sent)
    assert {n: (a.shape, a.dtype) for n, a in got.items()} == expect
    delta = {n: trained[n] - sent[n] for n in sent if n != "steps"}
    err = {n: float(np.abs(got[n] - trained[n]).max() / np.abs(delta[n]).max()) for n in delta}
    if spec in ("fp16", "int8"):  # near-exact updates
        assert max(err.values()) < (0.001 if spec == "fp16" else 0.01), err
    if spec.startswith("topk"):  # the kept entries are exact, the rest are the reference's
        flat = np.concatenate([delta[n].ravel() for n in sorted(delta)])
        kept = np.concatenate([(got[n] - sent[n]).ravel() for n in sorted(delta)]) != 0
        assert kept.sum() == int(np.ceil(0.01 * flat.size))
        assert np.abs(flat[kept]).min() >= np.abs(flat[~kept]).max()
    assert (residual is not None) == (spec.startswith(("topk", "sign")))


def test_error_feedback_keeps_what_it_did_not_send():
    spec = parse("topk:0.05")
    x = np.random.default_rng(0).normal(size=1000).astype(np.float32)
    arrays = {"w": x}
    wire, e1 = encode_result(spec, arrays, {}, None, None)
    sent1 = decode_result(spec, wire, {"w": ((1000,), np.float32)}, {})["w"]
    assert np.allclose(sent1 + e1, x)  # nothing is lost: sent + kept back = the update
    wire, e2 = encode_result(spec, arrays, {}, e1, None)  # the same update again, with feedback
    sent2 = decode_result(spec, wire, {"w": ((1000,), np.float32)}, {})["w"]
    assert np.allclose(sent1 + sent2 + e2, 2 * x, atol=1e-5)
    assert not np.array_equal(np.flatnonzero(sent1), np.flatnonzero(sent2))  # other entries


def _bad(spec: str, change) -> str:
    sent, _, expect, wire, _ = _case(spec)
    change(wire)
    with pytest.raises(CompressionError) as e:
        decode_result(parse(spec), wire, expect, sent)
    return str(e.value)


def test_what_does_not_decode_is_refused_with_one_line():
    assert "missing" in _bad("fp16", lambda w: w.pop("@fp16"))
    assert "expected float16" in _bad("fp16", lambda w: w.update({"@fp16": w["@fp16"][:-1]}))
    assert "not finite" in _bad("fp16", lambda w: w["@fp16"].__setitem__(0, np.inf))
    assert "unexpected array" in _bad("fp16", lambda w: w.update({"@q8": np.zeros(3, np.uint8)}))
    assert "negative step" in _bad("int8", lambda w: w["@q8.scale"].__setitem__((0, 1), -1))
    assert "expected int16" in _bad("topk:0.01", lambda w: w.update(
        {"@topk.idx": w["@topk.idx"].astype(np.int64)}))
    assert "indices must increase" in _bad("topk:0.01", lambda w: w["@topk.idx"].__setitem__(
        -1, 30000))
    assert "indices must increase" in _bad("topk:0.01", lambda w: w["@topk.idx"].__setitem__(
        1, w["@topk.idx"][0]))
    assert "expected float32 (129,)" in _bad("topk:0.01", lambda w: w.update(
        {"@topk.val": w["@topk.val"][:-1]}))
    assert "levels must be nonzero" in _bad("qsgd:4", lambda w: w["@qsgd.lvl"].__setitem__(0, 9))
    assert "expected int8" in _bad("qsgd:4", lambda w: w.update(
        {"@qsgd.lvl": w["@qsgd.lvl"][:-1]}))
    assert "non-negative" in _bad("sign", lambda w: w["@sign.scale"].__setitem__(0, -1))
    with pytest.raises(CompressionError, match="declares no result layout"):
        decode_result(parse("fp16"), {}, None, {})


@pytest.mark.parametrize("text,why", [("zip", "must be one of"), ("fp16:3", "takes no parameter"),
                                      ("qsgd:0", "integer in 1..127"), ("qsgd:2.5", "integer"),
                                      ("topk:0", "0 < R <= 1"), ("topk:x", "not a number")])
def test_a_bad_spec_is_one_error_naming_the_option(text, why):
    with pytest.raises(ConfigError, match=why):
        parse(text)
    with pytest.raises(ConfigError, match="--compress"):
        validate(small_config(net={"compress": text}))


def test_hand_off_algorithms_refuse_compressed_results(tmp_path):
    with pytest.raises(ConfigError, match="hands models between clients"):
        run_local(small_config(algo={"name": "fedseq"}, net={"compress": "fp16"},
                               out=str(tmp_path / "r")), quiet=True)


def _run(tmp_path: Path, name: str, **kw):
    cfg = small_config(clients=4, rounds=3, out=str(tmp_path / name), **kw)
    s = run_local(cfg, quiet=True)
    with np.load(tmp_path / name / "final_model.npz") as z:
        return s, {k: z[k] for k in z.files}


def test_uplink_bytes_follow_the_encoding_and_the_residual_is_client_state(tmp_path):
    dense, m0 = _run(tmp_path, "dense")
    sparse, m1 = _run(tmp_path, "topk", net={"compress": "topk:0.01"})
    assert sparse["bytes"]["client_to_server"] < 0.03 * dense["bytes"]["client_to_server"]
    # the tasks are the same, but each of a client with a residual says `ckpt` (6 bytes, 12 tasks)
    assert sparse["bytes"]["server_to_client"] == dense["bytes"]["server_to_client"] + 6 * 12
    assert not all(np.array_equal(m0[k], m1[k]) for k in m0)
    from fednet.core import state_files as sf
    arrays, meta = sf.read(tmp_path / "topk" / "checkpoint" / "clients" / "c0001.npz")
    assert arrays[RESIDUAL].dtype == np.float32 and np.abs(arrays[RESIDUAL]).sum() > 0
    assert meta["round"] == 2


def test_a_compressed_run_with_error_feedback_resumes_exactly(tmp_path):
    from tests.harness import Stop, stop_after

    kw = dict(clients=4, rounds=4, net={"compress": "topk:0.05", "checkpoint_every": 1})
    ref = run_local(small_config(out=str(tmp_path / "ref"), **kw), quiet=True)
    cfg = small_config(out=str(tmp_path / "run"), **kw)
    with pytest.raises(Stop):
        run_local(cfg, quiet=True, prepare=stop_after(2))
    got = run_local(cfg, quiet=True, resume=True)
    with np.load(tmp_path / "run" / "final_model.npz") as a, \
            np.load(tmp_path / "ref" / "final_model.npz") as b:
        assert all(np.array_equal(a[k], b[k]) for k in b.files)
    assert got["bytes"]["client_to_server"] == ref["bytes"]["client_to_server"]
    assert got["final_accuracy"] == ref["final_accuracy"]


# ---- --compress-down ---------------------------------------------------------------------------
@pytest.mark.parametrize("spec,most", [("fp16", 0.51), ("int8", 0.26), ("qsgd:16", 0.16)])
def test_the_downlink_encodes_the_values_once_and_the_client_rebuilds_them(spec, most):
    from fednet.compress.downlink import Downlink, decode

    model = _model(0)
    down = Downlink(parse(spec, down=True), seed=0)
    wire, decoded = down.encode(model, task_id=5, rnd=0)
    dense = sum(a.nbytes for a in model.values())
    assert sum(a.nbytes for a in wire.values()) <= most * dense
    assert down.encode(model, task_id=6, rnd=0)[0] is wire  # a round's model: one encoding
    again = decode(parse(spec), wire)  # what a client rebuilds is what the server keeps
    assert again.keys() == model.keys() and all(np.array_equal(again[k], decoded[k]) for k in model)
    assert all(decoded[k].shape == model[k].shape and decoded[k].dtype == model[k].dtype
               for k in model)
    assert decoded["steps"] == model["steps"]
    err = max(float(np.abs(decoded[k] - model[k]).max()) for k in model if k != "steps")
    # QSGD's step is the tensor's norm over s: on a model's values (not an update) that is large
    bound = max(float(np.linalg.norm(a)) for a in model.values()) / 16 if spec == "qsgd:16" else {
        "fp16": 0.01, "int8": 0.05}[spec]
    assert 0 < err <= bound


def test_a_downlink_that_does_not_decode_is_refused():
    from fednet.compress.downlink import LAYOUT, Downlink, decode

    wire, _ = Downlink(parse("int8", down=True), 0).encode(_model(0), 1, 0)
    for bad in ({k: v for k, v in wire.items() if k != LAYOUT},
                {**wire, LAYOUT: np.frombuffer(b"[[1, 2]]", np.uint8)},
                {**wire, "@q8": wire["@q8"][:-1]}):
        with pytest.raises(CompressionError):
            decode(parse("int8"), bad)


@pytest.mark.parametrize("text", ["topk:0.01", "sign"])
def test_the_downlink_refuses_codecs_of_differences(text):
    with pytest.raises(ConfigError, match="--compress-down .*no reference model"):
        validate(small_config(net={"compress_down": text}))


def test_downlink_bytes_follow_the_encoding_and_compose_with_the_uplink(tmp_path):
    dense, m0 = _run(tmp_path, "dense")
    both, m1 = _run(tmp_path, "both", net={"compress_down": "int8", "compress": "topk:0.05"})
    assert both["bytes"]["server_to_client"] < 0.27 * dense["bytes"]["server_to_client"]
    assert both["bytes"]["client_to_server"] < 0.1 * dense["bytes"]["client_to_server"]
    assert both["status"] == "completed" and not all(np.array_equal(m0[k], m1[k]) for k in m0)
    with pytest.raises(ConfigError, match="hands no models between clients"):
        run_local(small_config(net={"compress_handoff": "fp16"}, out=str(tmp_path / "r")),
                  quiet=True)


FEDSEQ = {"name": "fedseq", "params": {"pretrain_epochs": 1, "min_samples": 300,
                                       "max_clients": 3, "superclient_fraction": 1.0}}


def test_hand_offs_travel_encoded_and_the_chain_trains_from_what_arrived(tmp_path):
    over = {"clients": 6, "rounds": 2, "algo": FEDSEQ}
    dense = run_local(small_config(**over, out=str(tmp_path / "dense")), quiet=True)
    small = run_local(small_config(**over, out=str(tmp_path / "int8"), net={
        "compress_handoff": "int8", "compress_down": "int8"}), quiet=True)
    assert dense["status"] == small["status"] == "completed"
    assert 0 < small["bytes"]["client_to_client"] < 0.27 * dense["bytes"]["client_to_client"]
    assert small["bytes"]["server_to_client"] < 0.6 * dense["bytes"]["server_to_client"]
    assert small["bytes"]["client_to_server"] == dense["bytes"]["client_to_server"]  # dense up
    assert small["final_accuracy"] != dense["final_accuracy"] or small["bytes"] != dense["bytes"]


# ---- a codec of a plugin (docs/extending.md's bf16.py) -------------------------------------------


def _bf16_encode(x, sizes, rng, arg):
    return {"@bf16": (x.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)}


def _bf16_decode(wire, sizes, arg):
    a = wire.get("@bf16")
    if a is None or a.dtype != np.uint16 or a.shape != (sum(sizes),):
        raise CompressionError(f"'@bf16' must be uint16 ({sum(sizes)},)")
    return (a.astype(np.uint32) << 16).view(np.float32)


@pytest.fixture()
def bf16():
    from fednet.api import CodecSpec, register_codec
    from fednet.compress import codecs as cache
    from fednet.compress.codecs import CODECS, NOT_SUMMABLE, REGISTERED, WIRE_NAMES

    c = register_codec(CodecSpec("toy_bf16", _bf16_encode, _bf16_decode, frozenset({"@bf16"}),
                                 why="its floats do not add in the field"))
    yield c
    for table in (REGISTERED, CODECS, WIRE_NAMES, NOT_SUMMABLE):
        table.pop("toy_bf16")
    cache.cache_clear()


def test_a_registered_codec_runs_and_its_facts_are_read(bf16, tmp_path):
    """--compress toy_bf16 under fednet local: each value travels in 2 bytes (the run's
    tensor bytes are fp16's exactly), the model is its own, and --secagg refuses it with the
    reason it declared, before any data loads."""
    from fednet.compress.codecs import NOT_SUMMABLE
    from tests.harness import final_model

    def run(codec):
        cfg = small_config(clients=3, rounds=1, out=str(tmp_path / codec), net={"compress": codec})
        s = run_local(validate(cfg), quiet=True)
        assert s["status"] == "completed", s.get("error")
        return s, final_model(tmp_path / codec)

    (s16, m16), (sbf, mbf) = run("fp16"), run("toy_bf16")
    assert sbf["bytes"]["tensor_bytes"] == s16["bytes"]["tensor_bytes"]  # (headers: dtype names)
    assert any(not np.array_equal(m16[k], mbf[k]) for k in m16)
    assert NOT_SUMMABLE["toy_bf16"] == "its floats do not add in the field"
    with pytest.raises(ConfigError, match="--compress toy_bf16: its floats do not add in the "
                       "field"):
        validate(small_config(clients=4, net={"compress": "toy_bf16", "secagg": "plus"}))
    with pytest.raises(ConfigError, match="--compress toy_bf16 takes no parameter"):
        parse("toy_bf16:3")


def test_a_codec_needs_its_own_name_and_wire_names(bf16):
    from fednet.api import CodecSpec, register_codec

    with pytest.raises(ConfigError, match="--compress fp16 is registered twice"):
        register_codec(CodecSpec("fp16", _bf16_encode, _bf16_decode, frozenset({"@x"})))
    with pytest.raises(ConfigError, match="its arrays' names must start with '@' and be its own"):
        register_codec(CodecSpec("toy2", _bf16_encode, _bf16_decode, frozenset({"@bf16"})))
