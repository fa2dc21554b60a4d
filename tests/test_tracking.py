"""--track's parsing and what it sends (tests/integration/test_tracking.py runs the real tools)."""
from __future__ import annotations

import importlib.util
import math

import pytest

from fednet.errors import ConfigError
from fednet.metrics import tracking
from fednet.metrics.run_end import run_note


def test_specs_are_parsed_and_a_missing_package_says_how_to_install_it(monkeypatch):
    if importlib.util.find_spec("tensorboard"):  # (the test extra installs it)
        assert tracking.parse("tensorboard:/tmp/tb") == ("tensorboard", "/tmp/tb")
    with pytest.raises(ConfigError, match=r"--track 'neptune': expected tensorboard\[:DIR\]"):
        tracking.parse("neptune")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match=r"the mlflow package is not installed; pip install "
                                          r"'fednet\[mlflow\]'"):
        tracking.check(["mlflow:http://127.0.0.1:5000"])


def test_a_row_becomes_its_numbers_and_a_config_its_parameters():
    row = {"round": 3, "accuracy": 0.5, "loss": math.nan, "converged": True, "note": "x",
           "bytes_round": {"server_to_client": 10, "client_to_server": 4}}
    assert tracking.scalars(row) == {"accuracy": 0.5, "bytes_round/server_to_client": 10.0,
                                     "bytes_round/client_to_server": 4.0}
    assert tracking.flat({"rounds": 5, "gpus": [0, 1], "train": {"lr": 0.1, "model": "auto"},
                          "algo": {"params": {}}}) == {
        "rounds": "5", "gpus": "[0, 1]", "train.lr": "0.1", "train.model": "auto",
        "algo.params": "{}"}


def test_without_a_results_folder_nothing_is_tracked():
    t = tracking.Tracking(("tensorboard",), None, {})
    t.start()
    t.row({"round": 0, "accuracy": 1.0})
    t.end(None, None)
    assert t.trackers == []


class _Fake:
    """A tracker that fails at round fail_at; reachable() says whether its server is back."""

    def __init__(self, where, fail_at=None, back=False):
        self.where, self.fail_at, self.back = where, fail_at, back
        self.rows_got, self.ended, self.abandoned = [], None, False

    def start(self):
        pass

    def row(self, row):
        if row["round"] == self.fail_at:
            raise ConnectionError("server went away")
        self.rows_got.append(row["round"])

    def rows(self, rows):
        self.rows_got += [r["round"] for r in rows]

    def reachable(self):
        return self.back

    def abandon(self):
        self.abandoned = True

    def end(self, summary, out):
        self.ended = summary["status"]


def _tracking(tmp_path, *fakes):
    t = tracking.Tracking((), tmp_path, {})
    t.trackers = list(fakes)
    for f in fakes:
        t.spec[id(f)] = f.where
    return t


def _warnings(caplog, fn):
    import logging

    logger = logging.getLogger("fednet")  # fednet's loggers may not propagate to root
    logger.addHandler(caplog.handler)
    caplog.clear()
    try:
        with caplog.at_level("WARNING", logger="fednet"):
            fn()
    finally:
        logger.removeHandler(caplog.handler)
    return {r.getMessage() for r in caplog.records if r.name == "fednet"}  # (a set: the record
    # may reach caplog by two handlers)


def test_a_tracker_that_fails_mid_run_is_dropped_and_the_others_go_on(tmp_path, caplog):
    bad, good = _Fake("mlflow:http://gone", fail_at=1), _Fake("tensorboard")
    t = _tracking(tmp_path, bad, good)
    rows = [{"round": r, "accuracy": 0.5} for r in range(3)]
    said = _warnings(caplog, lambda: [t.row(r) for r in rows])
    t.recover(rows)  # its server is still away: it stays dropped
    summary = {"status": "completed", **t.notes()}
    t.end(summary, tmp_path)
    assert (bad.rows_got, bad.ended, bad.abandoned) == ([0], None, True)  # never called again
    assert (good.rows_got, good.ended, good.abandoned) == ([0, 1, 2], "completed", False)
    command = f"fednet track upload {tmp_path} --track mlflow:http://gone"
    assert said == {
        "tracking to mlflow:http://gone stopped (ConnectionError: server went away); the run goes "
        f"on, its results are in its folder; after the run, `{command}` sends it"}
    assert summary["tracking"] == {"dropped": ["mlflow:http://gone"], "upload": command}
    assert run_note(summary) == ("tracking to mlflow:http://gone dropped during the run; send "
                                 f"the finished run with `{command}`")


def test_a_dropped_tracker_whose_server_is_back_gets_the_rows_it_missed(tmp_path, caplog):
    back = _Fake("mlflow:http://back", fail_at=1, back=True)
    t = _tracking(tmp_path, back)
    rows = [{"round": r, "accuracy": 0.5} for r in range(4)]
    for r in rows:
        t.row(r)
    said = _warnings(caplog, lambda: t.recover(rows))
    assert t.notes() == {}
    t.end({"status": "completed"}, tmp_path)
    assert (back.rows_got, back.ended, back.abandoned) == ([0, 1, 2, 3], "completed", False)
    assert said == {"tracking to mlflow:http://back is back: it got the 3 rows it missed"}
    assert run_note({"status": "completed"}) is None


def test_a_tracking_server_that_is_not_there_is_one_short_line_in_a_second():
    import socket
    import time

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.monotonic()
    with pytest.raises(OSError) as e:
        tracking.probe(f"http://127.0.0.1:{port}/")
    assert time.monotonic() - t0 < 1.0
    line = tracking.failure(f"mlflow:http://127.0.0.1:{port}", e.value)
    assert line == (f"--track mlflow:http://127.0.0.1:{port}: nothing answers at 127.0.0.1:{port} "
                    "(Connection refused); is the tracking server running, and is that its "
                    "address?")
    tracking.probe("sqlite:///x.db")  # not a server: nothing to probe
    long = RuntimeError("x" * 500 + "\nmore")
    assert len(tracking.failure("mlflow:http://h:1", long)) < 260


def test_mlflow_3s_refusal_of_file_stores_says_what_to_use():
    refused = RuntimeError("The filesystem tracking backend (e.g., './mlruns') is in maintenance "
                           "mode and will not receive further updates. " + "x" * 300)
    assert tracking.failure("mlflow:file:///tmp/mlruns", refused) == (
        "--track mlflow:file:///tmp/mlruns: MLflow 3 refuses file stores (./mlruns, file:...); "
        "use mlflow:sqlite:///mlflow.db or a tracking server (mlflow:http://HOST:PORT)")


def _folder(tmp_path, summary=True, track=()):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_text(f"rounds = 2\ntrack = {list(track)!r}\n[algo]\nname = 'fedavg'\n"
                                     .replace("'", '"'))
    (run / "metrics.jsonl").write_text('{"round": 0, "accuracy": 0.5}\n{"round": 1, "accuracy": 0.7}\n')
    if summary:
        (run / "summary.json").write_text('{"status": "completed", "rounds": 2}')
    return run


def _upload(*args):
    from click.testing import CliRunner

    from fednet.cli import main

    return CliRunner().invoke(main, ["track", "upload", *map(str, args)])


def test_track_upload_refuses_a_run_that_has_not_ended_and_one_with_nowhere_to_go(tmp_path):
    r = _upload(_folder(tmp_path, summary=False), "--track", "tensorboard")
    assert r.exit_code == 2 and r.output.strip() == (
        f"fednet: error: '{tmp_path / 'run'}' has no summary.json: the run is still going, or was "
        "killed before its end (--resume it, or upload once it has ended)")
    (tmp_path / "run" / "summary.json").write_text('{"status": "completed", "rounds": 2}')
    r = _upload(tmp_path / "run")
    assert r.exit_code == 2 and r.output.strip() == (
        "fednet: error: --track: say where to send the run: --track mlflow[:URI], --mlflow URI "
        "or --track tensorboard[:DIR] (the run itself tracked nothing)")
    r = _upload(tmp_path / "run", "--track", "wandb")
    assert r.exit_code == 2 and "--track 'wandb': expected tensorboard[:DIR] or mlflow[:URI]" in r.output
    r = _upload(tmp_path / "nothing", "--mlflow", "sqlite:///x.db")
    assert r.exit_code == 2 and "is not a run folder" in r.output


def test_track_upload_to_a_server_that_is_not_there_is_one_line(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run = _folder(tmp_path, track=[f"mlflow:http://127.0.0.1:{port}"])  # the run's own --track
    r = _upload(run)
    assert r.exit_code == 2 and r.output.strip() == (
        f"fednet: error: --track mlflow:http://127.0.0.1:{port}: nothing answers at "
        f"127.0.0.1:{port} (Connection refused); is the tracking server running, and is that its "
        "address?")
    assert not (run / "mlflow.json").exists()
