"""One algorithm's declaration (Spec) and the table of every registered one (REGISTRY); the
registry's lookups and builders are in registry.py, the built-in Specs in catalog.py. A loaded
`fednet.algorithms` entry point is registered here (plugins.ENTRY_HANDLERS), so that the
plugin loader needs no import of the algorithms."""
from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys
from dataclasses import dataclass, field
from typing import Any

from fednet import plugins
from fednet.algorithms import params as P
from fednet.config.declare import declared
from fednet.errors import ConfigError


BODY_KINDS = ("number", "number >= 0", "number or nan", "flag", "name", "count", "client ids",
              "names")
"""What a key of an algorithm's own task or result body may hold (core/work.py checks it; a
count is 1..1,000,000, a name up to 64 characters, a list up to 100,000 entries)."""


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
    # the keys its tasks' and its results' bodies carry beside the runtime's own (epochs, lr,
    # evaluate, ckpt; loss, accuracy, samples, ...: protocol/schema.py), each with its kind
    # (BODY_KINDS); checked before the algorithm reads them: a task's by the client
    # (core/work.check_work), a result's by the server (core/replies.accept_reply)
    task_body: dict[str, str] = field(default_factory=dict)
    result_body: dict[str, str] = field(default_factory=dict)
    # its server is FedAvg's (or a subclass that reads FedAvg.take_round's mean) and its results
    # are models: --defense replaces that mean, --attack forges those models (robust_spec.py)
    robust: bool = False
    # the differential-privacy mechanisms that compose with it (docs/algorithms.md §11): central
    # (DP-FedAvg at the server: a FedAvg-family Strategy), local, sgd (DP-SGD in its clients)
    dp: tuple[str, ...] = ()
    # its server aggregates one sample-weighted sum of its clients' models (a client's own state,
    # if any, never travels): --secagg can hide each update and hand the server only the sum
    # (algorithms/secagg.py; validate refuses --secagg for the others, before any data loads)
    secagg: bool = False
    # the prefix of its results' arrays that its server sums with every client weighing 1, not
    # by its samples (SCAFFOLD's control changes, "dc:"): under --secagg they travel in the
    # masked vector after the model's values, and the server is handed their sum
    secagg_counted: str = ""
    # its server takes each reply as it arrives, in simulated-time order, each weighted by its
    # own staleness (FedAsync, FedBuff: their Strategy's virtual_order): no cohort is known
    # before its updates arrive, which secure aggregation's key agreement needs
    arrivals: bool = False
    # its client update is local SGD that a block of clients can train as one batch
    # (--batch-clients; training/batched.py): its ClientUpdate's `local` is updates.Plain or
    # updates.Prox (FedAvgClient's, FedProxClient's). False: its clients train one at a time
    # (the run says so once)
    batched: bool = False

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
    declared(spec.params)  # the declarations are checked now, not at the first run
    bad = {k: v for k, v in {**spec.task_body, **spec.result_body}.items() if v not in BODY_KINDS}
    if bad:
        raise ValueError(f"algorithm {spec.name!r}: body kinds {bad} are not of {BODY_KINDS}")
    own = dataclasses.replace(spec, server=plugins.own_ref(spec.server),
                              client=plugins.own_ref(spec.client))  # a .py plugin's own classes
    spec = own if (own.server, own.client) != (spec.server, spec.client) else spec
    REGISTRY[spec.name] = spec
    plugins.provide("algorithm", spec.name)
    return spec


def _entry_point(obj: Any) -> None:
    """A loaded `fednet.algorithms` entry point: a Spec (registered), or a callable that
    registers its algorithms when called."""
    if isinstance(obj, Spec):
        if REGISTRY.get(obj.name) is not obj:
            register(obj)
    elif callable(obj) and not isinstance(obj, type(sys)):
        obj()


plugins.ENTRY_HANDLERS["algorithm"] = _entry_point


def _missing_class(ref: str) -> str:
    """Why a "module:Class" reference cannot be resolved now ('' when it can, or when its
    module is not imported yet: importing it here could load torch for a listing of names)."""
    module, _, attr = ref.partition(":")
    if not attr:
        return f"{ref!r} is not a \"module:Class\" reference"
    mod = sys.modules.get(module)
    if mod is None:
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        return "" if found else f"no module named {module!r}"
    obj: Any = mod
    for part in attr.split("."):
        if not hasattr(obj, part):
            where = os.path.basename(mod.__file__ or module) \
                if module.startswith("fednet_plugin_") else module  # a .py plugin: its file
            return f"{where} has no {attr!r}"
        obj = getattr(obj, part)
    return "" if isinstance(obj, type) else f"{attr!r} is not a class"


def _check_plugin_specs(ref: str, registered: list[tuple[str, str]]) -> None:
    """A --plugin's algorithms name classes that exist (checked when it loads, by `fednet
    plugins --plugin FILE` and by every run, not at the first task)."""
    for kind, name in registered:
        spec = REGISTRY.get(name) if kind == "algorithm" else None
        for half, r in (("server", spec.server), ("client", spec.client)) if spec else ():
            why = _missing_class(r)
            if why:
                shown = r.split(":", 1)[1] if r.startswith("fednet_plugin_") else r
                raise ConfigError(f"--plugin {ref}: algorithm {name!r}: its {half} class "
                                  f"{shown!r} cannot be found ({why}); fix the Spec's {half}= "
                                  "\"module:Class\"")


plugins.LOAD_CHECKS.append(_check_plugin_specs)
