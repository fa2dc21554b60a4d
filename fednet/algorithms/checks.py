"""The checks of a whole configuration: every declared range (config/declare.py), the
algorithm's name and parameters (the registry), then the rules across settings, each written out
here with the options it names; and how a run is evaluated (eval_mode). Above config in the
package graph: config itself knows no algorithm."""
from __future__ import annotations

from typing import Any

from fednet.algorithms import registry
from fednet.config.declare import check_range
from fednet.config.settings import LATENCY_PRESETS, RunConfig, TrainConfig, declarations
from fednet.errors import ConfigError


def eval_mode(cfg: RunConfig) -> str:
    """'clients' (personalized: every client tests its own model on its own split) or 'global'."""
    if cfg.algo.eval != "auto":
        return cfg.algo.eval
    personal = (cfg.data.permute or cfg.data.partition == "domain"
                or registry.personalized(cfg.algo.name))
    return "clients" if personal else "global"


def algorithms(personal: bool = False) -> tuple[str, ...]:
    """The registry's algorithm names (personal: the personalized ones)."""
    return tuple(n for n in registry.names() if not personal or registry.personalized(n))


def _need(ok: bool, msg: str) -> None:
    if not ok:
        raise ConfigError(msg)


def _value(cfg: RunConfig, key: str) -> Any:
    node: Any = cfg
    for part in key.split("."):
        node = getattr(node, part)
    return node


def check_ranges(cfg: RunConfig) -> None:
    """Every run setting within its declared range or choices (a ConfigError names the option,
    or the TOML key of a setting without one)."""
    for info in declarations():
        v = _value(cfg, info.key)
        if not isinstance(v, str) or info.type is str:  # (server_bandwidth: a rate's text)
            check_range(info, v)


def optimizer_problem(t: TrainConfig) -> str:
    """Why the [train] optimizer settings do not fit together (one line naming the option)."""
    if t.nesterov and (t.optimizer != "sgd" or t.momentum <= 0):
        return "--nesterov needs --optimizer sgd and a --momentum above 0"
    if t.optimizer == "sgd" and (t.beta1, t.beta2, t.eps) != (0.9, 0.999, 1e-8):
        return "--betas and --optimizer-eps are Adam's; add --optimizer adam (or adamw)"
    if t.optimizer != "sgd" and t.momentum:
        return f"--momentum is SGD's; {t.optimizer} has --betas B1,B2 instead: drop --momentum"
    return ""


def validate(cfg: RunConfig) -> RunConfig:
    """Check values that do not need the dataset; raise ConfigError naming the option."""
    check_ranges(cfg)
    registry.check_params(cfg.algo.name, dict(cfg.algo.params))  # the name, then each --param
    _data_rules(cfg)
    _need(not (why := optimizer_problem(cfg.train)), why)
    cfg.net.codecs()  # each codec's error names its option
    _need(cfg.net.clients_per_process <= 1 or not cfg.latency.real,
          "--clients-per-process above 1 does not go with --real-time: the clients of one process "
          "would wait out each other's simulated delays; use one process per client")
    _latency_rules(cfg)
    _need(not (why := registry.robust_problem(cfg)), why)  # --attack, --malicious, --defense
    return cfg


def _data_rules(cfg: RunConfig) -> None:
    d = cfg.data
    _need(d.dataset == "synthetic-fedprox" or (d.synthetic_alpha, d.synthetic_beta) == (1, 1),
          "--synthetic-alpha and --synthetic-beta are settings of --dataset synthetic-fedprox")
    _need(d.dataset != "synthetic-fedprox" or cfg.algo.name != "centralized", "--algo centralized "
          "needs a pooled training set, and synthetic-fedprox's clients generate theirs apart")


def _latency_rules(cfg: RunConfig) -> None:
    lat = cfg.latency
    _need(bool(lat.file) or lat.preset in LATENCY_PRESETS,
          f"--latency '{lat.preset}' is neither a preset ({', '.join(LATENCY_PRESETS)}) nor a file")
    _need(not lat.shaped or (lat.real and lat.time_scale == 1),
          "--shaped-links says the network itself runs the transfers at the profiles' rates, which "
          "only --real-time can use (at --time-scale 1); add --real-time, or drop --shaped-links")
    _need(lat.over_select == 1 or cfg.algo.name != "fedseq_inter",
          "--over-select does not apply to fedseq_inter (its slots run on without waiting for "
          "the others); use --deadline, or --algo fedseq")
