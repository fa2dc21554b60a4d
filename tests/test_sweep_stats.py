"""Statistics that survive review (confidence intervals, a method against the baseline paired by
seed) checked against scipy's own tests, the CSV exports of `fednet report` (the table and the
curves), and overlay plots that group seeds, mark runs that did not complete and take a log axis."""
from __future__ import annotations

import csv
import io
import json
import math

import pytest
from click.testing import CliRunner
from scipy import stats as sps

from fednet.cli import main
from fednet.metrics import sweep_table as T
from fednet.metrics.plots import label_curves, _series
from fednet.metrics.intervals import fmt_p, fmt_versus, mean_ci, versus
from tests.harness import fake_run


def test_mean_ci_is_the_t_interval():
    lo, hi = mean_ci([1.0, 2.0, 3.0])
    half = 4.302652729911275 / math.sqrt(3)  # t(0.975, df 2) x sd 1 / sqrt(3)
    assert (lo, hi) == (pytest.approx(2 - half), pytest.approx(2 + half))
    assert mean_ci([5.0]) is None


def test_an_interval_stays_within_the_metrics_range():
    """A collapsed seed among good ones: the t interval of the accuracies would reach past 1
    and below 0 (-0.57..1.94 in the issue); clipped to [0, 1]. A difference of two accuracies
    stays within [-1, 1]."""
    lo, hi = mean_ci([0.1, 0.97, 0.98], bounds=(0.0, 1.0))
    assert lo == 0.0 and hi == 1.0
    raw = mean_ci([0.1, 0.97, 0.98])
    assert raw[0] < 0 and raw[1] > 1
    v = versus({0: 0.1, 1: 0.97, 2: 0.98}, {0: 0.97, 1: 0.1, 2: 0.1}, higher=True)
    assert -1.0 <= v["lo"] and v["hi"] <= 1.0


def test_accuracies_against_the_baseline_match_scipys_paired_test():
    mine, base = {0: 0.9, 1: 0.8, 2: 0.85}, {0: 0.8, 1: 0.8, 2: 0.8}
    v = versus(mine, base, higher=True)
    ref = sps.ttest_rel([0.9, 0.8, 0.85], [0.8, 0.8, 0.8])
    ci = ref.confidence_interval()
    assert (v["pairs"], v["seeds"]) == (3, 3)
    assert v["estimate"] == pytest.approx(0.05) and v["p"] == pytest.approx(ref.pvalue)
    assert (v["lo"], v["hi"]) == (pytest.approx(ci.low), pytest.approx(ci.high))
    assert fmt_versus(v, True) == f"+0.0500 [{ci.low:+.4f}, {ci.high:+.4f}]"


def test_speedups_pair_only_the_seeds_where_both_reached_the_target():
    mine, base = {0: 10.0, 1: 12.0, 2: None, 3: 8.0}, {0: 30.0, 1: 34.0, 2: 40.0, 3: None}
    v = versus(mine, base, higher=False)
    assert (v["pairs"], v["seeds"]) == (2, 4)  # seeds 2 and 3: one of the two did not reach it
    assert v["estimate"] == pytest.approx(math.sqrt(3.0 * 34 / 12))  # geometric mean of ratios
    ref = sps.ttest_rel([math.log(30), math.log(34)], [math.log(10), math.log(12)])
    assert v["p"] == pytest.approx(ref.pvalue)
    ci = ref.confidence_interval()
    assert (v["lo"], v["hi"]) == (pytest.approx(math.exp(ci.low)), pytest.approx(math.exp(ci.high)))
    one = versus({0: 5.0, 1: None}, {0: 10.0, 1: 9.0}, higher=False)
    assert (one["pairs"], one["estimate"], one["lo"], one["p"]) == (1, 2.0, None, None)
    assert fmt_versus(one, False) == "2.00x" and fmt_p(one["p"]) == "-"
    none = versus({0: None}, {0: 10.0}, higher=False)
    assert none["pairs"] == 0 and fmt_versus(none, False) == "-"
    same = versus({0: 5.0, 1: 6.0}, {0: 10.0, 1: 12.0}, higher=False)  # every ratio 2: no test
    assert (same["estimate"], same["lo"], same["hi"], same["p"]) == (
        pytest.approx(2.0), pytest.approx(2.0), pytest.approx(2.0), None)
    assert fmt_p(0.0004) == "<0.001" and fmt_p(0.0421) == "0.042"


def _sweep(root, values):
    """A sweep folder: methods a and b, seeds 0-2, rounds_to:0.5 given by each cell's rows."""
    cells = []
    for (method, seed), first in values.items():
        name = f"{method}__seed={seed}"
        folder = root / "cells" / name
        folder.mkdir(parents=True)
        rows = [{"round": r, "accuracy": 0.6 if r + 1 >= first else 0.2, "sim_s": r + 1.0,
                 "bytes_round": {"server_to_client": 10, "client_to_server": 5}}
                for r in range(6)]
        (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (folder / "summary.json").write_text(json.dumps(
            {"status": "completed", "final_accuracy": rows[-1]["accuracy"]}))
        cells.append({"name": name, "method": method, "setting": {}, "seed": str(seed),
                      "folder": f"cells/{name}"})
    (root / "sweep.json").write_text(json.dumps({"spec": {"metric": "rounds_to:0.5", "show": [],
                                                          "baseline": "a"}, "cells": cells}))
    return root


def test_report_exports_the_table_and_the_curves(tmp_path):
    sw = _sweep(tmp_path / "sw", {("a", 0): 4, ("a", 1): 6, ("a", 2): 5,
                                  ("b", 0): 2, ("b", 1): 4, ("b", 2): 9})  # b seed 2: never
    run = fake_run(tmp_path / "run")
    res = CliRunner().invoke(main, ["report", str(sw), str(run), "--csv", str(tmp_path / "t.csv"),
                                    "--curves", str(tmp_path / "c.csv")])
    assert res.exit_code == 0, res.output
    row = next(ln.split() for ln in res.output.splitlines() if ln.startswith("b "))
    assert row[:7] == ["b", "-", "3.0", "0.0..15.7", "1.4", "2.0..4.0", "2/3"]
    ref = sps.ttest_rel([math.log(4), math.log(6)], [math.log(2), math.log(4)])
    assert row[-5:] == ["1.73x", *row[-4:-2], f"{ref.pvalue:.3f}", "2/3"]
    table = list(csv.DictReader(io.StringIO((tmp_path / "t.csv").read_text())))
    b = next(r for r in table if r["method"] == "b")
    assert (b["kind"], b["best"], b["reached"], b["planned"], b["pairs"]) == ("sweep", "1", "2",
                                                                              "3", "2")
    assert float(b["vs_baseline"]) == pytest.approx(math.sqrt(4 / 2 * 6 / 4), rel=1e-5)
    assert float(b["mean"]) == 3.0 and float(b["ci_hi"]) == pytest.approx(
        3.0 + 12.706204736 * math.sqrt(2) / math.sqrt(2), rel=1e-5)
    r = next(r for r in table if r["kind"] == "run")
    assert (r["method"], r["status"], r["final_accuracy"]) == ("fedavg", "completed", "0.5")
    curves = list(csv.DictReader(io.StringIO((tmp_path / "c.csv").read_text())))
    assert len(curves) == 6 * 6 + 3
    last = [c for c in curves if c["method"] == "a" and c["seed"] == "1"][-1]
    assert (last["round"], last["bytes_total"], last["bytes_server_to_client"]) == ("5", "90", "60")


def test_run_folders_that_differ_only_in_seed_are_one_curve(tmp_path):
    runs = [fake_run(tmp_path / f"s{s}", seed=s) for s in (0, 1, 2)]
    other = fake_run(tmp_path / "lr", train={"lr": 0.05})
    again = fake_run(tmp_path / "again", seed=0)  # seed 0 once more: its own curve, not a mean
    (again / "summary.json").unlink()  # and still running
    series, _ = _series([str(p) for p in (*runs, other, again)])
    label_curves(series)
    assert [len(s["runs"]) for s in series] == [3, 1, 1]
    assert series[0]["label"].startswith("fedavg [--lr ") and series[0]["label"].endswith(
        ", 3 seeds")
    assert "--lr 0.05" in series[1]["label"]
    assert series[2]["label"].endswith("(running)")
    res = CliRunner().invoke(main, ["report", *map(str, (*runs, other, again)), "--plot",
                                    str(tmp_path / "p.svg"), "--log-x"])
    assert res.exit_code == 0, res.output
    svg = (tmp_path / "p.svg").read_text()
    assert "triangle: still running" in svg and "log-scale time and traffic" in svg


def test_a_diverged_run_is_marked(tmp_path):
    ok, bad = fake_run(tmp_path / "ok"), fake_run(tmp_path / "bad", train={"lr": 9.0})
    s = json.loads((bad / "summary.json").read_text())
    (bad / "summary.json").write_text(json.dumps(dict(s, status="diverged")))
    series, _ = _series([str(ok), str(bad)])
    label_curves(series)
    assert series[1]["label"].endswith("(diverged)") and series[1]["statuses"] == ["diverged"]
    assert T.RESULTS == ("completed", "budget_spent")  # (a DP run that spent its budget)


def test_the_plots_star_is_the_tabled_mean_of_first_crossings():
    """Seed 0 reaches 0.9 at round 2, seed 1 at round 6: the table says 4.0 rounds (their
    mean); the mean curve crosses 0.9 only at round 6. The star is drawn at the table's 4.0."""
    from fednet.metrics.plots import _first_reached
    from fednet.metrics.sweep_table import parse_metric

    def rows(first):
        return [{"round": r, "accuracy": 0.95 if r + 1 >= first else 0.5, "sim_s": 1.5 * (r + 1),
                 "bytes_total": 100 * (r + 1)} for r in range(8)]
    runs = [rows(2), rows(6)]
    m = parse_metric("rounds_to:0.9")
    tabled = sum(m.of({}, r, None) for r in runs) / 2
    assert tabled == 4.0 and _first_reached(runs, "round", 0.9) == 4.0
    assert _first_reached(runs, "sim_time", 0.9) == 6.0
    assert _first_reached([rows(99)], "round", 0.9) is None


def test_curves_are_not_labelled_by_where_their_runs_ran():
    """Issue 41 item 7: two runs that differ in --port and --lr are told apart by lr only."""
    from fednet.metrics.plots import label_curves

    def series(port, lr):
        return {"label": "fedavg", "info": {"algorithm": "fedavg"}, "runs": [[{}]],
                "statuses": ["completed"], "seeds": ["0"],
                "config": {"net.port": port, "train.lr": lr, "out": f"runs/{port}"}}
    got = [series(0, 0.1), series(5555, 0.2)]
    label_curves(got)
    assert [s["label"] for s in got] == ["fedavg [--lr 0.1]", "fedavg [--lr 0.2]"]
