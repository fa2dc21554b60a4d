"""Resumable by default: a run interrupted while a round's tasks are out (Ctrl-C, SIGTERM) and
started without --checkpoint-every writes a checkpoint of its last finished round, and `--resume`
ends exactly where an unbroken run ends, with wall-clock that goes on across the segments. Where
the server's state changes as replies come (FedAsync, FedBuff), nothing is written and the
interrupt message says so."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from fednet.algorithms import client_class, get, names
from fednet.core.inproc import run_local
from fednet.metrics.run_end import interrupt_note

from tests.harness import LEDGER_KEYS as KEYS, PINNED, golden
from tests.harness import final_model, interrupt_in



def _resumable(algo: str) -> bool:
    return not get(algo).server.endswith(("FedAsync", "FedBuff"))




def _golden_config(algo: str, out: Path):
    """The golden run (3 rounds), interrupted in its last round, so that the pinned numbers are
    the unbroken run's; FedSeqInter in periods of 2 of 4 rounds (an interrupt falls between)."""
    cfg = golden.config(algo, str(out))
    if algo == "fedseq_inter":
        cfg = cfg.replace(**{"rounds": 4, "algo.params.period": 2})
    if not _resumable(algo):  # a reply of round 2 or later comes only in a longer run
        cfg = cfg.replace(rounds=4)
    return cfg


def _unbroken(algo: str, out: Path) -> dict:
    """The unbroken run's numbers: the golden pin, or a run of its own (FedSeqInter here)."""
    cfg = _golden_config(algo, out)
    if cfg == golden.config(algo, str(out)):
        return PINNED[algo]
    s = run_local(cfg, quiet=True)
    return {**s, "model_sha256": golden.sha256_arrays(final_model(out))}


@pytest.mark.parametrize("algo", names())
def test_an_interrupted_run_resumes_without_checkpoints_asked_for(algo, tmp_path):
    cfg = _golden_config(algo, tmp_path / "run")
    with pytest.raises(KeyboardInterrupt):
        run_local(cfg, quiet=True, prepare=interrupt_in(2))
    out = tmp_path / "run"
    state = out / "checkpoint" / "state.json"
    note = interrupt_note("local", str(out), 0.0, lambda _: None)
    if not _resumable(algo):
        assert not state.exists() and "cannot be resumed" in note
        return
    assert json.loads(state.read_text())["rounds_done"] == 2
    assert f"`fednet local --resume {out}`" in note
    got = run_local(cfg, quiet=True, resume=True)
    ref = _unbroken(algo, tmp_path / "ref")
    assert got["status"] == ref["status"] == "completed" and got["rounds"] == cfg.rounds
    assert golden.sha256_arrays(final_model(out)) == ref["model_sha256"], "final model"
    assert {k: got["bytes"][k] for k in KEYS} == {k: ref["bytes"][k] for k in KEYS}
    assert got["sim_time_s"] == ref["sim_time_s"]
    assert got["final_accuracy"] == ref["final_accuracy"]
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == list(range(cfg.rounds))
    walls = [r["wall_s"] for r in rows]
    assert walls == sorted(walls), "wall-clock goes on across the segments"
    seg = got["segments"]
    assert [s["rounds"] for s in seg] == [[0, 2], [2, cfg.rounds]]
    if client_class(algo).stateful():  # the clients' state from before the interrupted round
        assert any((out / "checkpoint" / "clients").glob("c*.prev.npz"))
    assert got["wall_clock_s"] == pytest.approx(sum(s["wall_s"] for s in seg))
