"""Differential privacy in whole runs (small in-process ones): the noise calibrated to
--dp-epsilon and said, the budget that stops a run as budget_spent (a result: exit code 0),
a resumed run that ends where an unbroken one ends (the accountant's history and the adaptive
clip norm are in the checkpoint), and epsilon in the report, the plots and the trackers."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("dp_accounting")

from fednet.core.checkpoint import ENDED  # noqa: E402
from fednet.core.inproc import run_local  # noqa: E402
from fednet.metrics.report import summary_rows  # noqa: E402
from fednet.metrics.run_end import run_error, run_note  # noqa: E402
from tests.conftest import run_for_model, same_arrays, small_config  # noqa: E402

CENTRAL = {"mode": "central", "noise": 0.6, "clip": 0.5}


def _rows(folder: Path) -> list[dict]:
    return [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines()]


def test_the_noise_is_calibrated_to_the_budget_and_the_run_spends_it(tmp_path, capsys):
    cfg = small_config(clients=4, rounds=3, algo={"fraction": 0.5},
                       dp={"mode": "central", "epsilon": 6.0, "clip": 0.5})
    s, _ = run_for_model(cfg, tmp_path, "cal")
    dp = s["dp"]
    assert s["status"] == "completed" and dp["noise_calibrated"] and dp["budget"] == 6.0
    assert 6.0 * 0.99 <= dp["epsilon"] <= 6.0  # the planned rounds spend the budget
    saved = (tmp_path / "cal" / "config.toml").read_text()
    assert f"noise = {dp['noise_multiplier']!r}" in saved  # what the clients received


def test_a_run_that_would_exceed_its_budget_stops_as_budget_spent(tmp_path):
    cfg = small_config(clients=4, rounds=5, algo={"fraction": 0.5},
                       dp={**CENTRAL, "epsilon": 14.0})  # 13.6 after 3 rounds, 15.8 after 4
    s, _ = run_for_model(cfg, tmp_path, "b")
    rows = _rows(tmp_path / "b")
    assert s["status"] == "budget_spent" and "budget_spent" in ENDED
    assert s["rounds"] == len(rows) == 3 and rows[-1]["epsilon"] <= 14.0
    assert s["dp"]["epsilon"] == rows[-1]["epsilon"]
    assert run_error(s) is None  # a result, exit code 0
    note = run_note(s)
    # rounds counted from 1, as the progress lines count them: the 4th would exceed the budget
    assert note.startswith("the privacy budget is spent: round 4 would reach epsilon 15.77 > "
                           "--dp-epsilon 14; stopped after 3 rounds"), note
    labels = dict(summary_rows(s))
    assert labels["privacy (user)"].startswith(f"epsilon {rows[-1]['epsilon']:.4g} at delta 1e-05")
    assert labels["privacy budget"] == "epsilon 14"
    assert (tmp_path / "b" / "accuracy_vs_epsilon.png").is_file()


@pytest.mark.parametrize("algo, dp", [
    ("fedadam", {**CENTRAL, "adaptive": True, "count_noise": 1.0}),
    ("fedavg", {"mode": "local", "noise": 0.05, "sgd_noise": 1.0})], ids=["central", "local-sgd"])
def test_a_resumed_private_run_ends_where_an_unbroken_one_ends(tmp_path, algo, dp):
    """Adaptive clipping on FedAdam: the clip norm, the events and the server optimizer's
    moments all come back from the checkpoint; local DP with DP-SGD: the tasks per client."""
    cfg = small_config(clients=4, rounds=3, algo={"name": algo, "fraction": 0.5}, dp=dp)
    ref, ref_model = run_for_model(cfg, tmp_path, "ref")
    part = cfg.replace(rounds=2, **{"net.checkpoint_every": 1, "out": str(tmp_path / "run")})
    run_local(part, quiet=True)
    got = run_local(part.replace(rounds=3), quiet=True, resume=True)
    with np.load(tmp_path / "run" / "final_model.npz", allow_pickle=False) as z:
        resumed = {k: z[k] for k in z.files}
    assert same_arrays(resumed, ref_model) and got["dp"] == ref["dp"]
    assert algo != "fedadam" or got["dp"]["clip"] != 0.5  # (adaptive: it moved)
    assert [r["epsilon"] for r in _rows(tmp_path / "run")] == \
        [r["epsilon"] for r in _rows(tmp_path / "ref")]
    assert got["rounds"] == 3 and (tmp_path / "run" / "accuracy_vs_epsilon.png").is_file()


def test_report_plots_accuracy_against_epsilon(tmp_path):
    from fednet.metrics.plots import plot_overlay

    for seed in (1, 2):
        cfg = small_config(clients=4, rounds=2, seed=seed, algo={"fraction": 0.5}, dp=CENTRAL)
        run_for_model(cfg, tmp_path, f"s{seed}")
    path = plot_overlay([str(tmp_path / "s1"), str(tmp_path / "s2")], tmp_path / "cmp.png")
    assert path.is_file() and path.stat().st_size > 0


def test_the_trackers_get_epsilon_with_every_row():
    from fednet.metrics.tracking import _STATUS, scalars

    row = {"round": 0, "accuracy": 0.5, "epsilon": 1.25, "dp_sgd_epsilon": 3.5}
    assert scalars(row)["epsilon"] == 1.25 and scalars(row)["dp_sgd_epsilon"] == 3.5
    assert _STATUS["budget_spent"] == "FINISHED"
