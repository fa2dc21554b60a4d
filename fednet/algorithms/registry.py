"""The algorithm registry: one Spec per algorithm, the only list of names, defaults and models.

A Spec names the algorithm's server half (a Strategy) and client half (a ClientUpdate) as
"module:Class" strings, imported on first use: the registry itself imports no torch, so the CLI
derives its choices, options and checks from it at once. The built-in algorithms register in
catalog.py; a plugin calls register(Spec(...)) the same way (fednet/plugins.py: the installed
`fednet.algorithms` entry points are loaded the first time a name is looked up or listed).
"""
from __future__ import annotations

import dataclasses
import functools
import importlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fednet import plugins
from fednet.algorithms import params as P
from fednet.errors import ConfigError

if TYPE_CHECKING:
    from fednet.algorithms.contract import ClientUpdate, Strategy
    from fednet.config import RunConfig


@dataclass(frozen=True)
class Spec:
    """One algorithm: its name, its two halves, its parameters and its defaults."""

    name: str
    summary: str                   # one line for --help and the docs
    server: str                    # "module:Class" of its Strategy (the server half)
    client: str                    # "module:Class" of its ClientUpdate (the client half)
    params: type = P.NoParams      # a frozen dataclass of param() fields
    personalized: bool = False     # clients evaluate their own models (eval auto -> clients)
    models: dict[str, str] = field(default_factory=dict)  # dataset (or "*") -> --model auto
    # its routes hand models from client to client (rings): every client needs every client's
    # link and availability; False: a client is sent only its own (a latency or availability
    # trace then no longer travels whole in every WELCOME: O(P^2) bytes for P clients)
    handoffs: bool = True
    # partition (or "*") -> dotted config keys and values that replace the global defaults when
    # the run does not set them itself (options, --config file): docs/algorithms.md §0.2
    tuned: dict[str, dict[str, Any]] = field(default_factory=dict)

    def tuned_for(self, partition: str) -> dict[str, Any]:
        """The tuned defaults for a partition ("*" first, then the partition's own)."""
        return {**self.tuned.get("*", {}), **self.tuned.get(partition, {})}

    def parse(self, raw: dict[str, Any]) -> Any:
        """The typed parameters from raw values (ConfigError naming a wrong one)."""
        return P.parse(self.params, raw, self.name)


REGISTRY: dict[str, Spec] = {}


def register(spec: Spec) -> Spec:
    """Add an algorithm (a name registered twice is an error)."""
    if spec.name in REGISTRY:
        raise ValueError(f"algorithm {spec.name!r} is registered twice")
    P.declared(spec.params)  # the declarations are checked now, not at the first run
    own = dataclasses.replace(spec, server=plugins.own_ref(spec.server),
                              client=plugins.own_ref(spec.client))  # a .py plugin's own classes
    spec = own if (own.server, own.client) != (spec.server, spec.client) else spec
    REGISTRY[spec.name] = spec
    plugins.provide("algorithm", spec.name)
    return spec


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


def build(cfg: RunConfig) -> Strategy:
    """The configured algorithm's server half."""
    spec = get(cfg.algo.name)
    return _load(spec.server)(cfg, spec.parse(dict(cfg.algo.params)))


def build_client(cfg: RunConfig) -> ClientUpdate:
    """The configured algorithm's client half (what every client process builds, and no more)."""
    spec = get(cfg.algo.name)
    return _load(spec.client)(cfg, spec.parse(dict(cfg.algo.params)))


def check_params(name: str, raw: dict[str, Any]) -> dict[str, Any]:
    """The given parameters typed and checked for algorithm `name` (ConfigError otherwise)."""
    return P.typed(get(name).params, raw, name)


from fednet.algorithms import catalog  # noqa: E402,F401  (registers the built-in algorithms)
