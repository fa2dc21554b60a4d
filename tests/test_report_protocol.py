"""Issue 54 item 4: the end-of-run table, summary.json and `fednet report` say what ran (secure
aggregation with its parameters, per-stage bytes and CPU, failed rounds, its overhead against the
clear update; attack and defense with their parameters); `--csv` has the cost-to-target columns;
plots a paper can take (titles with attack and defense, labels by option and rounded, the legend
inside the figure, dotted runs that are no result, --target's line); and report files whose
extension names a format that is not written are refused (item 3)."""
from __future__ import annotations

import csv
import io
import json

import numpy as np
import pytest
from click.testing import CliRunner
from matplotlib.figure import Figure

from fednet.cli import main
from fednet.core.summary import secagg_summary
from fednet.metrics.export import TABLE_KEYS, table_csv
from fednet.metrics.plot_text import describe, inside, label_curves, legend, option_text
from fednet.metrics.plots import _draw, _series, plot_overlay, run_target
from fednet.metrics.report import summary_rows
from fednet.metrics.what_ran import secagg_rows
from tests.conftest import small_config
from tests.harness import fake_run

STAGE_BYTES = {"keys": {"server_to_client": 100, "client_to_server": 200},
               "shares": {"server_to_client": 300, "client_to_server": 400},
               "input": {"server_to_client": 3 * 1000 + 60, "client_to_server": 3 * 2000 + 60},
               "unmask": {"server_to_client": 50, "client_to_server": 70}}


def _secagg_row(rnd, alive, failed=""):
    row = {"round": rnd, "secagg_clients": alive, "secagg_neighbours": 4,
           "secagg_field_bits": 64, "secagg_server_s": {"keys": 0.5, "unmask": 1.0},
           "secagg_client_s": {"input": 2.0}}
    return {**row, "secagg_failed": failed} if failed else row


def _plus_cfg():
    return small_config(clients=6, net={"secagg": "plus", "secagg_bits": 12, "secagg_clip": 4.0,
                                        "secagg_threshold": 0.6, "secagg_drop": "input:0.4"})


def test_the_secagg_summary_adds_up_the_rounds():
    """Two rounds of 6 clients, one of them failed at the input stage: the sums, the failure,
    and the update path (every stage's bytes less the model each input task carries) against
    the clear update (the model's bytes x the inputs the server took)."""
    rows = [_secagg_row(0, [6, 6, 5, 5, 5]),
            _secagg_row(1, [6, 6, 4, 1], failed="too few inputs (1 < 4)")]
    sa = secagg_summary(_plus_cfg().replace(rounds=2), rows, STAGE_BYTES, model_bytes=1000)
    assert (sa["mode"], sa["neighbours"], sa["field_bits"], sa["bits"]) == ("plus", [4], [64], 12)
    assert (sa["clip"], sa["threshold"], sa["failed_rounds"], sa["rounds"]) == (4.0, 0.6, 1, 2)
    assert sa["last_failure"] == {"round": 1, "why": "too few inputs (1 < 4)"}
    assert sa["clients_by_stage"] == {"cohort": 12, "keys": 12, "shares": 9, "input": 6,
                                      "unmask": 5}
    assert sa["server_cpu_s"] == {"keys": 1.0, "unmask": 2.0}
    assert sa["client_cpu_s"] == {"input": 4.0}
    sent = 100 + 200 + 300 + 400 + 3060 + 6060 + 50 + 70
    assert (sa["input_tasks"], sa["uploads"]) == (9, 6)
    assert sa["update_bytes"] == sent - 9 * 1000 and sa["clear_bytes"] == 6 * 1000
    assert sa["overhead"] == pytest.approx((sent - 9000) / 6000)


def test_full_secagg_has_every_other_client_as_neighbour_without_the_row_key():
    rows = [{k: v for k, v in _secagg_row(0, [7, 7, 7, 7, 7]).items() if k != "secagg_neighbours"}]
    cfg = small_config(clients=7, net={"secagg": "full"})
    assert secagg_summary(cfg, rows, {}, 0)["neighbours"] == [6]
    assert secagg_summary(cfg, rows, {}, 0)["overhead"] is None  # no model: no clear update


def test_a_codec_under_secagg_is_reported_as_its_grid_and_wire_bits_not_secagg_bits():
    rows = [{**_secagg_row(r, [6, 6, 6, 6, 6]), "secagg_wire_bits": 13} for r in (0, 1)]
    cfg = small_config(clients=6, net={"secagg": "plus", "compress": "int8"}).replace(rounds=2)
    sa = secagg_summary(cfg, rows, STAGE_BYTES, model_bytes=1000)
    assert (sa["bits"], sa["codec"], sa["wire_bits"]) == (None, "int8", [13])
    assert dict(secagg_rows(sa))["secagg parameters"].startswith(
        "64-bit field, --compress int8 on a common grid, 13 bits a value sent, --secagg-clip 8")
    plain = secagg_summary(_plus_cfg().replace(rounds=2), rows[:1], STAGE_BYTES, 1000)
    assert (plain["bits"], plain["codec"]) == (12, None)


def test_the_table_says_what_protocol_ran_and_what_it_cost():
    rows = [_secagg_row(0, [6, 6, 5, 5, 5]),
            _secagg_row(1, [6, 6, 4, 1], failed="too few inputs (1 < 4)")]
    sa = secagg_summary(_plus_cfg().replace(rounds=2), rows, STAGE_BYTES, model_bytes=1000)
    got = dict(secagg_rows(sa))
    assert got["secure aggregation"] == "SecAgg+ (plus), k = 4 neighbours per client"
    assert got["secagg parameters"] == ("64-bit field, --secagg-bits 12, --secagg-clip 4, "
                                        "--secagg-threshold 0.6, --secagg-dropout 0.1, "
                                        "--secagg-drop input:0.4")
    assert got["secagg clients per round"] == ("cohort 6 -> keys 6 -> shares 4.5 -> input 3 -> "
                                               "unmask 2.5")
    assert got["secagg bytes by stage"] == "keys 300 B, shares 700 B, input 8.9 KiB, unmask 120 B"
    assert got["secagg server CPU"] == "keys 1.000s, unmask 2.000s"
    assert got["secagg failed rounds"] == "1 of 2 (last: round 2: too few inputs (1 < 4))"
    assert got["secagg overhead"].startswith(f"{(10240 - 9000) / 6000:.3f} x the clear update")
    s = {"algorithm": "fedavg", "status": "completed", "rounds": 2, "secagg": sa,
         "bytes": {"tensor_bytes": 9000, "server_to_client": 100, "client_to_server": 100},
         "attack": {"name": "ipm", "malicious": [1, 4], "malicious_spec": "0.3",
                    "params": {"eps": 0.123456789}},
         "defense": {"name": "trimmed", "params": {"beta": 0.1}}}
    table = dict(summary_rows(s, {}))
    assert table["tensor bytes (minimum)"] == "8.8 KiB (masked vectors counted)"
    assert table["secagg overhead"] == got["secagg overhead"]
    assert table["attack"] == "ipm(eps=0.123), 2 malicious (--malicious 0.3)"
    assert table["defense"] == "trimmed(beta=0.1)"
    assert "secure aggregation" not in dict(summary_rows({**s, "secagg": None}, {}))


def test_a_secagg_run_reports_its_overhead_against_the_clear_update(tmp_path):
    """A real run (full SecAgg, 64-bit field): summary.json's secagg block from the ledger and
    the rows, the clear update being the final model's bytes; a 64-bit masked vector is twice
    a float32 update, which 'wire / minimum' (about 1) does not show."""
    from fednet.core.inproc import run_local

    cfg = small_config(clients=4, rounds=1, net={"secagg": "full", "secagg_field": 64})
    s = run_local(cfg.replace(out=str(tmp_path / "run")), quiet=True)
    sa = s["secagg"]
    with np.load(tmp_path / "run" / "final_model.npz", allow_pickle=False) as z:
        model = sum(z[k].nbytes for k in z.files)
    assert (sa["mode"], sa["neighbours"], sa["field_bits"], sa["failed_rounds"]) == (
        "full", [3], [64], 0)
    assert sa["model_bytes"] == model and sa["uploads"] == sa["input_tasks"] == 4
    assert sa["bytes_by_stage"] == s["bytes_by_stage"]
    sent = sum(sum(v.values()) for v in s["bytes_by_stage"].values())
    assert sa["update_bytes"] == sent - 4 * model and sa["clear_bytes"] == 4 * model
    assert 2.0 < sa["overhead"] < 2.2
    res = CliRunner().invoke(main, ["report", str(tmp_path / "run")])
    assert res.exit_code == 0, res.output
    line = next(ln for ln in res.output.splitlines() if ln.startswith("secagg overhead"))
    assert f"{sa['overhead']:.3f} x the clear update" in line


def test_report_csv_has_the_cost_to_target_columns(tmp_path):
    run = fake_run(tmp_path / "t", attack={"name": "signflip"}, defense={"name": "median"})
    s = json.loads((run / "summary.json").read_text())
    s.update({"compute": {"client_epochs": 30, "samples": 4000},
              "attack": {"name": "signflip", "malicious": [0], "params": {}},
              "defense": {"name": "median", "params": {}},
              "to_target": {"target": 0.4, "reached": True, "rounds": 2, "client_epochs": 20,
                            "samples": 2500, "sim_s": 1.5, "wall_s": 3.25,
                            "bytes": {"server_to_client": 10, "client_to_server": 20,
                                      "client_to_client": 0, "total": 30}}})
    (run / "summary.json").write_text(json.dumps(s))
    out = tmp_path / "t.csv"
    res = CliRunner().invoke(main, ["report", str(run), "--csv", str(out)])
    assert res.exit_code == 0, res.output
    row = next(csv.DictReader(io.StringIO(out.read_text())))
    assert {k: row[k] for k in ("client_epochs", "target", "target_reached", "to_target_rounds",
                                "to_target_samples", "to_target_sim_s", "to_target_wall_s",
                                "to_target_bytes", "to_target_bytes_up", "attack", "defense")} == {
        "client_epochs": "30", "target": "0.4", "target_reached": "1", "to_target_rounds": "2",
        "to_target_samples": "2500", "to_target_sim_s": "1.5", "to_target_wall_s": "3.25",
        "to_target_bytes": "30", "to_target_bytes_up": "20", "attack": "signflip",
        "defense": "median"}
    lines = list(csv.reader(io.StringIO(table_csv([str(run)]))))
    assert lines[0] == list(TABLE_KEYS) and len(lines[1]) == len(TABLE_KEYS)


def test_labels_are_options_rounded_never_name_equals():
    assert option_text("dp.noise", 0.8137163970503462) == "--dp-noise 0.814"
    assert option_text("train.lr", 0.05) == "--lr 0.05"
    assert option_text("algo.params.mu", 0.01) == "--param mu=0.01"
    assert option_text("data.permute", True) == "--permute"
    assert option_text("data.permute", False) == "--no-permute"
    assert option_text("net.secagg_drop", "") == "--secagg-drop none"  # unset, not blank

    def series(run, attack, defense, noise):
        return {"label": run, "info": {"algorithm": "fedavg", "attack": attack,
                                       "defense": defense}, "runs": [[{}]],
                "statuses": ["completed"], "seeds": ["0"],
                "config": {"attack.name": attack or "none", "defense.name": defense or "none",
                           "dp.noise": noise}}
    got = [series("a", "signflip", "median", 0.81371), series("b", "signflip", None, 0.81379),
           series("c", None, None, 0.5)]
    label_curves(got)
    assert [s["label"] for s in got] == [
        "a [--attack signflip, --defense median, --dp-noise 0.8137]",
        "b [--attack signflip, --defense none, --dp-noise 0.8138]",  # 4 digits tell them apart
        "c [--attack none, --defense none, --dp-noise 0.5]"]
    assert not any("name=" in s["label"] for s in got)


def test_titles_say_attack_and_defense(tmp_path):
    from fednet.metrics.report import run_info

    run = fake_run(tmp_path / "r", attack={"name": "ipm", "params": {"eps": 0.5}, "malicious": "0.3"},
               defense={"name": "median"})
    assert describe(run_info(run)) == ("fedavg, digits iid, 3 clients, --attack ipm(eps=0.5) "
                                       "--malicious 0.3, --defense median")
    out = tmp_path / "p.svg"
    plot_overlay([str(run)], out)
    svg = out.read_text().replace("- -", "--")  # (an SVG comment spells -- so)
    assert "3 clients, --attack ipm(eps=0.5) --malicious 0.3, --defense median" in svg


def _long_legend(wrapped: bool):
    fig = Figure(figsize=(15, 4.4), constrained_layout=True)
    axs = fig.subplots(1, 3)
    for i in range(5):
        axs[0].plot([1, 2], [i, i], label=f"run{i} (fedavg) [--attack signflip, --defense "
                    f"median, --dp central, --dp-noise 0.{i}14, --secagg-field 64, --rounds 3, "
                    f"--lr 0.15, --partition dirichlet, --alpha 0.1]")
    if wrapped:
        return fig, legend(fig, axs[0], 5)
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    leg = fig.legend(fontsize=8, loc="outside lower center", ncols=3)  # as before issue 54
    fig.draw_without_rendering()
    return fig, leg


def test_the_legend_stays_inside_the_figure_with_long_labels():
    fig, leg = _long_legend(wrapped=False)
    assert not inside(leg.get_window_extent(), fig.bbox)  # the old legend: cut off both sides
    fig, leg = _long_legend(wrapped=True)
    assert inside(leg.get_window_extent(), fig.bbox)
    assert all(a.get_window_extent().y0 > leg.get_window_extent().y1 for a in fig.axes)


def _lines_of(series):
    fig = Figure()
    axs = fig.subplots(1, 3)
    panels = [("round", ""), ("sim_time", ""), ("bytes", "")]
    _draw(axs, panels, series, "C0", [])
    return [ln.get_linestyle() for ln in axs[0].get_lines() if len(ln.get_xdata()) > 1]


def test_a_run_that_is_no_result_is_drawn_dotted(tmp_path):
    rows = [{"round": r, "accuracy": 0.1, "sim_s": r + 1.0, "bytes_round": {}} for r in range(3)]
    base = {"label": "x", "runs": [rows], "info": {}}
    collapsed = {**base, "statuses": ["completed"], "flags": [{"kind": "collapsed"}]}
    failed = {**base, "statuses": ["failed"], "flags": [None]}
    fine = {**base, "statuses": ["completed"], "flags": [None]}
    assert _lines_of(collapsed) == [":"]  # one curve, dotted: no solid line under it
    assert _lines_of(failed) == [":"]
    assert _lines_of(fine) == ["-"]
    two = {**base, "runs": [rows, rows], "statuses": ["completed"] * 2,
           "flags": [{"kind": "collapsed"}, None]}
    assert _lines_of(two) == ["-", ":"]  # the mean solid, the marked seed dotted


def test_a_run_with_a_target_gets_its_line(tmp_path):
    run = fake_run(tmp_path / "t", target="0.4")
    assert run_target(run, {}) == 0.4  # config.toml's --target: a run still going
    assert run_target(run, {"to_target": {"target": 0.45}}) == 0.45  # summary.json's
    assert run_target(fake_run(tmp_path / "none"), {}) is None
    _, targets = _series([str(run)])
    assert targets == [(0.4, "--target")]
    out = tmp_path / "p.svg"
    plot_overlay([str(run)], out)
    assert "dashed: 40.0% (--target)" in out.read_text().replace("- -", "--")


@pytest.mark.parametrize("opt,name", [("--plot", "x.jpeg2"), ("--plot", "x"),
                                      ("--csv", "t.xlsx"), ("--curves", "c.json"),
                                      ("--latex", "t.md"), ("--markdown", "t.tex")])
def test_a_file_named_for_another_format_is_refused(tmp_path, opt, name):
    run = fake_run(tmp_path / "r")
    res = CliRunner().invoke(main, ["report", str(run), opt, str(tmp_path / name)])
    assert res.exit_code == 2
    err = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith(f"fednet: error: Invalid value for '{opt}'")
    assert not (tmp_path / name).exists()


def test_a_plot_is_written_in_the_format_its_name_says(tmp_path):
    run = fake_run(tmp_path / "r")
    res = CliRunner().invoke(main, ["report", str(run), "--plot", str(tmp_path / "p.jpg"),
                                    "--csv", str(tmp_path / "t.txt")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "p.jpg").read_bytes()[:3] == b"\xff\xd8\xff"  # JPEG, not PNG
    assert (tmp_path / "t.txt").read_text().startswith("source,kind,")

