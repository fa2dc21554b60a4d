"""Issue 41: a seed that collapsed or diverged though its run completed is marked (the rule of
metrics/seed_health.py) in a sweep's tables, sweep.json, CSVs and plot; the tables a paper takes
(--latex booktabs, --markdown) hold the console's cells; fednet.api's errors name keywords."""
from __future__ import annotations

import csv
import io
import json

import pytest
from click.testing import CliRunner

from fednet.cli import local, main
from fednet.cli.sweep_options import ClickCells
from fednet.metrics import paper
from fednet.metrics.paper import Part, Table
from fednet.metrics.seed_health import seed_flag
from fednet.sweep.runner import Options, run_sweep
from fednet.sweep.grid import plan

CHANCE = {"kind": "collapsed", "why": "final accuracy 0.1100, at or below chance (1/10 + 0.02)"}


def _rows(accs, losses):
    return [{"round": i, "accuracy": a, "loss": loss} for i, (a, loss) in enumerate(zip(accs, losses))]


def _s(final, best, classes=10):
    return {"final_accuracy": final, "best_accuracy": best,
            **({"num_classes": classes} if classes else {})}


def test_the_marking_rule_on_synthetic_runs():
    assert seed_flag(_s(0.9, 0.92), _rows([0.5, 0.9], [1.0, 0.3])) is None  # a sound run
    assert seed_flag(_s(0.11, 0.11), _rows([0.1, 0.11], [2.3, 2.29])) == CHANCE
    assert seed_flag(_s(0.125, 0.2), _rows([0.2, 0.125], [2.3, 2.2])) is None  # above 0.12
    assert seed_flag(_s(0.11, 0.11, classes=None), _rows([0.1, 0.11], [2.3, 2.29])) is None
    assert seed_flag(_s(0.4, 0.9, classes=None), _rows([0.9, 0.4], [0.3, 0.8])) == {
        "kind": "collapsed", "why": "final accuracy 0.4000, at most 0.5 x its best 0.9000"}
    assert seed_flag(_s(0.46, 0.9), _rows([0.9, 0.46], [0.3, 0.8])) is None  # more than half
    # null is how metrics.jsonl writes a NaN loss
    assert seed_flag(_s(0.9, 0.9), _rows([0.8, 0.9], [0.5, None])) == {
        "kind": "diverged", "why": "its final loss is not a number"}
    assert seed_flag(_s(0.55, 0.8), _rows([0.8, 0.55], [0.5, 1.6])) == {
        "kind": "diverged", "why": "loss 0.5 -> 1.6 (over 3x its first round's), accuracy "
                                   "0.8000 -> 0.5500"}
    # a loss grown 10x while the accuracy rose is a model grown confident, not a divergence
    assert seed_flag(_s(0.97, 0.97), _rows([0.9, 0.97], [0.1, 1.0])) is None
    interim = [{"round": 1, "accuracy": 0.05, "loss": None, "interim": True}]
    assert seed_flag(_s(0.9, 0.9), _rows([0.8, 0.9], [0.5, 0.3]) + interim) is None


_SEEDS = {("fedavg", "0"): [0.3, 0.6, 0.8, 0.9], ("fedavg", "1"): [0.3, 0.7, 0.85, 0.92],
          ("fedavg", "2"): [0.4, 0.8, 0.9, 0.1],  # reached 0.85, then collapsed to chance
          ("fedprox", "0"): [0.5, 0.9, 0.95, 0.97], ("fedprox", "1"): [0.5, 0.85, 0.96, 0.98],
          ("fedprox", "2"): [0.5, 0.88, 0.94, 0.96]}
_GRID = ["--algo", "fedavg,fedprox", "--seed", "0,1,2"]


class _Done:
    """A cell command that accepts every cell (the cells here are all finished already)."""

    flags = ClickCells(local, {}).flags

    def config(self, args):
        return None


def _finished_sweep(root):
    """A sweep folder whose every cell finished: re-running the command runs nothing."""
    cells, _ = plan(_GRID, [], [], ["algo"], _Done.flags)
    for c in cells:
        folder = root / c.folder
        folder.mkdir(parents=True)
        accs = _SEEDS[(c.method, c.seed)]
        rows = [{"round": r, "accuracy": a, "loss": 2.0 - a, "sim_s": r + 1.0,
                 "bytes_round": {"server_to_client": 10, "client_to_server": 5}}
                for r, a in enumerate(accs)]
        (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (folder / "summary.json").write_text(json.dumps(
            {"status": "completed", "final_accuracy": accs[-1], "best_accuracy": max(accs),
             "num_classes": 10}))
        (folder / "cell.json").write_text(json.dumps(c.record()))
    return root


def test_a_collapsed_seed_is_marked_in_the_table_the_json_the_csvs_and_the_exports(tmp_path):
    root = _finished_sweep(tmp_path / "sw")
    o = Options(str(root), _GRID, metric="sim_to:0.85", baseline="fedavg",
                latex=str(tmp_path / "t.tex"), markdown=str(tmp_path / "t.md"))
    text = run_sweep(o, _Done(), lambda line: None)
    why = "collapsed: final accuracy 0.1000, at or below chance (1/10 + 0.02)"
    lines = text.splitlines()
    best = next(ln for ln in lines if ln.startswith("fedavg "))
    assert best.split()[:7] == ["fedavg", "-", "3.33s", "1.90s..4.77s", "0.58", "3.00s..4.00s",
                                "3/3*"]  # seed 2 reached 0.85 (counted) and is marked
    assert not next(ln for ln in lines if ln.startswith("fedprox ")).split()[6].endswith("*")
    assert lines.count(f"* fedavg seed 2: {why}") == 2  # under each table
    every = [ln for ln in lines if ln.startswith("fedavg ")][1]
    assert every.split()[-3:] == ["0:4.00s", "1:3.00s", "2:3.00s*"]
    data = json.loads((root / "sweep.json").read_text())
    (fedavg,) = [s for s in data["settings"] if s["method"] == "fedavg"]
    assert fedavg["flagged"] == {"2": why}
    assert [c["flag"] for c in data["cells"] if c["flag"]] == [
        {"kind": "collapsed", "why": why.split(": ", 1)[1]}]
    table = {r["method"]: r for r in csv.DictReader(io.StringIO((root / "table.csv").read_text()))}
    assert (table["fedavg"]["flagged"], table["fedprox"]["flagged"]) == (f"seed 2: {why}", "")
    cells = list(csv.DictReader(io.StringIO((root / "sweep.csv").read_text())))
    assert [(c["method"], c["seed"]) for c in cells if c["flag"]] == [("fedavg", "2")]
    md = (tmp_path / "t.md").read_text()
    assert ("| fedavg | - | 3.33s | 1.90s..4.77s | 0.58 | 3.00s..4.00s | 3/3\\* | 0.6400 | "
            "baseline | - | 3/3 |") in md.splitlines()
    assert f"- \\* fedavg seed 2: {why}" in md.splitlines()
    tex = (tmp_path / "t.tex").read_text().splitlines()
    assert ("fedavg & - & 3.33s & 1.90s..4.77s & 0.58 & 3.00s..4.00s & 3/3$^{*}$ & 0.6400 & "
            "baseline & - & 3/3 \\\\") in tex
    assert f"$^{{*}}$ fedavg seed 2: {why}\\par" in tex
    # fednet report SWEEPDIR re-tables it, its exports byte for byte the sweep's own
    res = CliRunner().invoke(main, ["report", str(root), "--latex", str(tmp_path / "r.tex"),
                                    "--markdown", str(tmp_path / "r.md")])
    assert res.exit_code == 0, res.output
    assert best in res.output.splitlines()
    r_md = (tmp_path / "r.md").read_text()
    assert r_md == f"sweep {root}\n\n" + md
    # the cells' run folders side by side: the collapsed one says so under its status
    res = CliRunner().invoke(main, ["report", str(root / "cells" / "fedavg__seed=2"),
                                    str(root / "cells" / "fedavg__seed=0")])
    marked = next(ln for ln in res.output.splitlines() if ln.startswith("marked "))
    assert marked.split() == ["marked", *why.split(), "-"]


def test_the_plot_marks_a_collapsed_seed(tmp_path):
    from fednet.metrics.plots import label_curves, _series

    root = _finished_sweep(tmp_path / "sw")
    run_sweep(Options(str(root), _GRID, metric="sim_to:0.85"), _Done(), lambda line: None)
    series, _ = _series([str(root)])
    label_curves(series)
    assert [s["label"] for s in series] == ["fedavg, 3 seeds (1 collapsed)", "fedprox, 3 seeds"]
    res = CliRunner().invoke(main, ["report", str(root), "--plot", str(tmp_path / "p.svg")])
    assert res.exit_code == 0, res.output
    assert "dotted, hollow circle: a seed marked collapsed or diverged" in \
        (tmp_path / "p.svg").read_text()


def test_latex_and_markdown_of_a_small_table_exactly():
    t = Table("best setting per method:", ["method", "final_accuracy", "95% CI", "p", "seeds"],
              [["fed_avg", "0.9000", "0.8800..0.9200", "<0.001", "3/3*"],
               ["a|b", "-", "-", "0.042", "2/3"]],
              ["* fed_avg seed 2: collapsed: final accuracy 0.1000 (50% & more)"], {1, 2, 3, 4})
    part = Part(["metric final_accuracy; higher is better"], [t], ["1 of 6 cells failed"])
    assert paper.latex([part]) == r"""% needs \usepackage{booktabs}

% metric final_accuracy; higher is better

% best setting per method:
\begin{tabular}{lrrrr}
\toprule
method & final\_accuracy & 95\% CI & p & seeds \\
\midrule
fed\_avg & 0.9000 & 0.8800..0.9200 & \textless{}0.001 & 3/3$^{*}$ \\
a|b & - & - & 0.042 & 2/3 \\
\bottomrule
\end{tabular}
\par\smallskip
{\footnotesize
$^{*}$ fed\_avg seed 2: collapsed: final accuracy 0.1000 (50\% \& more)\par
}
% note: 1 of 6 cells failed
"""
    assert paper.markdown([part]) == r"""metric final_accuracy; higher is better

best setting per method:

| method | final_accuracy | 95% CI | p | seeds |
|---|---:|---:|---:|---:|
| fed_avg | 0.9000 | 0.8800..0.9200 | <0.001 | 3/3\* |
| a\|b | - | - | 0.042 | 2/3 |

- \* fed_avg seed 2: collapsed: final accuracy 0.1000 (50% & more)

- 1 of 6 cells failed
"""
    assert t.text()[1].splitlines()[2].split() == ["fed_avg", "0.9000", "0.8800..0.9200",
                                                    "<0.001", "3/3*"]


def test_export_options_refuse_a_folder_in_one_line(tmp_path):
    root = _finished_sweep(tmp_path / "sw")
    for opt in ("--latex", "--markdown"):
        res = CliRunner().invoke(main, ["report", str(root), opt, str(tmp_path)])
        assert res.exit_code == 2 and f"Invalid value for '{opt}'" in res.output
        assert "Traceback" not in res.output
        res = CliRunner().invoke(main, ["sweep", "--out", str(root), opt, str(tmp_path),
                                        *_GRID])
        assert res.exit_code == 2 and f"Invalid value for '{opt}'" in res.output


def test_api_errors_name_the_keyword_arguments(tmp_path):
    from fednet.api import run
    from fednet.errors import ConfigError

    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "summary.json").write_text("{}")
    with pytest.raises(ConfigError) as e:
        run(out=str(tmp_path / "old"), rounds=1)
    assert str(e.value) == (f"out {tmp_path / 'old'} already holds files; give a new folder, "
                            f"resume {tmp_path / 'old'} to continue that run, or overwrite=True "
                            "to replace it")
    with pytest.raises(ConfigError, match=r"^time_scale 2 scales the delays real_time=True "):
        run(out=str(tmp_path / "new"), time_scale=2.0)


def test_reports_name_the_model_the_run_built(tmp_path):
    """`--model auto` on a dataset whose default only a plugin knows: the table named 'auto';
    summary.json's `model` says what was built."""
    from fednet.metrics.report import run_info
    from tests.harness import fake_run

    run = fake_run(tmp_path / "r", train={"model": "auto"})
    assert run_info(run)["model"] == "digits_cnn"  # auto on digits, from the source
    s = json.loads((run / "summary.json").read_text())
    (run / "summary.json").write_text(json.dumps(dict(s, model="plugin_net")))
    assert run_info(run)["model"] == "plugin_net"
