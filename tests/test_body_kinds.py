"""An algorithm's own task and result body keys are declared with its Spec (task_body,
result_body) and checked before the algorithm reads them: a task's by the client, a result's by
the server. The protocol types only the runtime's keys (protocol/schema.py)."""
from __future__ import annotations

import dataclasses

import pytest

from fednet.algorithms import get
from fednet.algorithms.fedfomo import FedFomoClient
from fednet.algorithms.spec import Spec, register
from fednet.core.inproc import run_local
from fednet.core.work import check_work
from fednet.errors import ProtocolError
from fednet.protocol.schema import RESULT_BODY, TASK_BODY
from tests.conftest import small_config


def test_the_protocol_types_only_the_runtimes_keys():
    assert set(TASK_BODY.fields) == {"epochs", "lr", "evaluate", "ckpt"}
    assert "candidates" not in RESULT_BODY.fields and "mixed" not in RESULT_BODY.fields
    assert get("fedseq").task_body == {"approximator": "name", "classes": "count"}
    assert get("fedfomo").result_body == {"candidates": "client ids", "mixed": "number or nan"}


@pytest.mark.parametrize("algo,body,key", [
    ("fedseq", {"classes": "ten"}, "classes"), ("fedseq", {"classes": 0}, "classes"),
    ("fedseq", {"approximator": "x" * 65}, "approximator"),
    ("factorized", {"upload": 5}, "upload"), ("factorized", {"l1_detached": 1}, "l1_detached"),
    ("factorized", {"clip": -1.0}, "clip"), ("pfedpara", {"upload": [3]}, "upload"),
    ("fedfomo", {"candidates": [-1]}, "candidates"),
])
def test_a_task_whose_algorithm_keys_do_not_fit_fails_naming_the_key(algo, body, key):
    cfg = small_config(algo={"name": algo})
    with pytest.raises(ProtocolError, match=f"task body.{key}"):
        check_work(body, cfg)


def test_a_task_whose_algorithm_keys_fit_passes():
    check_work({"classes": 10, "approximator": "confidence", "epochs": 1},
               small_config(algo={"name": "fedseq"}))
    check_work({"upload": ["u0"], "lambda": 0.1, "clip": 0.0, "l1_detached": True},
               small_config(algo={"name": "factorized"}))
    check_work({"classes": "ten"}, small_config())  # fedavg declares no classes: free, bounded


def test_a_result_whose_algorithm_keys_do_not_fit_is_the_clients_failure(tmp_path, monkeypatch):
    orig = FedFomoClient.run

    def run(self, ctx, task):
        arrays, body = orig(self, ctx, task)
        return arrays, ({**body, "candidates": ["peer"]} if ctx.cid == 0 else body)

    monkeypatch.setattr(FedFomoClient, "run", run)
    s = run_local(small_config(algo={"name": "fedfomo"}, out=str(tmp_path / "run")), quiet=True)
    bad = [f for f in s["failures"] if f["client"] == 0]
    assert bad and all("result refused: result body.candidates" in f["reason"] for f in bad)
    assert {f["client"] for f in s["failures"]} == {0}  # the others were aggregated
    assert s["status"] == "completed"


def test_register_refuses_a_kind_it_does_not_know():
    spec = dataclasses.replace(get("fedavg"), name="fedavg_body_kinds", task_body={"x": "vector"})
    with pytest.raises(ValueError, match="body kinds"):
        register(spec)


def test_a_plugins_declared_key_is_checked_too():
    from fednet.algorithms.spec import REGISTRY

    spec = register(Spec("body_kinds_plugin", "test", "fednet.algorithms.fedavg:FedAvg",
                         "fednet.algorithms.fedavg:FedAvgClient", task_body={"temp": "number"}))
    try:
        assert spec.task_body == {"temp": "number"}
        with pytest.raises(ProtocolError, match="task body.temp"):
            check_work({"temp": "hot"}, small_config(algo={"name": "body_kinds_plugin"}))
    finally:
        del REGISTRY["body_kinds_plugin"]
