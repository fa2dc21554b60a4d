"""fednet.api.run: the command line's options as keyword arguments, the same configuration as
`fednet local`, one ConfigError for a wrong type, and the results back in Python."""
from __future__ import annotations

import re

import pytest
from click.testing import CliRunner

from fednet.api import run
from fednet.cli import main
from fednet.errors import ConfigError


@pytest.mark.parametrize("kw,says", [
    ({"rounds": "25"}, "rounds='25': rounds takes int"),
    ({"clients": 2.5}, "clients=2.5: clients takes int"),
    ({"seed": True}, "seed=True: seed takes int"),
    ({"lrr": 0.1}, "run() has no option 'lrr'"),
    ({"algo": "fedav"}, "did you mean 'fedavg'"),
    ({"algo": "fedbuff", "params": {"buffer": "x"}}, "fedbuff expects buffer to be an integer"),
    ({"rounds": 0}, "rounds must be at least 1 (got 0)"),
])
def test_a_wrong_value_is_one_error_naming_the_option(kw, says, tmp_path):
    with pytest.raises(ConfigError, match=None) as e:
        run(out=str(tmp_path / "run"), **kw)
    assert says in str(e.value)
    assert not re.search(r"(?<![\w-])--(?!help\b)[a-z]", str(e.value))  # keywords, not options
    assert not (tmp_path / "run").exists()  # nothing was started


def test_run_returns_the_results_and_builds_what_fednet_local_builds(tmp_path):
    exp = run(algo="fedbuff", clients=6, rounds=3, epochs=1, latency="hetero",
              params={"buffer": 2}, out=str(tmp_path / "api"))
    assert exp.summary["status"] == "completed" and exp.summary["rounds"] == 3
    assert [r["round"] for r in exp.history] == [0, 1, 2]
    assert exp.history[-1]["sim_s"] == exp.summary["sim_time_s"] > 0
    assert exp.model and all(a.size for a in exp.model.values())
    got = CliRunner().invoke(main, ["local", "--algo", "fedbuff", "--clients", "6", "--rounds",
                                    "3", "--epochs", "1", "--latency", "hetero", "--param",
                                    "buffer=2", "-q", "--out", str(tmp_path / "cli")])
    assert got.exit_code == 0, got.output
    assert (tmp_path / "cli" / "config.toml").read_text() == (exp.out / "config.toml").read_text()
    cli = (tmp_path / "cli" / "summary.json").read_text()
    assert f'"final_accuracy": {exp.summary["final_accuracy"]}' in cli


def test_the_plugin_api_is_one_module_and_the_example_uses_only_it():
    import ast
    import subprocess
    import sys
    from pathlib import Path

    import fednet.api as api

    for name in api._EXPORTS:  # every name resolves to what its module defines
        assert getattr(api, name) is getattr(__import__(api._EXPORTS[name], fromlist=[name]), name)
    with pytest.raises(AttributeError, match="has no attribute 'nothing'"):
        api.nothing  # noqa: B018
    root = Path(__file__).resolve().parents[1] / "examples" / "fednet-example-plugin" / "src"
    used = {n.module for f in root.rglob("*.py") for n in ast.walk(ast.parse(f.read_text()))
            if isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] == "fednet"}
    assert used == {"fednet.api"}
    code = "import sys; from fednet.api import Spec, param, register; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"  # a Spec module stays free of torch


def test_a_renamed_api_name_still_works_with_a_warning(monkeypatch):
    """The deprecation path of docs/extending.md ("What is stable"): an old name is served with
    a DeprecationWarning naming the new one."""
    import warnings

    import fednet.api as api

    monkeypatch.setitem(api._RENAMED, "old_local_sgd", "local_sgd")
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        assert api.old_local_sgd is api.local_sgd
    assert [str(w.message) for w in got] == [
        "fednet.api.old_local_sgd is now fednet.api.local_sgd; the old name goes away in a "
        "later minor version"]
    assert all(w.category is DeprecationWarning for w in got)
