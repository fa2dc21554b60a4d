"""The algorithm registry: one Spec per algorithm, the only list of names, defaults and models.

A Spec names the algorithm's server half (a Strategy) and client half (a ClientUpdate) as
"module:Class" strings, imported on first use: the registry itself imports no torch, so the CLI
derives its choices, options and checks from it at once. The built-in algorithms register in
catalog.py; a plugin calls register(Spec(...)) the same way (fednet/plugins/__init__.py: the installed
`fednet.algorithms` entry points are loaded the first time a name is looked up or listed).
Loading and building the halves the Specs name is halves.py's (it knows the contract's types;
the registry knows none, so that contract may look a Spec up).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fednet import plugins
from fednet.algorithms import params as P
from fednet.algorithms.spec import REGISTRY, Spec, register  # noqa: F401  (the registry's API)
from fednet.errors import ConfigError

if TYPE_CHECKING:
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
