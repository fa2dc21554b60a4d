"""`fednet sweep` through the real command: a 2x2 grid of tiny runs, resumed, reported, plotted,
interrupted."""
from __future__ import annotations

import os
import signal
import statistics
import subprocess
import time

import pytest

from tests.integration.conftest import fednet_cmd, jsonl, read_json, wait_for_lines

pytestmark = pytest.mark.slow

TINY = ["--clients", "3", "--rounds", "2", "--epochs", "1", "--batch-size", "16",
        "--latency", "none"]


def _table_rows(stdout: str) -> dict[str, list[str]]:
    """The best-setting table: method -> its cells."""
    lines = stdout.splitlines()
    start = lines.index(next(ln for ln in lines if ln.startswith("best setting per method"))) + 3
    out = {}
    for ln in lines[start:]:
        if not ln.strip():
            break
        out[ln.split()[0]] = ln.split()
    return out


def test_sweep_runs_every_cell_resumes_and_reports(fed, tmp_path):
    args = ["sweep", "--out", "sw", "--algo", "fedavg,fedprox", "--lr", "0.05,0.2", "--jobs", "2",
            "--metric", "best_accuracy", "--baseline", "fedavg", "--", *TINY]
    res = fed.run(*args, timeout=180)
    assert res.returncode == 0, res.stderr
    assert "fednet sweep: 4 cells, 4 to run (2 at a time)" in res.stderr
    names = ["fedavg__lr=0.05", "fedavg__lr=0.2", "fedprox__lr=0.05", "fedprox__lr=0.2"]
    acc = {}
    for n in names:
        cell = tmp_path / "sw" / "cells" / n
        s = read_json(cell / "summary.json")
        assert (s["status"], s["rounds"], s["clients"]) == ("completed", 2, 3), n
        assert read_json(cell / "cell.json")["args"][-4:] == ["--algo", n.split("__")[0],
                                                              "--lr", n.split("=")[1]]
        assert (cell / "log.txt").is_file()
        acc[n] = s["best_accuracy"]
    table = _table_rows(res.stdout)
    for algo in ("fedavg", "fedprox"):
        best_lr = max(("0.05", "0.2"), key=lambda lr: acc[f"{algo}__lr={lr}"])
        row = table[algo]
        assert row[1] == f"lr={best_lr}" and row[2] == f"{acc[f'{algo}__lr={best_lr}']:.4f}"
        assert row[3:5] == ["-", "-"] and row[6] == "1/1"  # one seed: no interval, no sd
    assert table["fedavg"][-3:] == ["baseline", "-", "1/1"]  # its own row: one pair
    sweep = read_json(tmp_path / "sw" / "sweep.json")
    assert [c["name"] for c in sweep["cells"]] == names
    assert sweep["spec"]["command"][:4] == ["fednet", "sweep", "--out", "sw"]
    csv_lines = (tmp_path / "sw" / "sweep.csv").read_text().splitlines()
    assert len(csv_lines) == 5 and csv_lines[0].startswith("cell,method,lr,seed,status,value")

    stamps = {n: (tmp_path / "sw" / "cells" / n / "summary.json").stat().st_mtime_ns
              for n in names}
    again = fed.run(*args, timeout=60)  # the second invocation runs nothing new
    assert again.returncode == 0, again.stderr
    assert "fednet sweep: 4 cells, 0 to run" in again.stderr
    assert "[1/" not in again.stderr
    assert again.stdout.split("\n0 cells run")[0] == res.stdout.split("\n4 cells run")[0]
    assert stamps == {n: (tmp_path / "sw" / "cells" / n / "summary.json").stat().st_mtime_ns
                      for n in names}

    changed = fed.run(*args, "--rounds", "3", timeout=60)  # other options: refused, none run
    assert changed.returncode == 2
    assert "4 cell folder(s) hold runs made with other options" in changed.stderr

    rep = fed.run("report", "sw", "sw/cells/fedavg__lr=0.05", "--plot", "cmp.png")
    assert rep.returncode == 0, rep.stderr
    assert "sweep sw:" in rep.stdout and "dataset" in rep.stdout
    assert (tmp_path / "cmp.png").stat().st_size > 10_000


def test_seeds_are_averaged_and_rounds_to_uses_the_reference(fed, tmp_path):
    res = fed.run("sweep", "--out", "sw", "--lr", "0.1,0.2", "--seed", "0,1",
                  "--metric", "rounds_to:0.5", "--reference", "0.6", "--show", "rounds_to:0.2",
                  "--", *TINY, "--rounds", "3", timeout=180)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[0] == ("metric rounds_to:0.5: until accuracy >= 0.5 x "
                                          "reference 0.6000 = 0.3000; lower is better ('-' = not "
                                          "reached)")
    per_lr = {}
    for lr in ("0.1", "0.2"):
        vals = []
        for seed in ("0", "1"):
            rows = jsonl(tmp_path / "sw" / "cells" / f"fedavg__lr={lr}__seed={seed}" /
                         "metrics.jsonl")
            vals.append(next((r["round"] + 1 for r in rows if r["accuracy"] >= 0.3), None))
        per_lr[lr] = vals
    sweep = read_json(tmp_path / "sw" / "sweep.json")
    for s in sweep["settings"]:
        got = [v for v in per_lr[s["setting"]["lr"]] if v is not None]
        assert s["reached"] == len(got) and s["planned"] == 2
        assert s["mean"] == (statistics.fmean(got) if got else None)
    assert len(sweep["best"]) == 1 and "rounds_to:0.2" in res.stdout


def test_interrupted_sweep_keeps_finished_cells_and_prints_the_table(fed, tmp_path):
    env = dict(fed.env)
    p = subprocess.Popen(fednet_cmd() + ["sweep", "--out", "sw", "--lr", "0.05,0.1,0.2",
                                         "--", *TINY, "--rounds", "500"],
                         cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, start_new_session=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    fed.popens.append(p)
    wait_for_lines(tmp_path / "sw" / "cells" / "fedavg__lr=0.05" / "metrics.jsonl", 2, p)
    os.killpg(p.pid, signal.SIGINT)  # Ctrl-C: the sweep interrupts its running cell once
    t0 = time.monotonic()
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    assert time.monotonic() - t0 < 30
    assert err.strip().splitlines()[-1] == ("fednet: interrupted; the finished cells are kept in "
                                            "sw: the same command goes on from there")
    assert "Traceback" not in err
    assert "every setting:" in out and "3 of 3 cells have not finished" in out
    s = read_json(tmp_path / "sw" / "cells" / "fedavg__lr=0.05" / "summary.json")
    assert s["status"] == "interrupted" and s["rounds"] < 500
    assert not (tmp_path / "sw" / "cells" / "fedavg__lr=0.1").exists()
    dry = fed.run("sweep", "--out", "sw", "--lr", "0.05,0.1,0.2", "--dry-run", "--", *TINY,
                  "--rounds", "500")
    assert dry.stdout.splitlines()[-1] == "3 of 3 cells to run"  # the interrupted one again


@pytest.mark.net
def test_cells_can_run_under_fednet_launch(fed, tmp_path):
    res = fed.run("sweep", "--out", "sw", "--runtime", "launch", "--lr", "0.1", "--",
                  *TINY, "--rounds", "1", timeout=120)
    assert res.returncode == 0, res.stderr
    s = read_json(tmp_path / "sw" / "cells" / "fedavg" / "summary.json")
    assert s["status"] == "completed" and s["ready_s"] > 0  # a ZeroMQ run: clients registered
    assert (tmp_path / "sw" / "cells" / "fedavg" / "logs" / "clients.log").is_file()
