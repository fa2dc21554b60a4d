"""The algorithm registry: one Spec per algorithm, the only list of names, defaults and models.

A Spec names the algorithm's server half (a Strategy) and client half (a ClientUpdate) as
"module:Class" strings, imported on first use: the registry itself imports no torch, so the CLI
derives its choices, options and checks from it at once. The built-in algorithms register in
catalog.py; a plugin calls register(Spec(...)) the same way (fednet/plugins/__init__.py: the installed
`fednet.algorithms` entry points are loaded the first time a name is looked up or listed).
"""
from __future__ import annotations

import functools
import importlib
from typing import TYPE_CHECKING, Any

from fednet import plugins
from fednet.algorithms import params as P
from fednet.algorithms.spec import REGISTRY, Spec, register  # noqa: F401  (the registry's API)
from fednet.errors import ConfigError

if TYPE_CHECKING:
    from fednet.algorithms.contract import ClientUpdate, Strategy
    from fednet.config import RunConfig


def with_plugins() -> dict[str, Spec]:
    """REGISTRY, once the installed algorithm plugins (entry points) are loaded into it."""
    plugins.load_algorithms()
    return REGISTRY


def _find(name: str) -> Spec | None:
    return REGISTRY.get(name) or with_plugins().get(name)


def names() -> tuple[str, ...]:
    """Every registered algorithm (built-in, then plugins), in registration order."""
    return tuple(with_plugins())


def available() -> list[str]:
    """The names this build can run."""
    return list(with_plugins())


def get(name: str) -> Spec:
    """The Spec of `name`, or a ConfigError naming --algo and the choices."""
    spec = _find(name)
    if spec is None:
        raise ConfigError(f"--algo '{name}' is not available in this build; "
                          f"available: {', '.join(available())}")
    return spec


def personalized(name: str) -> bool:
    """True for algorithms whose clients keep and evaluate their own models."""
    spec = _find(name)
    return bool(spec and spec.personalized)


def model_name(cfg: RunConfig) -> str:
    """The architecture to build: --model, or the algorithm's default for the dataset ("auto")."""
    spec = _find(cfg.algo.name)
    if cfg.train.model != "auto" or spec is None:
        return cfg.train.model
    return spec.models.get(cfg.data.dataset, spec.models.get("*", "auto"))


@functools.cache
def _load(ref: str) -> Any:
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)


def client_class(name: str) -> type[ClientUpdate]:
    """The client half's class (its State and keeps_model), without building it."""
    return _load(get(name).client)


def preload() -> None:
    """Import every registered algorithm's two halves (the zygote does, before it forks)."""
    for spec in with_plugins().values():
        _load(spec.server), _load(spec.client)


def build_bare(cfg: RunConfig) -> Strategy:
    """The configured algorithm's own server half, with differential privacy
    (algorithms/private.py); algorithms.build wraps it for --secagg."""
    spec = get(cfg.algo.name)
    cls = _load(spec.server)
    if cfg.dp.mode != "none" or cfg.dp.sgd_noise > 0:  # (by name, as the halves: no cycle)
        cls = _load("fednet.algorithms.private:wrap_server")(cls)
    return cls(cfg, spec.parse(dict(cfg.algo.params)))


def build_client_bare(cfg: RunConfig) -> ClientUpdate:
    """The configured algorithm's own client half (what every client process builds, and no
    more; with --dp local: algorithms/dp_client.py); algorithms.build_client wraps it for
    --secagg."""
    spec = get(cfg.algo.name)
    cls = _load(spec.client)
    if cfg.dp.mode == "local":
        cls = _load("fednet.algorithms.dp_client:wrap_client")(cls)
    return cls(cfg, spec.parse(dict(cfg.algo.params)))


def robust_names() -> tuple[str, ...]:
    """The algorithms that --attack and --defense apply to (Spec.robust)."""
    return tuple(n for n, s in with_plugins().items() if s.robust)


def robust_problem(cfg: RunConfig) -> str:
    """Why the run's --attack and --defense settings do not fit it (one line), or ''."""
    from fednet.algorithms import robust_spec

    return robust_spec.problem(cfg, robust_names())


def check_params(name: str, raw: dict[str, Any]) -> dict[str, Any]:
    """The given parameters typed and checked for algorithm `name` (ConfigError otherwise)."""
    return P.typed(get(name).params, raw, name)


from fednet.algorithms import catalog  # noqa: E402,F401  (registers the built-in algorithms)
