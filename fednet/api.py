"""fednet from Python: run an experiment from keyword arguments and get its results back.

    from fednet.api import run

    exp = run(algo="fedbuff", clients=20, rounds=10, latency="hetero", params={"buffer": 5},
              out="runs/fedbuff-demo")
    exp.summary["final_accuracy"], exp.history[-1]["sim_s"], exp.model["fc2.weight"].shape

The keywords are the command line's options, with underscores (`--batch-size 16` is
`batch_size=16`, `--param mu=0.1` is `params={"mu": 0.1}`, `--config F` is `config_file=F`),
and they go through the command line's own checks, tuned defaults and results-folder rules, so
`run(...)` and `fednet local ...` build the same configuration. A value of the wrong Python type
(`rounds="25"`, `clients=2.5`, `seed=True`) is a ConfigError naming the option, before anything
starts. `runtime="launch"` runs one server and N client processes as `fednet launch` does.

It is also the one module a plugin imports from (docs/extending.md): the algorithm contract
(Spec, register, param, Strategy, ClientUpdate, their states, ClientContext, ServerInfo,
ServerPiece: a piece of the server's update path that a Strategy holds, add_piece), the
update path's pieces (DefenseSpec, AttackSpec, DPSpec, Facts, CodecSpec, register_defense,
register_attack, register_dp, register_codec, CompressionError; FieldGrid and
register_field_grid: a codec's common grid under secure aggregation), the
helpers most algorithms use (usable, round_metrics, local_sgd, state_arrays, load_arrays), the
model, dataset and objective registries, fednet's types and seeded streams. Each is imported
when first asked for (`from fednet.api import Spec, param` imports no torch, as a Spec module
must not: the command line imports it to list --algo choices).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import numpy as np

from fednet.errors import ConfigError

_EXPORTS = {  # name -> the module that defines it
    **dict.fromkeys(("Spec", "register"), "fednet.algorithms.spec"),
    "param": "fednet.config.declare", "NoParams": "fednet.algorithms.params",
    **dict.fromkeys(("DefenseSpec", "AttackSpec", "Facts", "register_defense", "register_attack"),
                    "fednet.algorithms.robust_spec"),
    **dict.fromkeys(("DPSpec", "register_dp"), "fednet.algorithms.dp_spec"),
    **dict.fromkeys(("CodecSpec", "CompressionError"), "fednet.compress.codecs"),
    **dict.fromkeys(("register_codec", "register_field_grid"), "fednet.algorithms.seam"),
    "FieldGrid": "fednet.compress.field",
    **dict.fromkeys(("Strategy", "StagedStrategy", "ClientUpdate", "ServerState", "NoState", "Model",
                     "ClientContext", "ServerInfo", "RoundContext", "ServerPiece"),
                    "fednet.algorithms.contract"),
    **dict.fromkeys(("usable", "round_metrics", "evaluate_own"), "fednet.algorithms.common"),
    "local_sgd": "fednet.algorithms.updates",
    **dict.fromkeys(("state_arrays", "load_arrays"), "fednet.models.arrays"),
    "register_model": "fednet.models.nets",
    "Dataset": "fednet.data.base", "register_dataset": "fednet.data.datasets",
    **dict.fromkeys(("Objective", "Classification", "register_objective"),
                    "fednet.training.objective"),
    **dict.fromkeys(("Arrays", "Task", "Result", "Failure", "ClientInfo", "Roster", "cids", "lookup"),
                    "fednet.types"),
    "generator": "fednet.rng", "FednetError": "fednet.errors",
}
__all__ = ["Experiment", "run", "options", "ConfigError", *_EXPORTS]  # noqa: PLE0604 - lazy names


_RENAMED: dict[str, str] = {}
"""Old public name -> its new name: still served, with a DeprecationWarning, for at least one
minor version after the rename (docs/extending.md, "What is stable")."""


def __getattr__(name: str) -> Any:
    """The plugin API's names, imported on first use (a renamed one with a warning)."""
    if name in _RENAMED:
        import warnings

        new = _RENAMED[name]
        warnings.warn(f"fednet.api.{name} is now fednet.api.{new}; the old name goes away in a "
                      "later minor version", DeprecationWarning, stacklevel=2)
        return __getattr__(new)
    if name not in _EXPORTS:
        raise AttributeError(f"module 'fednet.api' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


@dataclass
class Experiment:
    """What a run left: its summary (summary.json), its rows (metrics.jsonl), its final model's
    arrays and its results folder."""

    summary: dict[str, Any]
    history: list[dict[str, Any]]
    model: dict[str, np.ndarray]
    out: Path


def options() -> dict[str, click.Parameter]:
    """The keyword arguments run() takes: the options of `fednet local` by name."""
    from fednet.cli import local

    return {p.name: p for p in local.params if p.name}


def _python_type(p: click.Parameter) -> tuple[type, ...]:
    t = p.type
    if getattr(p, "is_flag", False) or isinstance(t, click.types.BoolParamType):
        return (bool,)
    if isinstance(t, click.types.IntParamType):
        return (int,)
    if isinstance(t, click.types.FloatParamType):
        return (int, float)
    if isinstance(t, click.Path):
        return (str, Path)
    return (str,)


def _argument(name: str, value: Any, p: click.Parameter) -> Any:
    """The option's value as the command line would have parsed it; ConfigError when its type
    is wrong or the option refuses it."""
    if name == "params" and isinstance(value, dict):
        value = [f"{k}={v}" for k, v in value.items()]
    want = _python_type(p)
    items = list(value) if p.multiple and isinstance(value, (list, tuple)) else [value]
    for v in items:
        if not isinstance(v, want) or (bool not in want and isinstance(v, bool)):
            names = " or ".join(t.__name__ for t in want)
            raise ConfigError(f"{name}={value!r}: {p.opts[-1]} takes {names}"
                              f"{' (or a list of them)' if p.multiple else ''}")
    try:
        conv = [p.type.convert(str(v) if isinstance(v, Path) else v, p, None) for v in items]
    except click.BadParameter as e:
        raise ConfigError(f"{name}={value!r}: {e.format_message()}") from None
    return tuple(conv) if p.multiple else conv[0]


def keyword_words(text: str, known: dict[str, click.Parameter]) -> str:
    """An error's text for a caller of run(): each command-line option it names as run()'s
    keyword (`--batch-size` -> `batch_size`, the flag `--overwrite` -> `overwrite=True`,
    `--param` -> `params`, `--config` -> `config_file`)."""
    import re

    words: dict[str, str] = {}
    for p in known.values():
        flag = bool(getattr(p, "is_flag", False))
        words.update({o: f"{p.name}=True" if flag else str(p.name) for o in p.opts})
        words.update({o: f"{p.name}=False" for o in getattr(p, "secondary_opts", [])})
    return re.sub(r"(?<![\w-])--[a-z][a-z0-9-]*", lambda m: words.get(m[0], m[0]), text)


def run(runtime: str = "local", quiet: bool = True, **kwargs: Any) -> Experiment:
    """Run one experiment; see the module's docstring. Raises ConfigError (one line naming the
    keyword argument) for a bad value; a run that fails still returns (its summary says why)."""
    if runtime not in ("local", "launch"):
        raise ConfigError(f"runtime={runtime!r}: choose 'local' or 'launch'")
    known = options()
    unknown = sorted(set(kwargs) - set(known))
    if unknown:
        raise ConfigError(f"run() has no option {unknown[0]!r}; it takes the options of "
                          f"`fednet local` with underscores: {', '.join(sorted(known))}")
    try:
        return _run(runtime, quiet, kwargs, known)
    except ConfigError as e:  # the checks are the command line's: they name its options
        e.args = (keyword_words(str(e), known),)
        raise


def _run(runtime: str, quiet: bool, kwargs: dict[str, Any], known: dict[str, click.Parameter]
         ) -> Experiment:
    from fednet.cli import RUN_DEFAULTS, local
    from fednet.cli.options import build_config, prepare_out
    from fednet.metrics.history import read_rows

    opts = dict(local.make_context("local", []).params)  # the defaults, as the CLI resolves them
    opts.update({k: _argument(k, v, known[k]) for k, v in kwargs.items()})
    opts["quiet"] = quiet
    clients = 10 if runtime == "local" else 100
    cfg = prepare_out(opts, build_config(opts, dict(RUN_DEFAULTS, clients=clients)))
    if runtime == "local":
        from fednet.core.inproc import run_local

        summary = run_local(cfg, quiet=quiet, resume=bool(opts.get("resume")))
    else:
        from fednet.server.main import run_zmq

        summary = run_zmq(cfg, quiet=quiet, local_clients=True, resume=bool(opts.get("resume")))
    out = Path(cfg.out)
    model: dict[str, np.ndarray] = {}
    if (out / "final_model.npz").is_file():
        with np.load(out / "final_model.npz", allow_pickle=False) as z:
            model = {k: z[k] for k in z.files}
    return Experiment(summary, read_rows(out), model, out)
