"""--attack, --malicious, --defense and --param from the command line to config.toml and back."""
from __future__ import annotations

import pytest

from fednet.cli import RUN_DEFAULTS, local
from fednet.cli.options import build_config
from fednet.algorithms.checks import validate
from fednet.config import to_toml
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


def test_centered_clipping_resumes_from_its_checkpointed_center(tmp_path):
    """FedAdam under --defense centered_clip: stopped after 2 rounds and resumed for a third,
    the same model as 3 rounds at once (the center is in the server state)."""
    import numpy as np

    base = ["--clients", "6", "--epochs", "1", "--algo", "fedadam", "--defense", "centered_clip",
            "-q"]
    for args in (["--rounds", "2", "--checkpoint-every", "1", "--out", str(tmp_path / "a")],
                 ["--resume", str(tmp_path / "a"), "--rounds", "3", "-q"],
                 ["--rounds", "3", "--out", str(tmp_path / "b")]):
        local.main([*base, *args] if "--resume" not in args else args, standalone_mode=False)
    with np.load(tmp_path / "a" / "final_model.npz") as a, \
            np.load(tmp_path / "b" / "final_model.npz") as b:
        assert a.files == b.files and all(np.array_equal(a[k], b[k]) for k in a.files)
    with np.load(tmp_path / "a" / "checkpoint" / "state.npz") as z:
        assert "state/center" in z.files


def test_a_round_the_defense_refuses_is_a_failed_round_named(tmp_path, monkeypatch):
    """Krum over 10 clients of which 4 fail every round: 6 results cannot hold f = 2 (it needs
    7), so each round keeps the model, says why, and the run fails after --max-failed-rounds."""
    import json

    from fednet.algorithms.fedavg import FedAvgClient
    from fednet.core.inproc import run_local
    from tests.conftest import small_config

    run = FedAvgClient.run

    def failing(self, ctx, task):
        if ctx.cid < 4:
            raise RuntimeError("lazy")
        return run(self, ctx, task)
    monkeypatch.setattr(FedAvgClient, "run", failing)
    cfg = small_config(clients=10, rounds=4, defense={"name": "krum"}, out=str(tmp_path / "r"))
    s = run_local(cfg, quiet=True)
    rows = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    why = ("--defense krum refused the round: 6 results cannot hold its assumption of f = 2 "
           "Byzantine ones (it needs n >= 7); the model stays as it was")
    assert [r["round_failed"] for r in rows] == [why] * 3 and all(r["results"] == 0 for r in rows)
    assert s["status"] == "failed" and s["rounds"] == 3
    assert s["error"].startswith(f"3 rounds in a row without a usable result (rounds 1-3; the "
                                 f"last: {why})")
