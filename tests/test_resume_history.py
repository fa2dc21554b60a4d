"""A run's finished rounds are history: no --resume rewinds or cuts them, and an interrupted
run's summary reports its last finished round (rounds, simulated time, bytes, messages), for
every algorithm, the asynchronous ones included."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from fednet.core.inproc import run_local
from fednet.errors import ConfigError
from tests.conftest import small_config
from tests.harness import interrupt_in, resume_config, final_model

DIRECTIONS = ("server_to_client", "client_to_server", "client_to_client")


def _rows(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def _state(out: Path) -> dict:
    return json.loads((out / "checkpoint" / "state.json").read_text())


def test_a_resumed_run_that_finishes_checkpoints_its_last_round_and_cannot_be_cut(tmp_path):
    out = tmp_path / "run"
    cfg = resume_config("scaffold", out)  # 4 rounds, stateful clients
    with pytest.raises(KeyboardInterrupt):
        run_local(cfg, quiet=True, prepare=interrupt_in(2))
    assert _state(out)["rounds_done"] == 2
    run_local(cfg, quiet=True, resume=True)
    assert _state(out)["rounds_done"] == 4, "the finished run's checkpoint is its last round"
    before = (out / "summary.json").read_bytes(), (out / "metrics.jsonl").read_bytes()
    with pytest.raises(ConfigError, match=r"rounds_done is 4, more than --rounds 3"):
        run_local(cfg.replace(rounds=3), quiet=True, resume=True)
    assert ((out / "summary.json").read_bytes(), (out / "metrics.jsonl").read_bytes()) == before
    # more rounds go on from the last one, exactly as an unbroken run of 6
    got = run_local(cfg.replace(rounds=6), quiet=True, resume=True)
    ref = run_local(resume_config("scaffold", tmp_path / "ref").replace(rounds=6), quiet=True)
    assert [r["round"] for r in _rows(out)] == list(range(6))
    assert [s["rounds"] for s in got["segments"]] == [[0, 2], [2, 4], [4, 6]]
    a, b = final_model(out), final_model(tmp_path / "ref")
    assert all(np.array_equal(a[k], b[k]) for k in b)
    assert got["sim_time_s"] == ref["sim_time_s"]
    assert {k: got["bytes"][k] for k in DIRECTIONS} == {k: ref["bytes"][k] for k in DIRECTIONS}


def test_a_checkpoint_older_than_the_finished_run_is_refused(tmp_path):
    out = tmp_path / "run"
    cfg = resume_config("fedavg", out)
    with pytest.raises(KeyboardInterrupt):
        run_local(cfg, quiet=True, prepare=interrupt_in(2))
    shutil.copytree(out / "checkpoint", tmp_path / "old")
    run_local(cfg, quiet=True, resume=True)
    shutil.rmtree(out / "checkpoint")
    shutil.copytree(tmp_path / "old", out / "checkpoint")  # e.g. a run of an older version
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    for rounds in (4, 8):
        with pytest.raises(ConfigError, match=r"ended \(completed\) after 4 rounds and its "
                                              r"checkpoint is at round 2: resuming would "
                                              r"replace rounds 3-4"):
            run_local(cfg.replace(rounds=rounds), quiet=True, resume=True)
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before


@pytest.mark.parametrize("algo", ["fedavg", "fedbuff", "fedasync", "fedseq_inter"])
def test_an_interrupted_runs_totals_are_its_last_finished_rounds(algo, tmp_path):
    out = tmp_path / "run"
    cfg = resume_config(algo, out).replace(rounds=6)
    with pytest.raises(KeyboardInterrupt):
        run_local(cfg, quiet=True, prepare=interrupt_in(3))
    s = json.loads((out / "summary.json").read_text())
    rows = [r for r in _rows(out) if not r.get("interim")]
    assert s["status"] == "interrupted"
    assert s["rounds"] == rows[-1]["round"] + 1 >= 1
    assert s["sim_time_s"] == rows[-1]["sim_s"] > 0
    b = s["bytes"]
    assert sum(b[k] for k in DIRECTIONS) == rows[-1]["bytes_total"]
    assert b["header_bytes"] + b["tensor_bytes"] == sum(b[k] for k in DIRECTIONS)


def test_a_completed_run_resumed_without_more_rounds_is_one_line(tmp_path):
    """Nothing to resume: refused in one line that says how to continue it, nothing changed."""
    from fednet.core import checkpoint

    cfg = small_config(clients=4, rounds=2, out=str(tmp_path / "run"),
                       net={"checkpoint_every": 1})
    run_local(cfg, quiet=True)
    before = (tmp_path / "run" / "summary.json").read_bytes()
    with pytest.raises(ConfigError, match=r"completed its 2 rounds: nothing to resume "
                                          r"\(give --rounds 3 or more"):
        checkpoint.read(tmp_path / "run", cfg)
    assert checkpoint.read(tmp_path / "run", cfg.replace(rounds=3))
    assert (tmp_path / "run" / "summary.json").read_bytes() == before
