"""Plugins in one process: a --plugin module registers an algorithm, a model, a dataset and an
objective; the run names it (WELCOME's plugins); a client host without it, or with another
version, refuses in one line. The example package over real processes: tests/integration/
test_plugins.py."""
from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from fednet import plugins
from fednet.core import plugin_check
from fednet.algorithms import halves, registry
from fednet.config import RunConfig
from fednet.data import datasets
from fednet.errors import ConfigError
from fednet.models import nets
from fednet.training import objective

PLUGIN = textwrap.dedent('''
    """A plugin module (not packaged)."""
    import numpy as np
    import torch
    from torch import nn

    from fednet.algorithms.registry import Spec, register
    from fednet.data.datasets import Dataset, register_dataset
    from fednet.models.nets import register_model
    from fednet.rng import generator
    from fednet.training.objective import Classification, register_objective


    class Smooth(Classification):
        """Cross-entropy with label smoothing 0.1 (another loss, same score)."""

        name = "smooth_ce"

        def loss(self, out, y):
            return torch.nn.functional.cross_entropy(out, y, label_smoothing=0.1)


    def load(data_root, download, split_seed):
        g = generator(split_seed, "toyset")
        x = g.normal(size=(300, 1, 2, 2)).astype(np.float32)
        y = (x.reshape(300, 4).sum(1) > 0).astype(np.int64)
        return Dataset("toyset", x[:200], y[:200], x[200:], y[200:], 2, (1, 2, 2),
                       objective="smooth_ce")


    register(Spec("fedavg_toy", "FedAvg again", "fednet.algorithms.fedavg:FedAvg",
                  "fednet.algorithms.fedavg:FedAvgClient"))
    register_model("toy_linear", lambda k, shape: nn.Sequential(nn.Flatten(), nn.Linear(4, k)))
    register_dataset("toyset", load, model="toy_linear")
    register_objective(Smooth())
''')


@pytest.fixture
def plugin_file(tmp_path: Path):
    """The plugin module as a file; every registry it touched is restored afterwards."""
    saved = [(d, dict(d)) for d in (registry.REGISTRY, plugins.PROVIDERS, plugins.LOADED,
                                    nets._BUILDERS, nets.AUTO_MODELS, datasets._LOADERS,
                                    datasets.DEFAULT_MODELS, objective.OBJECTIVES)]
    lists = [(lst, list(lst)) for lst in (nets.PLUGIN_MODELS, datasets.PLUGIN_DATASETS)]
    path = tmp_path / "toy_plugin.py"
    path.write_text(PLUGIN)
    yield path
    for d, old in saved:
        d.clear()
        d.update(old)
    for lst, old in lists:
        lst[:] = old
    sys.modules.pop("toy_plugin", None)
    datasets.clear_cache()


def test_a_module_registers_every_kind_and_is_their_provider(plugin_file):
    (ref, version), = plugins.load_modules([str(plugin_file)])
    assert ref == str(plugin_file.resolve()) and version.startswith("sha256:")
    for key in [("algorithm", "fedavg_toy"), ("model", "toy_linear"), ("dataset", "toyset"),
                ("objective", "smooth_ce")]:
        assert plugins.PROVIDERS[key] == (ref, version), key
    assert plugins.load_modules([str(plugin_file)]) == [(ref, version)]  # imported once
    assert "fedavg_toy" in registry.names() and "toy_linear" in nets.model_names()
    assert nets.resolve_model("auto", "toyset") == "toy_linear"


def test_the_run_names_its_plugins_and_a_built_in_run_none(plugin_file):
    ref = plugins.reference(str(plugin_file))
    cfg = RunConfig(plugins=(ref,)).replace(**{"algo.name": "fedavg_toy",
                                               "data.dataset": "toyset"})
    assert plugin_check.required(cfg) == [[ref, plugins.LOADED[ref][1]]]
    assert plugin_check.required(RunConfig()) == []
    assert RunConfig().replace(plugins=[ref]).to_dict()["plugins"] == [ref]


def test_the_dataset_objective_drives_training_and_evaluation(plugin_file, tmp_path):
    from fednet.core.inproc import run_local

    ref = plugins.reference(str(plugin_file))
    plugins.load_modules([ref])
    cfg = RunConfig(plugins=(ref,), clients=2, rounds=1, out=str(tmp_path / "run")).replace(
        **{"algo.name": "fedavg_toy", "data.dataset": "toyset", "train.epochs": 1})
    summary = run_local(cfg, quiet=True)
    assert summary["status"] == "completed" and 0 <= summary["final_accuracy"] <= 1
    ds = datasets.load_dataset("toyset")
    obj = objective.get_objective(ds.objective)
    out = torch.tensor([[2.0, -2.0]])
    smooth = float(obj.loss(out, torch.tensor([0])))
    assert smooth > float(torch.nn.functional.cross_entropy(out, torch.tensor([0])))


def test_cli_plugin_option_comes_before_the_algorithm_check(plugin_file, tmp_path):
    from fednet.cli import local
    from fednet.cli.options import build_config

    ctx = local.make_context("local", ["--plugin", str(plugin_file), "--algo", "fedavg_toy",
                                       "--dataset", "toyset", "--out", str(tmp_path / "o")])
    cfg = build_config(ctx.params, {})
    assert cfg.algo.name == "fedavg_toy" and cfg.plugins == (str(plugin_file.resolve()),)


def test_toml_plugins_must_be_strings(tmp_path):
    from fednet.cli.options import _file_overrides

    bad = tmp_path / "bad.toml"
    bad.write_text("plugins = [1]\n")
    with pytest.raises(ConfigError, match="'plugins' must be a list of strings"):
        _file_overrides(str(bad))


def test_a_missing_plugin_module_is_one_line(tmp_path):
    with pytest.raises(ConfigError) as e:
        plugins.load_modules(["no_such_fednet_plugin"])
    assert "--plugin no_such_fednet_plugin: no module named" in str(e.value)
    with pytest.raises(ConfigError, match="no such file"):
        plugins.load_modules([str(tmp_path / "absent.py")])


def test_a_client_host_refuses_missing_or_different_plugins(plugin_file):
    with pytest.raises(plugins.PluginError) as e:
        plugin_check.require([["fednet-no-such-plugin", "1.2.0"]])
    msg = str(e.value)
    assert "needs plugin fednet-no-such-plugin 1.2.0" in msg and "pip install" in msg
    assert "\n" not in msg
    ref = plugins.reference(str(plugin_file))
    with pytest.raises(plugins.PluginError, match="on the server; install the same version"):
        plugin_check.require([[ref, "sha256:0000000000000000"]])
    plugin_check.require([[ref, plugins.LOADED[ref][1]]])  # the same file: accepted


def test_welcome_with_and_without_plugins_decodes():
    from fednet.protocol import Message, MsgKind, decode, encode

    for extra in ({}, {"plugins": [["fednet-example-plugin", "0.1.0"]]}):
        body = {"config": {}, "run_id": "r", **extra}
        msg = Message(MsgKind.WELCOME, "server", "r", body=body,
                      arrays={"cids": np.arange(1), "indices": np.arange(3)})
        assert decode(encode(msg)).body == body
    assert plugin_check.checked_welcome({"config": {}}) == {"config": {}}


OWN = textwrap.dedent('''
    from fednet.algorithms.fedavg import FedAvgClient
    from fednet.algorithms.registry import Spec, register


    class Mine(FedAvgClient):
        marker = "FILE"


    register(Spec("NAME", "FedAvg with its own client class", "fednet.algorithms.fedavg:FedAvg",
                  "REF:Mine"))
''')


@pytest.mark.parametrize("stem,ref", [("random", "random"), ("copy", "copy"),
                                      ("fedmedian_v2", "fedmedian")],
                         ids=["named random.py", "named copy.py", "a renamed copy"])
def test_a_plugin_file_is_its_own_private_module(plugin_file, tmp_path, stem, ref):
    """Issue 24: a .py plugin is imported under a private module name; its Spec may name its own
    classes by the file's stem (random.py shadows nothing) or by the name it had before it was
    copied (fedmedian.py saved as fedmedian_v2.py)."""
    import copy
    import random

    path = tmp_path / f"{stem}.py"
    path.write_text(OWN.replace("NAME", f"own_{stem}").replace("REF", ref).replace("FILE", stem))
    plugins.load_modules([str(path)])
    assert sys.modules["random"] is random and sys.modules["copy"] is copy  # nothing shadowed
    cls = halves.client_class(f"own_{stem}")
    assert cls.marker == stem and cls.__module__ == plugins.private_name(path)
    assert plugins.private_name(path) != plugins.private_name(tmp_path / "other" / f"{stem}.py")


def test_a_plugin_that_fails_to_import_shows_its_traceback_on_request(tmp_path, monkeypatch,
                                                                      capsys):
    bad = tmp_path / "bad_plugin.py"
    bad.write_text("def f():\n    raise ValueError('oops')\n\nf()\n")
    with pytest.raises(ConfigError) as e:
        plugins.load_modules([str(bad)])
    assert "ValueError: oops (FEDNET_DEBUG=1 prints the traceback)" in str(e.value)
    assert "Traceback" not in capsys.readouterr().err
    monkeypatch.setenv("FEDNET_DEBUG", "1")
    with pytest.raises(ConfigError):
        plugins.load_modules([str(bad)])
    err = capsys.readouterr().err
    assert "Traceback" in err and "in f" in err


def test_a_plugin_is_checked_when_it_loads(plugin_file, tmp_path):
    """Issue 41 item 4: a Spec naming a class its file lacks is one line at load (not a
    traceback at the first task), naming the file, the algorithm and the fix; a module that
    registers nothing (`--plugin json`) is refused, not taken without a word."""
    typo = tmp_path / "robust.py"
    typo.write_text(textwrap.dedent('''
        from fednet.api import Spec, Strategy, register
        class TrimmedMean(Strategy):
            pass
        register(Spec("trimmed_typo", "a typo", "robust:TrimedMean",
                      "fednet.algorithms.fedavg:FedAvgClient"))
    '''))
    with pytest.raises(ConfigError) as e:
        plugins.load_modules([str(typo)])
    assert str(e.value) == (
        f"--plugin {typo}: algorithm 'trimmed_typo': its server class 'TrimedMean' cannot be "
        "found (robust.py has no 'TrimedMean'); fix the Spec's server= \"module:Class\"")
    with pytest.raises(ConfigError, match="TrimedMean"):  # again: not taken from the cache
        plugins.load_modules([str(typo)])
    with pytest.raises(ConfigError, match=r"^--plugin json: it registered nothing"):
        plugins.load_modules(["json"])
    plugins.load_modules([str(plugin_file)])  # a plugin that holds up loads
