"""Progress lines (training loss, time left, the stuck-loss hint), `fednet report` over the union
of rows with the experiment's rows, the plots' titles and labels, and honest interrupt messages."""
from __future__ import annotations

import io
import json
import os
import time
from pathlib import Path

import pytest

from fednet.metrics.plots import describe, plot_overlay, plot_run, ylabel
from fednet.metrics.progress import Progress, human_seconds
from fednet.metrics.report import compare, run_info
from fednet.core.inproc import run_local
from tests.conftest import small_config
from tests.harness import fake_row, fake_run


def _lines(rows, total=10, quiet=False):
    buf = io.StringIO()
    p = Progress(total, quiet=quiet, stream=buf)
    for r in rows:
        p.update(r)
    return buf.getvalue().splitlines()


def test_progress_line_has_training_loss_and_time_left():
    lines = _lines([fake_row(0, 0.5, 1.0, 2.0, 2.0), fake_row(1, 0.6, 0.8, 1.5, 3.0)])
    assert lines[0] == ("[##......................] round 1/10  acc 0.500  train loss 2.000  "
                        "wall 2.0s (~18s left)  sim 0.50s  traffic 1000 B")
    assert "wall 3.0s (~8s left)" in lines[1]  # 1 s per round since the first row
    last = _lines([fake_row(9, 0.9, 0.1, 0.1, 10.0)])[0]
    assert "left" not in last and last.startswith("[########################] round 10/10")
    assert human_seconds(75) == "1m15s" and human_seconds(7300) == "2h01m"


def test_a_loss_that_does_not_fall_gets_one_hint():
    shards = [fake_row(r, 0.1, 2.30 - 0.01 * r, 0.2 - 0.03 * r, r + 1.0) for r in range(8)]
    lines = _lines(shards)
    hints = [ln for ln in lines if ln.startswith("hint:")]
    assert hints == ["hint: after 5 rounds the model's loss has not fallen (2.300 -> 2.260; "
                     "clients' training loss 0.200 -> 0.080): the clients fit their own data but "
                     "the evaluated model does not learn (common with --partition shards or a small "
                     "--alpha); try fewer --epochs and a smaller --lr, e.g. --epochs 1 --lr 0.05, "
                     "or an algorithm made for non-IID data"]
    assert lines.index(hints[0]) == 5  # right after round 5's line
    flat = [fake_row(r, 0.1, 2.3, 2.3, r + 1.0) for r in range(6)]
    assert "look at --lr (larger, or smaller if the loss jumps), --epochs" in _lines(flat)[-2]
    nan = [fake_row(r, 0.1, 2.3 if r < 4 else float("nan"), 2.3, r + 1.0) for r in range(6)]
    assert "it diverged; try a smaller --lr" in _lines(nan)[-2]
    learning = [fake_row(r, 0.2 + 0.1 * r, 2.3 * 0.8 ** r, 2.3 * 0.8 ** r, r + 1.0) for r in range(8)]
    assert not [ln for ln in _lines(learning) if ln.startswith("hint")]
    # issue 41: a run at 99% whose loss overflowed (or rose: overconfident) gets no hint
    for last in (float("inf"), float("nan"), 0.4):
        good = [fake_row(r, 0.97 + 0.005 * r, 0.3 if r < 4 else last, 0.2, r + 1.0) for r in range(6)]
        assert not [ln for ln in _lines(good) if ln.startswith("hint")]
    overfit = [fake_row(r, 0.1 + 0.02 * r, 2.3 + 0.05 * r, 2.2 - 0.1 * r, r + 1.0) for r in range(6)]
    assert "but the accuracy rose (0.100 -> 0.180): the models learn and grow overconfident" in \
        _lines(overfit)[-2]
    converged = [fake_row(r, 0.95, 0.15, 0.1, r + 1.0) for r in range(8)]  # good from round 0
    assert not [ln for ln in _lines(converged) if ln.startswith("hint")]
    assert _lines(shards, quiet=True) == []


def test_report_shows_the_union_of_rows_and_the_experiment(tmp_path):
    a = fake_run(tmp_path / "ok")
    b = fake_run(tmp_path / "withfail", algo="standalone", failures=[{"client": 1}], pss=2**30,
             data={"partition": "dirichlet", "alpha": 0.3})
    by = {ln.split("  ")[0].strip(): ln.split() for ln in compare([str(a), str(b)]).splitlines()[2:]}
    assert by["failures"][-2:] == ["-", "1"]
    assert by["client memory (PSS)"][-3:] == ["-", "1.0", "GiB"]
    assert by["dataset"][-2:] == ["digits", "digits"]
    assert by["partition"][-2:] == ["iid", "dirichlet(alpha=0.3)"]
    assert by["model"][-2:] == ["digits_cnn", "digits_cnn"]
    text = compare([str(a), str(b)])
    assert "global model, test set" in text and "each client's model, own split" in text
    labels = [ln.split("  ")[0].strip() for ln in text.splitlines()[2:]]
    assert labels[-2:] == ["client memory (PSS)", "failures"]  # rows only the second run has
    assert labels[:6] == ["algorithm", "dataset", "partition", "model", "evaluation", "status"]


def test_a_folder_without_run_json_shows_what_its_config_says(tmp_path):
    """A run folder of a fednet older than run.json: the model as --model gave it ('auto' as
    the dataset's default, read from the source) and no evaluation row; a real run writes
    run.json at its start, before any round."""
    from fednet.metrics.report import run_info

    a = fake_run(tmp_path / "old")
    (a / "run.json").unlink()
    info = run_info(a)
    assert info["model"] == "digits_cnn" and "eval" not in info
    s = run_local(small_config(rounds=1, out=str(tmp_path / "new")), quiet=True)
    assert json.loads((Path(s["out"]) / "run.json").read_text()) == {"model": "digits_cnn",
                                                                      "eval": "global"}


def test_plots_are_titled_and_labelled(tmp_path):
    a = fake_run(tmp_path / "a")
    assert describe(run_info(a)) == "fedavg, digits iid, 3 clients"
    assert ylabel({"clients"}) == "mean client accuracy (%)"
    assert ylabel({"global"}) == "test accuracy (%)" and ylabel({"global", "clients"}) == "accuracy (%)"
    rows = [json.loads(x) for x in (a / "metrics.jsonl").read_text().splitlines()]
    paths = plot_run(a, rows)
    assert [p.name for p in paths] == ["accuracy_vs_round.png", "accuracy_vs_sim_time.png",
                                       "accuracy_vs_bytes.png"]
    b = fake_run(tmp_path / "b", algo="standalone")
    out = plot_overlay([str(a), str(b)], tmp_path / "both.png")
    assert out.stat().st_size > 10_000
    for ext, magic in ((".pdf", b"%PDF"), (".svg", b"<?xml")):  # the format by the extension
        assert plot_overlay([str(a), str(b)], tmp_path / f"both{ext}").read_bytes()[:5].startswith(
            magic)


def test_report_plot_stacks_where_the_simulated_time_went(tmp_path, monkeypatch):
    """Runs whose rows split their simulated time (sim_split) get a fourth panel: one bar per
    curve, its parts (summed over the rows) stacked in order; runs without a split get none."""
    from fednet.metrics import plots

    split = {"download_s": 0.5, "client_compute_s": 2.0, "protocol_s": 0.25, "upload_s": 0.25,
             "server_s": 1.0, "wait_s": 0.0}
    a = fake_run(tmp_path / "a")
    rows = [{**json.loads(x), "sim_split": split}
            for x in (a / "metrics.jsonl").read_text().splitlines()]
    (a / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    b = fake_run(tmp_path / "b", algo="standalone")  # no split in its rows: a bar of zeros
    saved = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: saved.append(fig))
    plot_overlay([str(a), str(b)], tmp_path / "both.png")
    axes = saved[-1].axes
    assert len(axes) == 4 and axes[-1].get_xlabel().startswith("simulated time (s), by where")
    bars = axes[-1].patches  # 6 parts x 2 curves, part by part
    assert [round(r.get_width(), 9) for r in bars[::2]] == [3 * v for v in split.values()]
    assert [r.get_width() for r in bars[1::2]] == [0.0] * 6
    assert [r.get_x() for r in bars[::2]][:3] == [0.0, 1.5, 7.5]  # stacked: each after the last
    assert [t.get_text() for t in axes[-1].get_legend().get_texts()] == [
        "download", "client compute", "protocol compute", "upload", "server", "waiting"]
    plot_overlay([str(b)], tmp_path / "b.png")
    assert len(saved[-1].axes) == 3  # no split anywhere: no panel


NO = ("; it kept no checkpoint, so it cannot be resumed (--checkpoint-every N writes one every N "
      "rounds; FedAsync and FedBuff checkpoint only where they drain: --param drain=R)")


def test_interrupt_messages_say_what_was_kept(tmp_path, monkeypatch):
    from fednet.metrics.run_end import interrupt_note

    monkeypatch.chdir(tmp_path)
    t0, shown = time.time(), []

    def note(command, out="run"):
        return interrupt_note(command, out, t0, shown.append)

    assert note("local", None) == " before the run started; nothing was written"
    assert note("clients", None) == "; the clients on this host were stopped"
    assert note("launch") == " before the run started; nothing was written"
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.toml").write_text("")
    assert note("local") == " before the first round ended; run holds only the configuration"
    (tmp_path / "run" / "metrics.jsonl").write_text("{}\n")
    assert note("local") == "; partial results (metrics.jsonl) were kept in run" + NO
    (tmp_path / "run" / "summary.json").write_text(json.dumps(
        {"algorithm": "fedavg", "status": "interrupted", "rounds": 1, "rounds_planned": 5}))
    assert not shown
    assert note("server") == "; partial results were kept in run" + NO
    assert "interrupted" in shown[0] and "1/5" in shown[0]  # the partial table
    old = t0 - 3600  # a summary of an earlier run in that folder is not this run's
    os.utime(tmp_path / "run" / "summary.json", (old, old))
    assert note("local") == "; partial results (metrics.jsonl) were kept in run" + NO
    (tmp_path / "run" / "checkpoint" / "clients").mkdir(parents=True)  # the clients' store alone
    assert note("local").endswith(NO)
    (tmp_path / "run" / "checkpoint" / "state.json").write_text("{}")  # a checkpoint: the command
    assert note("launch") == ("; partial results (metrics.jsonl) were kept in run; continue it "
                              "with `fednet launch --resume run`")
    assert note("sweep") == "; the finished cells are kept in run: the same command goes on from there"
    assert note("report") == ""


@pytest.mark.slow
def test_ctrl_c_on_local_prints_the_partial_table(tmp_path):
    import signal
    import subprocess

    from tests.integration.conftest import fednet_cmd, wait_for_lines

    p = subprocess.Popen(fednet_cmd() + ["local", "--clients", "3", "--rounds", "500", "--epochs",
                                         "1", "--out", "run"], cwd=tmp_path, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        wait_for_lines(tmp_path / "run" / "metrics.jsonl", 2, p)
        os.killpg(p.pid, signal.SIGINT)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130, err
    assert err.strip().splitlines()[-1] == ("fednet: interrupted; partial results were kept in "
                                            "run; continue it with `fednet local --resume run`")
    assert "status                  interrupted" in out
    assert (tmp_path / "run" / "checkpoint" / "state.json").is_file()  # none was asked for


def test_a_failed_or_diverged_runs_accuracy_is_marked_and_its_error_shown():
    from fednet.metrics.report import summary_rows

    for status in ("failed", "diverged", "error"):
        rows = dict(summary_rows({"status": status, "final_accuracy": 0.1, "best_accuracy": 0.1,
                                  "error": "round 0: why"}, info={}))
        assert rows["final accuracy"] == f"10.00% ({status}: not a result)"
        assert rows["error"] == "round 0: why"
    rows = dict(summary_rows({"status": "completed", "final_accuracy": 0.9}, info={}))
    assert rows["final accuracy"] == "90.00%" and "error" not in rows


def test_a_long_stage_reports_its_tasks_as_they_finish():
    import io

    from fednet.metrics.progress import Progress

    out = io.StringIO()
    count = Progress(5, stream=out).counter(3, "setup stage", every_s=0.0)
    assert [count(None) for _ in range(3)] == [[], [], []]  # it releases no tasks
    lines = out.getvalue().splitlines()
    assert [ln.split(",")[0] for ln in lines] == ["setup stage: 1/3 tasks done",
                                                  "setup stage: 2/3 tasks done"]


def test_report_shows_a_run_in_progress_from_its_rows(tmp_path):
    """Issue 24: `fednet report` on a run that has rows but no summary.json yet."""
    import json

    from fednet.metrics.report import compare, load_summary, summary_rows

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_text("rounds = 10\nclients = 4\n")
    rows = [{"round": 0, "accuracy": 0.5, "wall_s": 1.0, "sim_s": 2.0},
            {"round": 1, "accuracy": 0.7, "wall_s": 2.0, "sim_s": 4.0}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"rou')
    table = dict(summary_rows(load_summary(run), info={}))
    assert "running (no summary.json yet)" in compare([str(run)])
    assert table["status"] == "running (no summary.json yet)"
    assert table["rounds"] == "2/10" and table["final accuracy"] == "70.00%"


def test_a_dp_run_whose_loss_went_non_finite_is_told_of_the_noise():
    from fednet.metrics.progress import stalled_hint

    first = {"round": 0, "loss": 2.3, "accuracy": 0.1}
    now = {"round": 5, "loss": float("inf"), "accuracy": 0.1}
    assert "smaller --lr" in stalled_hint(first, now)
    dp = stalled_hint(first, {**now, "epsilon": 3.0})
    assert "the noise is the likely cause" in dp


def test_the_privacy_rows_name_the_relation_and_the_remarks():
    from fednet.metrics.what_ran import privacy_rows

    rows = dict(privacy_rows({"mode": "central", "sampling": "fixed", "accountant": "rdp",
                              "epsilon": 2.0, "delta": 1e-5, "relation": "replace one user",
                              "remarks": ["the noise is likely to swamp the updates"],
                              "non_finite_results": 3}))
    assert "neighbours: replace one user" in rows["privacy (user)"]
    assert rows["privacy remark"] == "the noise is likely to swamp the updates"
    assert rows["privacy: NaN/inf results"].startswith("3 ")
