"""--track's parsing and what it sends (tests/integration/test_tracking.py runs the real tools)."""
from __future__ import annotations

import importlib.util
import math

import pytest

from fednet.errors import ConfigError
from fednet.metrics import tracking


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


def test_a_tracker_that_fails_mid_run_is_dropped_and_the_others_go_on(tmp_path, caplog):
    class Fake:
        def __init__(self, where, fail_at=None):
            self.where, self.fail_at, self.rows, self.ended = where, fail_at, [], None

        def start(self):
            pass

        def row(self, row):
            if row["round"] == self.fail_at:
                raise ConnectionError("server went away")
            self.rows.append(row["round"])

        def end(self, summary, out):
            self.ended = summary["status"]

    import logging

    logger = logging.getLogger("fednet")  # fednet's loggers may not propagate to root
    logger.addHandler(caplog.handler)
    t = tracking.Tracking((), tmp_path, {})
    bad, good = Fake("http://gone", fail_at=1), Fake("tb")
    t.trackers = [bad, good]
    try:
        with caplog.at_level("WARNING", logger="fednet"):
            for r in range(3):
                t.row({"round": r, "accuracy": 0.5})
    finally:
        logger.removeHandler(caplog.handler)
    t.end({"status": "completed"}, tmp_path)
    assert (bad.rows, bad.ended) == ([0], None)  # dropped at its failure, never called again
    assert (good.rows, good.ended) == ([0, 1, 2], "completed")
    assert {r.getMessage() for r in caplog.records if r.name == "fednet"} == {  # (a set: the
        "tracking to http://gone stopped (ConnectionError: server went away); the run goes on, "
        "its results are in its folder"}  # record may reach caplog by two handlers)
