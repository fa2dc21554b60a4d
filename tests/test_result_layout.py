"""Every result is checked on arrival against the layout the strategy declares (issue 23 item 3):
wrong names, shapes, dtypes, sizes or sample counts are that client's failure with a one-line
reason naming the array, never a crash and never a change of the model's dtype."""
from __future__ import annotations

import numpy as np
import pytest

from fednet.algorithms.fedavg import FedAvgClient
from fednet.algorithms.layout import layout_of, mismatch, vet
from fednet.core.inproc import run_local
from tests.conftest import small_config

ORIG_RUN = FedAvgClient.run
MODEL = {"w": np.zeros((3, 4), np.float32), "b": np.zeros(3, np.float32),
         "count": np.zeros((), np.int64)}


def test_the_layout_check_names_the_array_expected_and_got():
    lay = layout_of(MODEL)
    assert mismatch(lay, dict(MODEL)) is None
    assert mismatch(lay, {"w": MODEL["w"], "count": MODEL["count"]}) == "array(s) 'b' missing"
    assert mismatch(lay, {**MODEL, "x": MODEL["b"]}) == "unexpected array(s) 'x'"
    assert mismatch(lay, {**MODEL, "w": np.zeros((30, 4), np.float32)}) == (
        "array 'w': expected float32 (3, 4), got float32 (30, 4)")
    assert mismatch(lay, {**MODEL, "b": np.zeros(3, np.int32)}) == (
        "array 'b': expected float32 (3,), got int32 (3,)")
    assert "got float64" in mismatch(lay, {**MODEL, "b": np.zeros(3, np.float64)})
    assert "got float16" in mismatch(lay, {**MODEL, "b": np.zeros(3, np.float16)})
    assert vet(lay, dict(MODEL), 0) == "its sample count n = 0 cannot weigh it (n >= 1 expected)"
    assert vet(None, {"anything": np.ones(2)}, 1) is None


def _corrupt(kind: str):
    """Client 0's update made wrong in one way (the rest are honest)."""
    def wrong(arrays):
        name = sorted(n for n, a in arrays.items() if a.ndim >= 2)[0]
        a = arrays[name]
        if kind == "shape":
            return {**arrays, name: a.reshape(-1)}
        if kind == "tenfold":
            return {**arrays, name: np.concatenate([a.reshape(-1)] * 10)}
        if kind == "missing":
            return {n: v for n, v in arrays.items() if n != name}
        if kind == "extra":
            return {**arrays, "extra": a}
        return {**arrays, name: a.astype(kind)}
    return wrong


def _run_with(tmp_path, monkeypatch, name: str, client0):
    """A 3-client FedAvg run whose client 0 sends client0(arrays); (summary, final model)."""
    def run(self, ctx, task):
        arrays, body = ORIG_RUN(self, ctx, task)
        return (client0(arrays) if ctx.cid == 0 else arrays), body

    monkeypatch.setattr(FedAvgClient, "run", run)
    s = run_local(small_config(clients=3, rounds=3, out=str(tmp_path / name)), quiet=True)
    with np.load(tmp_path / name / "final_model.npz", allow_pickle=False) as z:
        return s, {k: z[k] for k in z.files}


def _raise(arrays):
    raise RuntimeError("client 0 fails")


@pytest.mark.parametrize("kind", ["shape", "tenfold", "missing", "extra", "int32", "float16",
                                  "float64"])
def test_a_wrong_result_is_its_clients_failure_and_leaves_the_model_intact(tmp_path, monkeypatch,
                                                                           kind):
    """The model is bit for bit the one of a run where client 0 simply fails every task."""
    _, ref = _run_with(tmp_path, monkeypatch, "ref", _raise)
    s, model = _run_with(tmp_path, monkeypatch, "run", _corrupt(kind))
    assert s["status"] == "completed"
    bad = [f for f in s["failures"] if f["client"] == 0]
    assert len(bad) == 3 and all(f["reason"].startswith("result refused: ") for f in bad)
    assert not [f for f in s["failures"] if f["client"] != 0]
    assert set(model) == set(ref)
    assert all(model[k].dtype == ref[k].dtype and np.array_equal(model[k], ref[k]) for k in ref)


def test_a_result_with_no_weight_is_refused_and_the_model_kept(tmp_path, monkeypatch):
    """n = 0 from every client: each is a failure, the round keeps the previous model."""
    from fednet.core import executor

    monkeypatch.setattr(executor.Executor, "num_examples", property(lambda self: 0),
                        raising=False)
    cfg = small_config(clients=2, rounds=2, out=str(tmp_path / "run"))
    s = run_local(cfg, quiet=True)
    assert s["status"] == "failed"
    assert all("n = 0" in f["reason"] for f in s["failures"])


def test_huge_finite_weights_end_the_run_as_diverged(tmp_path, monkeypatch):
    """One client sends every weight as 3e38 (finite, so it passes the layout check): the
    global model's loss is no longer finite and the run stops as diverged, naming the round."""
    def huge(arrays):
        return {n: np.full_like(a, 3e38) if a.dtype.kind == "f" else a for n, a in arrays.items()}

    s, _ = _run_with(tmp_path, monkeypatch, "run", huge)
    assert s["status"] == "diverged" and s["rounds"] == 1
    assert s["error"].startswith("round 1: the global model")  # rounds counted from 1


def test_each_distinct_failure_reason_is_printed_once(tmp_path, monkeypatch, capsys):
    """Client 0 fails in every round with the same reason: one line on the terminal, naming
    the client and the reason's first line; summary.json keeps all three."""
    def run(self, ctx, task):
        if ctx.cid == 0:
            raise RuntimeError(f"client 0 fails in round {task.round}\nsecond line")
        return ORIG_RUN(self, ctx, task)

    monkeypatch.setattr(FedAvgClient, "run", run)
    s = run_local(small_config(clients=3, rounds=3, out=str(tmp_path / "run")), quiet=False)
    out = capsys.readouterr()
    lines = [ln for ln in (out.out + out.err).splitlines() if "failed: RuntimeError" in ln]
    assert len(lines) == 1 and lines[0].startswith("round 1: client 0 failed: RuntimeError: "
                                                   "client 0 fails in round 0"), lines
    assert "second line" not in lines[0]
    assert len(s["failures"]) == 3
