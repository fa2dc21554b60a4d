"""Cost to a target (issue 44 item 1): every row's client compute counted by the server (setup
stages included), setup stages on the virtual clock, summary.json's `to_target` (--target ACC or
Fx:RUN), the sweep metrics epochs_to:X and samples_to:X, and `fednet report`'s rows."""
from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from fednet.api import run
from fednet.cli import main
from fednet.errors import ConfigError
from fednet.metrics import sweep_table as T
from fednet.metrics.report import summary_rows
from fednet.metrics.target import DIRECTIONS

SIZES = [360, 359, 359, 359]  # digits' 1,437 training images over 4 iid clients


def _sizes(out) -> list[int]:
    """Every client's size (population.npz: clients.jsonl holds the clients that took part)."""
    with np.load(out / "population.npz", allow_pickle=False) as z:
        return z["samples"].tolist()


def _bytes_upto(exp, i: int) -> dict[str, int]:
    """The bytes sent up to row i: the setup's and every row's, per direction."""
    setup = exp.summary.get("setup", {}).get("bytes", {})
    sent = {k: setup.get(k, 0) + sum(r["bytes_round"][k] for r in exp.history[:i + 1])
            for k in DIRECTIONS}
    return {**sent, "total": sum(sent.values())}


def test_fedavg_rows_count_the_client_compute_and_the_summary_the_cost_to_the_target(tmp_path):
    exp = run(clients=4, rounds=3, epochs=2, fraction=0.5, target="0.5", out=str(tmp_path / "a"),
              population_file=True)
    assert _sizes(exp.out) == SIZES
    # 2 of 4 clients a round, 2 epochs each: 4 client-epochs a round; samples: 2 x their sizes
    assert [r["client_epochs"] for r in exp.history] == [4, 8, 12]
    assert [r["samples"] for r in exp.history] == [1436, 2872, 4310]  # 2x(359+359), +2x(359+359),
    assert exp.summary["compute"] == {"client_epochs": 12, "samples": 4310,  # +2x(360+359)
                                      "client_compute_s": exp.history[-1]["client_compute_s"],
                                      "server_compute_s": exp.history[-1]["server_compute_s"]}
    secs = [r["client_compute_s"] for r in exp.history]
    assert 0 < secs[0] < secs[1] < secs[2]
    acc = [r["accuracy"] for r in exp.history]
    assert acc[0] < 0.5 <= acc[1]  # (the target is reached in round 2, far from both sides)
    t = exp.summary["to_target"]
    assert t == {"target": 0.5, "reached": True, "rounds": 2, "client_epochs": 8, "samples": 2872,
                 "sim_s": exp.history[1]["sim_s"], "wall_s": exp.history[1]["wall_s"],
                 "bytes": _bytes_upto(exp, 1)}
    assert t["bytes"]["total"] == exp.history[1]["bytes_total"] and t["bytes"]["total"] > 0


def test_fedseq_counts_its_pretraining_and_charges_it_on_the_virtual_clock(tmp_path):
    """Every client pre-trains 2 epochs before round 1, each round's chain trains every client
    1 epoch. With one profile for all (1/1024 s a sample, no latency, unlimited links) and
    every client offline until t=5, the setup starts at 5 and takes the slowest pre-training,
    2 x 360 samples; each round adds the chain's 1,437 samples."""
    (tmp_path / "lat.csv").write_text("compute_s_per_sample,rtt_s,up_bps,down_bps\n"
                                      "0.0009765625,0,0,0\n")
    (tmp_path / "on.csv").write_text("client,start,end\n" + "".join(f"{c},5,1000\n"
                                                                     for c in range(4)))
    exp = run(algo="fedseq", clients=4, rounds=2, epochs=1, pretrain_epochs=2, target="0.2",
              population_file=True,
              latency=str(tmp_path / "lat.csv"), availability=str(tmp_path / "on.csv"),
              server_profile="none", out=str(tmp_path / "s"))  # (the clients' clock only)
    s = exp.summary
    assert _sizes(exp.out) == SIZES and s["setup"]["groups"] == [[0, 1, 2, 3]]
    assert s["setup"]["sim_s"] == 5 + 2 * 360 / 1024  # (sent at 5, when the clients came online)
    assert [r["sim_s"] for r in exp.history] == [5 + (720 + 1437) / 1024,
                                                 5 + (720 + 2 * 1437) / 1024]
    # setup: 4 clients x 2 epochs = 8 client-epochs, 2 x 1,437 samples; a round: 4 and 1,437
    assert [r["client_epochs"] for r in exp.history] == [12, 16]
    assert [r["samples"] for r in exp.history] == [3 * 1437, 4 * 1437]
    # the compute apart from the waiting and the network: every client's seconds, summed
    assert [r["client_compute_s"] for r in exp.history] == [3 * 1437 / 1024, 4 * 1437 / 1024]
    t = s["to_target"]
    assert exp.history[0]["accuracy"] >= 0.2
    assert (t["reached"], t["rounds"], t["client_epochs"], t["samples"], t["sim_s"]) == (
        True, 1, 12, 3 * 1437, 5 + 2157 / 1024)
    assert t["bytes"] == _bytes_upto(exp, 0) and t["bytes"]["client_to_client"] > 0
    assert t["bytes"]["server_to_client"] > s["setup"]["bytes"]["server_to_client"] > 0


def test_an_asynchronous_row_counts_the_tasks_done_by_its_time(tmp_path):
    """FedBuff with 3 clients training at once and a buffer of 2: 3 tasks are out from the
    start, yet each row counts only the replies taken by its time, two more a row."""
    exp = run(algo="fedbuff", clients=6, rounds=3, epochs=1, latency="hetero",
              params={"buffer": 2, "concurrency": 3}, out=str(tmp_path / "b"))
    assert [r["client_epochs"] for r in exp.history] == [2, 4, 6]
    assert [r["samples"] for r in exp.history] == [478, 957, 1437]
    c = dict(exp.summary["compute"])
    assert c.pop("client_compute_s") == exp.history[-1]["client_compute_s"] > 0
    # the server's folds, charged as they happen (FedBuff's steps over each full buffer)
    assert c.pop("server_compute_s") == exp.history[-1]["server_compute_s"] > 0
    assert c == {"client_epochs": 6, "samples": 1437}


def test_a_resumed_run_goes_on_counting_where_its_checkpoint_stopped(tmp_path):
    kw = {"clients": 4, "epochs": 1, "fraction": 0.5}
    full = run(rounds=3, out=str(tmp_path / "full"), **kw)
    run(rounds=2, checkpoint_every=1, out=str(tmp_path / "part"), **kw)
    resumed = run(rounds=3, resume=str(tmp_path / "part"), target="0.01")  # --target may change
    want = [(r["client_epochs"], r["samples"]) for r in full.history]
    assert want == [(2, 718), (4, 1436), (6, 2155)]
    assert [(r["client_epochs"], r["samples"]) for r in resumed.history] == want
    assert [r["client_compute_s"] for r in resumed.history] == [
        r["client_compute_s"] for r in full.history]
    assert resumed.summary["to_target"]["rounds"] == 1


def test_target_as_a_fraction_of_a_reference_run_and_never_reached(tmp_path):
    ref = tmp_path / "ref"
    (ref).mkdir()
    (ref / "summary.json").write_text(json.dumps({"status": "completed", "best_accuracy": 0.8}))
    res = CliRunner().invoke(main, ["local", "--clients", "4", "--rounds", "1", "--epochs", "1",
                                    "-q", "--out", str(tmp_path / "r"), "--target",
                                    f"1x:{ref}"])
    assert res.exit_code == 0, res.output
    s = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert s["final_accuracy"] < 0.8
    assert s["to_target"] == {"target": 0.8, "reached": False,
                              "reference": {"run": str(ref), "fraction": 1.0,
                                            "best_accuracy": 0.8},
                              "rounds": None, "client_epochs": None, "samples": None,
                              "sim_s": None, "wall_s": None, "bytes": None}
    assert s["compute"] == {"client_epochs": 4, "samples": 1437,
                            "client_compute_s": s["compute"]["client_compute_s"],
                            "server_compute_s": s["compute"]["server_compute_s"]} and \
        s["compute"]["client_compute_s"] > 0 < s["compute"]["server_compute_s"]
    assert f"accuracy >= 80.00% (1 x 80.00%, the best of {ref})" in res.output
    assert "to target: rounds       not reached" in res.output


@pytest.mark.parametrize("value,says", [
    ("1.5", "--target 1.5: expected an accuracy in (0, 1]"),
    ("abc", "--target abc: expected an accuracy in (0, 1]"),
    ("0.9x:nowhere", "--target 0.9x:nowhere: 'nowhere' is no finished run folder"),
    ("2x:nowhere", "--target 2x:nowhere: expected an accuracy in (0, 1]"),
])
def test_a_bad_target_is_one_line_naming_the_option(value, says, tmp_path):
    res = CliRunner().invoke(main, ["local", "--clients", "4", "--rounds", "1", "-q",
                                    "--out", str(tmp_path / "r"), "--target", value])
    assert res.exit_code == 2
    assert res.output.startswith(f"fednet: error: {says}") and res.output.count("\n") == 1
    assert not (tmp_path / "r").exists()
    with pytest.raises(ConfigError, match=f"^{says[2:10]}"):  # the API names its keyword
        run(clients=4, rounds=1, target=value, out=str(tmp_path / "api"))


def _rows(epochs: list[int], first: int) -> list[dict]:
    return [{"round": r, "accuracy": 0.9 if r + 1 >= first else 0.3, "sim_s": 1.0 + r,
             "client_epochs": e, "samples": 100 * e} for r, e in enumerate(epochs)]


def test_sweep_metrics_epochs_to_and_samples_to():
    rows = _rows([40, 44, 48, 52], 3)
    assert T.parse_metric("epochs_to:0.5").of({}, rows, None) == 48
    assert T.parse_metric("samples_to:0.5").of({}, rows, None) == 4800
    assert T.parse_metric("epochs_to:0.5").of({}, rows, 0.5) == 40  # 0.25 of the reference
    assert T.parse_metric("epochs_to:0.95").of({}, rows, None) is None
    old = [{k: v for k, v in r.items() if k != "client_epochs"} for r in rows]  # an older run
    assert T.parse_metric("epochs_to:0.5").of({}, old, None) is None
    assert T.parse_metric("samples_to:0.5").fmt(4_640_000) == "4.64M"
    assert T.parse_metric("epochs_to:0.5").fmt(4640) == "4640.0"
    assert T.is_metric("samples_to:0.9") and not T.parse_metric("epochs_to:0.9").higher
    for bad in ("epochs_to", "samples_to:0", "samples_to:x"):
        with pytest.raises(ConfigError, match="^--metric"):
            T.parse_metric(bad)


def test_a_sweep_compares_client_epochs_paired_by_seed(tmp_path):
    """FedSeq's setup is in its rows' client-epochs: its speed-up over FedAvg in client compute
    is the geometric mean of the per-seed ratios, FedAvg's over FedSeq's."""
    cells = []
    per = {("fedavg", 0): ([20, 40, 60, 80], 4), ("fedavg", 1): ([20, 40, 60, 80], 3),
           ("fedseq", 0): ([48, 56, 64, 72], 1), ("fedseq", 1): ([48, 56, 64, 72], 2)}
    for (method, seed), (epochs, first) in per.items():
        folder = tmp_path / "cells" / f"{method}{seed}"
        folder.mkdir(parents=True)
        rows = _rows(epochs, first)
        (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (folder / "summary.json").write_text(json.dumps({"status": "completed",
                                                         "final_accuracy": 0.9}))
        cells.append({"name": folder.name, "method": method, "setting": {}, "seed": str(seed),
                      "folder": f"cells/{folder.name}"})
    spec = {"metric": "epochs_to:0.5", "show": ["samples_to:0.5"], "baseline": "fedavg"}
    (tmp_path / "sweep.json").write_text(json.dumps({"spec": spec, "cells": cells}))
    spec, recs = T.load_sweep(tmp_path)
    res = T.evaluate(spec, recs)
    best = {b["method"]: b for b in res["best"]}
    assert best["fedavg"]["seeds"] == {"0": 80, "1": 60}
    assert best["fedseq"]["seeds"] == {"0": 48, "1": 56}
    assert best["fedseq"]["show"]["samples_to:0.5"] == 5200
    v = best["fedseq"]["versus"]
    assert v["estimate"] == pytest.approx((80 / 48 * 60 / 56) ** 0.5) and v["pairs"] == 2
    head = T.render(spec, res).splitlines()[0]
    assert head == ("metric epochs_to:0.5: until accuracy >= 0.5; lower is better "
                    "('-' = not reached)")


def test_report_shows_the_cost_to_the_target():
    s = {"algorithm": "fedseq", "status": "completed", "bytes": {},
         "compute": {"client_epochs": 4840, "samples": 1_234_567},
         "to_target": {"target": 0.9, "reached": True, "rounds": 36, "client_epochs": 4720,
                       "samples": 1_200_000, "sim_s": 61.5, "wall_s": 17.25,
                       "bytes": {"server_to_client": 3 << 20, "client_to_server": 1 << 20,
                                 "client_to_client": 4 << 20, "total": 8 << 20}}}
    rows = dict(summary_rows(s, info={}))
    assert rows["client compute"] == "4840 client-epochs, 1.23M samples"
    assert rows["target"] == "accuracy >= 90.00%"
    assert (rows["to target: rounds"], rows["to target: client compute"],
            rows["to target: simulated time"], rows["to target: wall-clock"]) == (
        "36", "4720 client-epochs, 1.2M samples", "61.50s", "17.25s")
    assert rows["to target: bytes"] == "8.0 MiB (down 3.0 MiB, up 1.0 MiB, peer 4.0 MiB)"
    assert "target" not in dict(summary_rows({"bytes": {}}, info={}))
