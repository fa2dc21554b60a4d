"""--attack, --malicious, --defense and --param from the command line to config.toml and back."""
from __future__ import annotations

import pytest

from fednet.cli import RUN_DEFAULTS, local
from fednet.cli.options import build_config
from fednet.config import to_toml, validate
from fednet.errors import ConfigError


def _cfg(args):
    ctx = local.make_context("local", list(args))
    return build_config(ctx.params, dict(RUN_DEFAULTS, clients=10))


def test_param_goes_to_its_owner_and_round_trips(tmp_path):
    cfg = _cfg(["--algo", "fedprox", "--attack", "alie", "--malicious", "ids:1-2",
                "--defense", "krum", "--param", "z=1.5", "--param", "f=2", "--param", "mu=0.1"])
    assert cfg.attack.params == {"z": 1.5} and cfg.defense.params == {"f": 2}
    assert cfg.algo.params == {"mu": 0.1} and cfg.attack.malicious == "ids:1-2"
    validate(cfg)
    (tmp_path / "c.toml").write_text(to_toml(cfg))
    again = _cfg(["--config", str(tmp_path / "c.toml")])
    assert again.attack == cfg.attack and again.defense == cfg.defense and again.algo == cfg.algo


def test_wrong_params_name_their_owner():
    with pytest.raises(ConfigError, match="not a parameter of the algorithm, the attack"):
        _cfg(["--attack", "alie", "--param", "nope=1"])
    with pytest.raises(ConfigError, match="alie"):
        _cfg(["--attack", "alie", "--param", "z=-1"])
    with pytest.raises(ConfigError, match="--malicious"):
        validate(_cfg(["--attack", "ipm", "--malicious", "2"]))
