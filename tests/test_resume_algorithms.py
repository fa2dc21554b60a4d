"""Every algorithm resumes: a `fednet local` run stopped right after a checkpoint and resumed
ends exactly where an unbroken run ends (final model, personal models and client state, bytes,
simulated time, accuracy). The runs are the golden ones (benchmarks/golden.py) with
--checkpoint-every 1."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fednet.algorithms import client_class, names
from fednet.core.inproc import run_local

from tests.harness import LEDGER_KEYS as KEYS, PINNED, golden
from tests.harness import Stop, stop_after

STOP = 2  # the run is stopped after the checkpoint of round 1 (two rounds done)


def _config(algo: str, out: Path):
    cfg = golden.config(algo, str(out)).replace(**{"net.checkpoint_every": 1})
    if algo == "fedseq_inter":  # two periods of two rounds: a checkpoint between them
        cfg = cfg.replace(**{"rounds": 4, "algo.params.period": 2})
    if algo in ("fedasync", "fedbuff"):  # drains every two rounds: a checkpoint there
        cfg = cfg.replace(**{"rounds": 4, "algo.params.drain": 2})
    return cfg


def _run(cfg, **kw):
    """The run's record as benchmarks/golden.py pins it (model, personal models and client
    state as hashes, and the summary's numbers); None when it was stopped."""
    with golden.capture_dispatcher() as seen:
        try:
            summary = run_local(cfg, quiet=True, **kw)
        except Stop:
            return None
    with np.load(Path(cfg.out) / "final_model.npz", allow_pickle=False) as z:
        model = {k: z[k] for k in z.files}
    models, state = golden.client_arrays(seen[0])
    return {"summary": summary, "model_sha256": golden.sha256_arrays(model),
            "client_models_sha256": golden.sha256_arrays(models),
            "client_state_sha256": golden.sha256_arrays(state) if state else None,
            **{k: summary[k] for k in ("bytes", "sim_time_s", "final_accuracy", "status",
                                       "rounds")}}


def _reference(algo: str, out: Path) -> dict:
    """An unbroken run's record: the golden pin where the run is the golden one (a checkpoint
    every round changes no number), else a run of its own."""
    cfg = _config(algo, out)
    if cfg.replace(**{"net.checkpoint_every": 0}) == golden.config(algo, str(out)):
        return {**PINNED[algo], "rounds": cfg.rounds}
    return _run(cfg)


@pytest.mark.parametrize("algo", names())
def test_a_resumed_local_run_ends_where_an_unbroken_run_ends(algo, tmp_path):
    ref = _reference(algo, tmp_path / "ref")
    cfg = _config(algo, tmp_path / "run")
    assert _run(cfg, prepare=stop_after(STOP)) is None
    saved = json.loads((tmp_path / "run" / "checkpoint" / "state.json").read_text())
    assert saved["rounds_done"] == STOP and saved["client_state"] == "files"
    if client_class(algo).stateful():  # the clients' store is the checkpoint's clients/
        assert any((tmp_path / "run" / "checkpoint" / "clients").glob("c*.npz"))
    got = _run(cfg, resume=True)
    assert got["status"] == ref["status"] == "completed" and got["rounds"] == ref["rounds"]
    assert got["model_sha256"] == ref["model_sha256"], "final model"
    assert got["client_state_sha256"] == ref["client_state_sha256"], "the clients' state"
    if client_class(algo).keeps_model:  # the others load the whole model from every task
        assert got["client_models_sha256"] == ref["client_models_sha256"], "personal models"
    assert {k: got["bytes"][k] for k in KEYS} == {k: ref["bytes"][k] for k in KEYS}
    assert got["sim_time_s"] == ref["sim_time_s"]
    assert got["final_accuracy"] == ref["final_accuracy"]
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == list(range(cfg.rounds))


def test_client_state_kept_in_a_checkpoint_by_fednet_local_is_not_resumed_by_launch(tmp_path):
    """Only a state that no store could hold (no results folder, a store that could not be
    written) is kept in the checkpoint itself, by fednet local; fednet launch's clients read
    the store: resuming such a run under launch would silently lose the clients' state."""
    from fednet.core import checkpoint
    from fednet.errors import ConfigError
    from fednet.core.session import Session

    cfg = _config("scaffold", tmp_path / "run")
    run_local(cfg, quiet=True)
    more = cfg.replace(rounds=cfg.rounds + 1)  # (a completed run resumes only to run more)
    Session(more, quiet=True, resume=True)  # the store: either runtime
    js = tmp_path / "run" / "checkpoint" / "state.json"
    state = json.loads(js.read_text())
    js.write_text(json.dumps({**state, "client_state": "checkpoint"}))
    with pytest.raises(ConfigError, match="kept in this checkpoint by fednet local"):
        Session(more, quiet=True, resume=True)  # as fednet launch builds it
    assert checkpoint.read(tmp_path / "run", more)  # fednet local still reads it
