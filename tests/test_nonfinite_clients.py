"""Clients that train on non-finite losses (issue 55 item 5): a result whose reported loss is NaN/inf
is that client's recorded failure with its cause, never aggregated; a run whose evaluated
model(s) diverged ends `failed` (personal models) or `diverged` (the global model), never
`completed`. Real in-process runs on tiny sizes."""
from __future__ import annotations

import math

import numpy as np

from fednet.core.inproc import run_local
from fednet.core.replies import accept_reply, loss_problem
from fednet.core.verdict import DIVERGED_LOCALLY, Verdict, non_finite
from fednet.network.latency import Profile
from fednet.protocol import Message, MsgKind
from fednet.types import Failure, Result
from tests.conftest import small_config

BLOW_UP = {"lr": 1e4}  # digits, SGD: every client's loss is NaN within its first epoch


def _run(tmp_path, name: str, **over):
    return run_local(small_config(**over).replace(out=str(tmp_path / name)), quiet=True)


def test_standalone_whose_clients_diverge_fails_naming_the_cause(tmp_path):
    s = _run(tmp_path, "sa", clients=3, rounds=4, algo={"name": "standalone"}, train=BLOW_UP)
    assert s["status"] == "failed"  # was `completed`, its mean accuracy over NaN models
    assert s["rounds"] < 4
    assert "diverged" in s["error"] and "loss is nan" in s["error"]
    reasons = [f["reason"] for f in s["failures"]]
    assert reasons and all(DIVERGED_LOCALLY in r for r in reasons)


# The factorized backbone without clipping: at lr 0.3 two of the four clients' losses go NaN in
# round 1 and two train on (the others' mean accuracy was what such a run reported, `completed`).
SOME_DIVERGE = {"lr": 0.3, "momentum": 0.9, "model": "factorized_digits"}


def test_standalone_on_the_factorized_backbone_fails_when_some_clients_diverge(tmp_path):
    s = _run(tmp_path, "some", clients=4, rounds=3, seed=8, algo={"name": "standalone"},
             train=SOME_DIVERGE)
    assert s["status"] == "failed" and s["rounds"] == 1
    assert "the own model of 2 of the 4 clients evaluated diverged (clients 0, 1)" in s["error"]
    assert [f["client"] for f in s["failures"]] == [0, 1]


def test_a_personalized_algorithm_whose_clients_diverge_fails(tmp_path):
    s = _run(tmp_path, "fz", clients=4, rounds=3, seed=8,
             algo={"name": "factorized", "params": {"clip": 0}}, train=SOME_DIVERGE)
    assert s["status"] == "failed" and s["rounds"] == 1
    assert len(s["failures"]) == 2 and all(non_finite(f["reason"]) for f in s["failures"])


def test_fedavg_whose_clients_all_diverge_still_ends_diverged(tmp_path):
    s = _run(tmp_path, "fa", rounds=3, train=BLOW_UP)
    assert s["status"] == "diverged"
    assert s["rounds"] < 3


def test_a_healthy_personalized_run_completes(tmp_path):
    s = _run(tmp_path, "ok", clients=3, rounds=2, algo={"name": "standalone"})
    assert s["status"] == "completed" and not s["failures"]
    assert math.isfinite(s["final_accuracy"])


def _reply(loss: float, arrays=None) -> Message:
    return Message(MsgKind.RESULT, "c0000", "r" * 32, 0, 5, 1.0,
                   {"n": 10, "body": {"loss": loss}}, arrays or {})


def test_a_nan_or_inf_loss_is_the_clients_failure_with_its_cause():
    prof = [Profile()]
    for bad in (math.nan, math.inf, -math.inf):
        got = accept_reply(_reply(bad), 0, 100, prof, {})
        assert isinstance(got, Failure), bad
        assert DIVERGED_LOCALLY in got.reason and "training loss" in got.reason
    ok = accept_reply(_reply(0.5), 0, 100, prof, {})
    assert isinstance(ok, Result)
    assert loss_problem({"test_loss": math.nan}) is not None
    assert loss_problem({"loss": 3, "samples": 4}) is None


def test_the_verdict_names_the_diverged_clients():
    good = Result(1, 0, 1, {}, {"accuracy": 0.5, "loss": 1.0}, 10)
    bad = Failure(2, 0, 2, f"result refused: its reported training loss is nan: {DIVERGED_LOCALLY}")
    late = Failure(3, 0, 3, "straggler")
    ending = Verdict.clients_diverged(4, [good], [bad, late])
    assert ending is not None
    status, why = ending
    assert status == "failed" and "round 5" in why and "1 of the 2 clients" in why
    assert Verdict.clients_diverged(4, [good], [late]) is None
    # every client that answered diverged, by its values or by its loss: the run diverged
    values = Failure(4, 0, 4, "result refused: array 'w' holds NaN or inf")
    status, why = Verdict.diverged(0, {"w": np.zeros(1, np.float32)}, [], [bad, values], 1.0)
    assert status == "diverged" and "all 2 clients" in why


def test_standalone_clipped_as_factorized_fl_clients_trains_that_backbone(tmp_path):
    s = _run(tmp_path, "clip", clients=4, rounds=3, seed=8,
             algo={"name": "standalone", "params": {"clip": 5.0}}, train=SOME_DIVERGE)
    assert s["status"] == "completed" and not s["failures"]


def test_arrays_vetted_on_arrival_are_not_read_again_and_changed_ones_are():
    from fednet.algorithms import build
    from fednet.algorithms.layout import proven_finite
    from tests.conftest import small_config

    ok = accept_reply(_reply(0.5, {"w": np.ones(3, np.float32)}), 0, 100, [Profile()], None)
    assert isinstance(ok, Result) and proven_finite(ok.vetted, ok.arrays)
    assert not proven_finite(None, ok.arrays)
    algo = build(small_config())
    algo.setup({"w": np.zeros(3, np.float32)}, trainable={"w"})
    bad = Result(6, 0, 1, {"w": np.array([1.0, np.nan, 0.0], np.float32)}, {}, 10,
                 vetted=ok.vetted)  # vetted other arrays: these are read
    assert not proven_finite(bad.vetted, bad.arrays)
    for r in (ok, bad):
        algo.absorb(r)
    assert algo._finite == {ok.task_id: True, bad.task_id: False}


def test_non_finite_read_in_groups_names_the_first_bad_array():
    from fednet.algorithms import layout

    rng = np.random.default_rng(0)
    kinds = [np.float32, np.float16, np.float64, np.int64, np.float32]
    sizes = [3, 0, 1, layout.GROUP, layout.GROUP - 2, 5, 2 * layout.GROUP, 7, 1]
    arrays = {f"a{i}": rng.standard_normal(n).astype(kinds[i % len(kinds)])
              for i, n in enumerate(sizes)}
    arrays["s"] = np.array(np.float32(2.0))  # a 0-d array
    assert layout.non_finite(arrays) is None
    for name, a in arrays.items():
        if a.dtype.kind != "f" or not a.size:
            continue
        for bad in (np.nan, np.inf, -np.inf):
            b = a.copy()
            b.reshape(-1)[-1] = bad
            got = layout.non_finite({**arrays, name: b, "z": np.full(2, np.nan, np.float32)})
            assert got == f"array {name!r} {layout.NON_FINITE}", (name, bad)
    big = np.full(layout.GROUP, np.finfo(np.float32).max, np.float32)  # finite, sums to no inf
    assert layout.non_finite({"x": big[:4], "y": big[:4]}) is None
