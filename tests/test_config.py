"""Configuration: TOML round trip, overrides, validation messages that name the option."""
from __future__ import annotations

import pytest

from fednet.config import RunConfig, from_dict, load_toml, merge, to_toml
from fednet.algorithms.checks import validate
from fednet.errors import ConfigError


def test_toml_round_trip_preserves_every_field(tmp_path):
    cfg = RunConfig().replace(**{"train.lr": 0.3, "algo.params.mu": 0.01, "gpus": [0, 1],
                                 "data.partition": "dirichlet"})
    p = tmp_path / "run.toml"
    p.write_text(to_toml(cfg))
    back = from_dict(load_toml(p))
    assert back == cfg
    assert back.algo.params == {"mu": 0.01}
    assert back.gpus == (0, 1)


def test_dotted_overrides_merge_into_nested_sections():
    d = merge(RunConfig().to_dict(), {"train.epochs": 3, "latency.preset": "wan", "clients": 9})
    cfg = from_dict(d)
    assert (cfg.train.epochs, cfg.latency.preset, cfg.clients) == (3, "wan", 9)
    assert cfg.train.lr == RunConfig().train.lr


def test_unknown_key_is_named():
    with pytest.raises(ConfigError, match="unknown key 'train.lrate'"):
        from_dict({"train": {"lrate": 0.1}})


@pytest.mark.parametrize("over,option", [
    ({"clients": 0}, "--clients"), ({"rounds": 0}, "--rounds"), ({"algo.name": "nope"}, "--algo"),
    ({"algo.fraction": 0.0}, "--fraction"), ({"data.partition": "x"}, "--partition"),
    ({"data.alpha": -1.0}, "--alpha"), ({"train.lr": 0.0}, "--lr"), ({"train.epochs": 0}, "--epochs"),
    ({"train.momentum": 1.0}, "--momentum"), ({"net.port": 70000}, "net.port"),
    ({"latency.preset": "moon"}, "--latency"), ({"train.batch_size": 0}, "--batch-size"),
    ({"net.max_inflight": -1}, "--max-inflight"),
    ({"net.clients_per_process": 2, "latency.real": True}, "--clients-per-process"),
])
def test_validation_names_the_option(over, option):
    with pytest.raises(ConfigError, match=option):
        validate(RunConfig().replace(**over))


def test_invalid_toml_is_a_config_error(tmp_path):
    p = tmp_path / "bad.toml"
    p.write_text("clients = = 3\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_toml(p)
    with pytest.raises(ConfigError, match="does not exist"):
        load_toml(tmp_path / "missing.toml")
