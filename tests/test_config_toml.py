"""config.toml is written by tomli-w and read by tomllib: awkward keys and values survive the round
trip exactly, and `out` is never recorded."""
from __future__ import annotations

import math

import pytest

from fednet.config import RunConfig, from_dict, load_toml, to_toml
from fednet.cli.options import _file_overrides, build_config

AWKWARD_PARAMS = {
    "with space": 1,
    "dotted.key": 2.5,
    'quo"te': "it's \"quoted\"",
    "back\\slash": "C:\\path\\to",
    "tab\tkey": "a\tb",
    "new\nline key": "line 1\nline 2\r\n",
    "ünïcødé": "日本語 ✓ 🚀",
    "": "empty key",
    "=": "=",
    "[not a table]": True,
    "small": 1e-4,
    "tiny": 5e-324,
    "huge": 1.7976931348623157e308,
    "neg_zero": -0.0,
    "big_int": 2**62,
    "neg_int": -(2**63),
    "plus_inf": float("inf"),
    "minus_inf": float("-inf"),
    "list": [1, 2, 3],
    "nested": {"inner key": {"deeper.still": "x\ny", "n": 3}, "flag": False},
}


def _roundtrip(cfg: RunConfig, tmp_path) -> RunConfig:
    p = tmp_path / "config.toml"
    p.write_text(to_toml(cfg), encoding="utf-8")
    return from_dict(load_toml(p))


def test_awkward_keys_and_values_survive_the_round_trip(tmp_path):
    cfg = RunConfig().replace(**{"data.data_root": 'a "dir"\nwith newline\\ and ünïcødé',
                                 "net.secure": "keys/ [x]", "train.lr": 1e-4,
                                 "train.weight_decay": 3.3e-9, "gpus": [0, 3]})
    cfg = from_dict({**cfg.to_dict(), "algo": {**cfg.to_dict()["algo"], "params": AWKWARD_PARAMS}})
    back = _roundtrip(cfg, tmp_path)
    assert back == cfg
    assert back.algo.params == AWKWARD_PARAMS
    assert set(back.algo.params) == set(AWKWARD_PARAMS)  # "dotted.key" stays one key
    assert math.copysign(1.0, back.algo.params["neg_zero"]) == -1.0
    assert back.train.lr == 1e-4 and back.gpus == (0, 3)


def test_nan_survives_as_nan(tmp_path):
    cfg = from_dict({"algo": {"params": {"x": float("nan")}}})
    back = _roundtrip(cfg, tmp_path)
    assert math.isnan(back.algo.params["x"])


def test_out_is_not_recorded_even_when_it_is_awkward(tmp_path):
    cfg = RunConfig().replace(out="runs/a\nb \"c\"")
    text = to_toml(cfg)
    assert "out" not in load_toml_text(text, tmp_path)
    assert _roundtrip(cfg, tmp_path) == cfg.replace(out="")


def load_toml_text(text: str, tmp_path) -> dict:
    p = tmp_path / "t.toml"
    p.write_text(text, encoding="utf-8")
    return load_toml(p)


def test_the_written_file_is_valid_toml_for_every_default_section(tmp_path):
    d = load_toml_text(to_toml(RunConfig()), tmp_path)
    assert set(d) == set(RunConfig().to_dict()) - {"out"}
    assert d["algo"]["params"] == {}


def test_a_written_config_is_accepted_by_config_and_overrides(tmp_path):
    cfg = from_dict({"clients": 4, "algo": {"name": "fedprox", "params": {"mu": 0.5}}})
    p = tmp_path / "run.toml"
    p.write_text(to_toml(cfg), encoding="utf-8")
    built = build_config({"config_file": str(p), "rounds": 2}, {})
    assert built.algo.params == {"mu": 0.5}
    assert (built.clients, built.rounds, built.out) == (4, 2, "")


def test_algorithm_parameters_in_a_config_file_are_checked_against_the_algorithm(tmp_path):
    """The awkward keys above survive TOML; an algorithm still takes only what it declares."""
    from fednet.errors import ConfigError

    cfg = from_dict({"algo": {"name": "fedprox", "params": {"mu": 0.5, "odd key.x": {"y": 1}}}})
    p = tmp_path / "run.toml"
    p.write_text(to_toml(cfg), encoding="utf-8")
    with pytest.raises(ConfigError, match=r"^--param odd key.x is not a fedprox parameter "
                                          r"\(it takes: mu\)"):
        build_config({"config_file": str(p)}, {})
    p.write_text('[algo]\nname = "fedprox"\n[algo.params]\nmu = "abc"\n', encoding="utf-8")
    with pytest.raises(ConfigError, match=r"^--param mu=abc: fedprox expects mu to be a number "
                                          r">= 0$"):
        build_config({"config_file": str(p)}, {})


def test_out_in_an_older_config_file_is_ignored_and_only_the_command_line_sets_it(tmp_path):
    p = tmp_path / "old.toml"
    p.write_text('out = "runs/old"\nclients = 3\n', encoding="utf-8")
    assert "out" not in _file_overrides(str(p))
    assert build_config({"config_file": str(p)}, {}).out == ""
    assert build_config({"config_file": str(p), "out": "mine"}, {}).out == "mine"


@pytest.mark.parametrize("value", [None, object()])
def test_a_value_toml_cannot_hold_is_a_config_error(value):
    from fednet.errors import ConfigError

    cfg = from_dict({"algo": {"params": {"x": value}}})
    with pytest.raises(ConfigError, match="cannot be written as TOML"):
        to_toml(cfg)
