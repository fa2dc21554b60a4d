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
