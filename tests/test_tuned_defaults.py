"""Tuned defaults (registry Spec.tuned): what a run does not set itself comes from the
algorithm's tuning for the partition; options and --config files always win; the evaluation of
personalized clients on label-skewed partitions follows their own label distribution."""
from __future__ import annotations

import torch
import torch.nn as nn

from fednet.algorithms.common import evaluate_own
from fednet.algorithms.contract import ClientContext
from fednet.algorithms.registry import REGISTRY
from fednet.config import RunConfig
from fednet.cli.options import build_config


def _cfg(**opts):
    return build_config(opts, {})


def test_tuned_defaults_fill_what_the_run_leaves_open():
    spec = REGISTRY["fedavg"]
    tuned = spec.tuned_for("shards")
    assert tuned, "fedavg has tuned defaults for shards"
    cfg = _cfg(algo="fedavg", partition="shards")
    for key, val in tuned.items():
        node = cfg.to_dict()
        for part in key.split("."):
            node = node[part]
        assert node == val, key
    assert set(cfg.tuned) == {f"{k}={v}" for k, v in tuned.items()}


def test_an_option_or_a_config_file_wins_over_tuned(tmp_path):
    cfg = _cfg(algo="fedavg", partition="shards", lr=0.33)
    assert cfg.train.lr == 0.33
    assert not any(t.startswith("train.lr=") for t in cfg.tuned)
    f = tmp_path / "run.toml"
    f.write_text("[train]\nepochs = 7\n")
    cfg = _cfg(algo="fedavg", partition="shards", config_file=str(f))
    assert cfg.train.epochs == 7
    assert not any(t.startswith("train.epochs=") for t in cfg.tuned)


def test_iid_fedavg_keeps_the_global_defaults():
    cfg = _cfg(algo="fedavg", partition="iid")
    base = RunConfig()
    assert (cfg.train.lr, cfg.train.epochs, cfg.rounds) == (base.train.lr, base.train.epochs,
                                                            base.rounds)
    assert cfg.tuned == ()


class _Const(nn.Module):
    """Always predicts class `k`."""

    def __init__(self, k: int, n: int = 3) -> None:
        super().__init__()
        self.k, self.n = k, n

    def forward(self, x):
        out = torch.zeros(len(x), self.n)
        out[:, self.k] = 10.0
        return out


def _ctx(partition: str, train_y: list[int], model: nn.Module) -> ClientContext:
    cfg = RunConfig().replace(**{"data.partition": partition})
    test_y = torch.tensor([0, 0, 0, 0, 1, 1, 2, 2, 2, 2])
    return ClientContext(0, model, torch.zeros(len(train_y), 2), torch.tensor(train_y), cfg,
                         torch.device("cpu"), test_x=torch.zeros(len(test_y), 2), test_y=test_y)


def test_personal_score_weighs_the_test_set_by_the_clients_labels():
    # a client holding only class 1 is scored on class 1: a model that always says 1 scores 1.0
    assert evaluate_own(_ctx("shards", [1, 1, 1], _Const(1)))["accuracy"] == 1.0
    # train labels 3x class 0 and 1x class 2: the score is 0.75 * acc_0 + 0.25 * acc_2
    assert evaluate_own(_ctx("dirichlet", [0, 0, 0, 2], _Const(0)))["accuracy"] == 0.75
    assert evaluate_own(_ctx("dirichlet", [0, 0, 0, 2], _Const(2)))["accuracy"] == 0.25
    # iid: the whole test set as it is (4 of 10 are class 0)
    assert evaluate_own(_ctx("iid", [1, 1, 1], _Const(0)))["accuracy"] == 0.4


def test_a_parameter_set_in_a_files_params_table_wins(tmp_path):
    """A resumed run reads its config.toml, whose [algo.params] is a table: a tuned algorithm
    parameter must not replace the one it recorded (SCAFFOLD's option)."""
    f = tmp_path / "run.toml"
    f.write_text('[algo]\nname = "scaffold"\n[algo.params]\noption = 2\n')
    cfg = _cfg(config_file=str(f))
    assert cfg.algo.params["option"] == 2
    assert not any(t.startswith("algo.params.option") for t in cfg.tuned)
    assert _cfg(algo="scaffold").algo.params["option"] == 1  # left open: the tuned value
