"""fednet sweep without running anything: the grid, the cells, the metric, the best settings and
the table (the real command runs in tests/integration/test_sweep_cli.py)."""
from __future__ import annotations

import json

import pytest

from fednet.cli import local
from fednet.errors import ConfigError
from fednet.metrics import sweep_table as T
from fednet.metrics.export import cells_csv
from fednet.cli.sweep_options import ClickCells
from fednet.sweep.runner import Options, prepare
from fednet.sweep.grid import parse_grid, plan

FLAGS = ClickCells(local, {}).flags


def test_grid_options_become_axes_and_flags_stay_fixed():
    axes, fixed = parse_grid(["--lr", "0.05,0.1", "--param", "mu=0.01,0.1", "--permute",
                              "--seed=0,1,2", "--gpus", "0,1"], FLAGS, "here")
    assert [(a.name, a.flag, a.values) for a in axes] == [
        ("lr", "--lr", ("0.05", "0.1")), ("mu", "--param", ("0.01", "0.1")),
        ("seed", "--seed", ("0", "1", "2")), ("gpus", "--gpus", ("0,1",))]  # --gpus: a list
    assert fixed == ["--permute"]
    assert axes[1].args("0.1") == ["--param", "mu=0.1"]


@pytest.mark.parametrize("tokens,message", [
    (["0.1"], "here: '0.1' is not an option; write --NAME V1,V2,... (e.g. --lr 0.05,0.1)"),
    (["--lr"], "here: --lr needs a value"),
    (["--lr", "0.1,,0.2"], "here: --lr 0.1,,0.2: give distinct, non-empty values separated by commas"),
    (["--lr", "0.1,0.1"], "here: --lr 0.1,0.1: give distinct, non-empty values separated by commas"),
    (["--lr", "0.1", "--lr", "0.2"], "here: --lr lr is given twice; list its values once, "
                                     "separated by commas"),
    (["--param", "mu"], "here: --param expects KEY=V1,V2,... (got 'mu')"),
    (["--out", "x"], "here: --out is chosen by fednet sweep for each cell; drop it"),
    (["--resume=x"], "here: --resume is chosen by fednet sweep for each cell; drop it"),
])
def test_bad_grid_options_are_one_line(tokens, message):
    with pytest.raises(ConfigError) as e:
        parse_grid(tokens, FLAGS, "here")
    assert str(e.value) == message


def test_plan_methods_with_their_own_grids_and_names():
    cells, axes = plan(["--lr", "0.1,0.2", "--seed", "0,1"], ["--clients", "3"],
                       ["avg=--algo fedavg", "seq=--algo fedseq --lr 0.05 --grouping random"],
                       ["algo"], FLAGS)
    assert [c.name for c in cells] == [
        "avg__lr=0.1__seed=0", "avg__lr=0.1__seed=1", "avg__lr=0.2__seed=0", "avg__lr=0.2__seed=1",
        "seq__lr=0.05__seed=0", "seq__lr=0.05__seed=1"]  # seq's own --lr replaces the sweep's
    assert axes == {"avg": {"lr": ["0.1", "0.2"]}, "seq": {"lr": ["0.05"]}}
    c = cells[-1]
    assert (c.method, c.setting, c.seed, c.folder) == ("seq", {"lr": "0.05"}, "1",
                                                       "cells/seq__lr=0.05__seed=1")
    assert c.args == ["--clients", "3", "--lr", "0.05", "--seed", "1", "--algo", "fedseq",
                      "--grouping", "random"]  # one-value options: fixed, not in the name


def test_plan_by_algo_and_another_axis():
    cells, _ = plan(["--algo", "fedavg,fedprox", "--partition", "iid,shards", "--lr", "0.1"],
                    [], [], ["algo", "partition"], FLAGS)
    assert [(c.method, c.setting) for c in cells][:2] == [
        ("fedavg partition=iid", {}), ("fedavg partition=shards", {})]  # one lr: fixed
    assert cells[0].name == "fedavg_partition=iid"
    solo, _ = plan([], ["--algo", "fedprox"], [], ["algo"], FLAGS)  # no grid: one cell
    assert [(c.name, c.method, c.args) for c in solo] == [("fedprox", "fedprox",
                                                           ["--algo", "fedprox"])]


def test_every_cell_is_checked_before_anything_runs(tmp_path):
    o = Options(str(tmp_path / "sw"), ["--algo", "fedavg,fedseq", "--mu", "0.1"])
    with pytest.raises(ConfigError, match=r"^cell fedavg: --mu does not apply to fedavg \(it is"):
        prepare(o, ClickCells(local, {"clients": 10}))
    o = Options(str(tmp_path / "sw"), ["--lr", "0.1"], methods=["bad name=--lr 1"])
    with pytest.raises(ConfigError, match=r"^--method 'bad name=--lr 1': write NAME=OPTIONS"):
        prepare(o, ClickCells(local, {"clients": 10}))
    o = Options(str(tmp_path / "sw"), ["--lr", "0.1"], baseline="nosuch")
    with pytest.raises(ConfigError, match=r"^--baseline nosuch: not a method of this sweep; "
                                          r"its methods: fedavg$"):
        prepare(o, ClickCells(local, {"clients": 10}))
    assert not (tmp_path / "sw").exists()


def test_metrics():
    rows = [{"round": i, "accuracy": a, "sim_s": 2.0 * i, "bytes_total": 100 * (i + 1)}
            for i, a in enumerate([0.1, 0.5, 0.85, 0.95])]
    s = {"final_accuracy": 0.95, "best_accuracy": 0.95}
    assert T.parse_metric("rounds_to:0.9").of(s, rows, None) == 4
    assert T.parse_metric("rounds_to:0.9").of(s, rows, 0.9) == 3  # 0.81 of the reference
    assert T.parse_metric("sim_to:0.5").of(s, rows, None) == 2.0
    assert T.parse_metric("bytes_to:0.5").of(s, rows, None) == 200
    assert T.parse_metric("rounds_to:0.99").of(s, rows, None) is None
    assert T.parse_metric("final_accuracy").of(s, rows, None) == 0.95
    for bad in ("rounds_to", "rounds_to:1.5", "rounds_to:x", "accuracy", "final_accuracy:0.9"):
        with pytest.raises(ConfigError, match="^--metric"):
            T.parse_metric(bad)


def _rec(method, lr, seed, value, final=0.9, status="completed"):
    return {"name": f"{method}-{lr}-{seed}", "method": method, "setting": {"lr": lr},
            "seed": seed, "folder": "x", "status": status, "value": value,
            "final_accuracy": final, "show": {}}


def test_best_setting_mean_spread_and_notes():
    spec = {"metric": "rounds_to:0.9", "baseline": "a", "show": []}
    recs = [_rec("a", "0.05", "0", 80), _rec("a", "0.05", "1", 90),
            _rec("a", "0.1", "0", 30), _rec("a", "0.1", "1", 34),
            _rec("a", "0.2", "0", 20), _rec("a", "0.2", "1", None),  # one seed not reached
            _rec("a", "0.4", "0", 60), _rec("a", "0.4", "1", 70),
            _rec("b", "0.1", "0", 10), _rec("b", "0.1", "1", 12),
            _rec("b", "0.2", "0", 15), _rec("b", "0.2", "1", None, status="interrupted")]
    res = T.evaluate(spec, recs)
    best = {b["method"]: b for b in res["best"]}
    assert best["a"]["text"] == "lr=0.1"  # both seeds reached beats a faster single seed
    assert (best["a"]["mean"], best["a"]["reached"], best["a"]["min"], best["a"]["max"]) == \
        (32, 2, 30, 34)
    assert best["a"]["sd"] == pytest.approx(2 ** 1.5)
    assert best["b"]["text"] == "lr=0.1" and best["b"]["mean"] == 11
    assert res["notes"] == [
        "b: the best lr=0.1 is the smallest value tried; widen the grid to be sure the best "
        "lies inside it",
        "1 of 12 cells have not finished (not run or interrupted); their seeds are left out"]
    text = T.render(spec, res)
    lines = text.splitlines()
    assert lines[0] == "metric rounds_to:0.9: until accuracy >= 0.9; lower is better ('-' = not reached)"
    row_a = next(ln for ln in lines if ln.startswith("a "))
    assert row_a.split() == ["a", "lr=0.1", "32.0", "6.6..57.4", "2.8", "30.0..34.0", "2/2",
                             "0.9000", "baseline", "-", "2/2"]
    row_b = next(ln for ln in lines if ln.startswith("b "))
    # paired by seed: 30/10 and 34/12, geometric mean sqrt(8.5); t on the log ratios, df 1
    assert row_b.split()[-5:] == ["2.92x", "[2.03,", "4.19]", "0.017", "2/2"]
    row = next(ln for ln in lines if ln.startswith("a ") and "lr=0.2" in ln)
    assert row.split() == ["a", "lr=0.2", "20.0", "-", "-", "20.0..20.0", "1/2", "0:20.0", "1:-"]
    csv_text = cells_csv(recs, ["lr"], [])
    assert csv_text.splitlines()[0] == ("cell,method,lr,seed,status,value,final_accuracy,"
                                        "best_accuracy,rounds,sim_time_s,wall_clock_s,seconds,"
                                        "flag,folder")
    assert len(csv_text.splitlines()) == 13


def test_accuracy_metric_ranks_highest_mean(tmp_path):
    spec = {"metric": "final_accuracy", "show": []}
    recs = [_rec("a", "0.1", "0", 0.8), _rec("a", "0.1", "1", 0.9),
            _rec("a", "0.2", "0", 0.86), _rec("a", "0.2", "1", 0.86),
            _rec("a", "0.3", "0", 0.5), _rec("a", "0.3", "1", 0.6)]
    (b,) = T.evaluate(spec, recs)["best"]
    assert (b["text"], b["mean"]) == ("lr=0.2", pytest.approx(0.86))


def test_load_sweep_rereads_the_cells(tmp_path):
    cell = tmp_path / "cells" / "c"
    cell.mkdir(parents=True)
    (cell / "summary.json").write_text(json.dumps({"status": "completed", "final_accuracy": 0.7,
                                                   "best_accuracy": 0.8}))
    (cell / "metrics.jsonl").write_text(json.dumps({"round": 0, "accuracy": 0.8}) + "\n")
    (tmp_path / "sweep.json").write_text(json.dumps({
        "spec": {"metric": "rounds_to:0.5", "show": ["best_accuracy"]},
        "cells": [{"name": "c", "method": "m", "setting": {}, "seed": "", "folder": "cells/c"}]}))
    spec, (r,) = T.load_sweep(tmp_path)
    assert (r["status"], r["value"], r["show"]) == ("completed", 1.0, {"best_accuracy": 0.8})
    with pytest.raises(ConfigError, match="is not a sweep folder"):
        T.load_sweep(cell)


def test_failed_and_diverged_cells_are_named_and_never_tabled():
    spec = {"metric": "final_accuracy", "show": []}
    recs = [_rec("a", "0.1", "0", 0.9), _rec("a", "0.1", "1", 0.1, status="diverged"),
            _rec("a", "0.2", "0", 0.1, status="failed"), _rec("a", "0.2", "1", 0.8)]
    res = T.evaluate(spec, recs)
    a = {s["text"]: s for s in res["settings"]}
    assert (a["lr=0.1"]["done"], a["lr=0.1"]["mean"]) == (1, 0.9)
    assert (a["lr=0.2"]["done"], a["lr=0.2"]["mean"]) == (1, 0.8)
    assert "1 of 4 cells diverged (a lr=0.1 seed 1): left out of the table, not results" in \
        res["notes"]
    assert "1 of 4 cells failed (a lr=0.2 seed 0): left out of the table, not results" in \
        res["notes"]
