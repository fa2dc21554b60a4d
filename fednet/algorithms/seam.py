"""The update's path, declared (issue 58): what may happen to a client's update after its local
training (an attack's forgery, clipping, noise, a codec, masking) and how the server makes one
update of a round's (the mean, a robust rule, a secure sum, central noise, then the server
optimizer). Each piece that can be chosen by name (--defense, --attack) is a small spec that
declares what it needs and gives (Facts), registered in one table; the rules between pieces are
derived from those facts here (`problems`), not written pair by pair.

A plugin adds a defense or an attack through `fednet.api` (register_defense, register_attack),
exactly as the built-in ones are (algorithms/robust_spec.py, which also looks them up by
name): docs/extending.md shows a geometric-median defense. No torch and no numpy here: the CLI
reads this table before anything heavy is imported (a rule or a forgery named as
"module:function" is imported when a round first uses it). What is not a registered piece yet:
the DP mechanisms and the codecs (--dp, --compress) are still chosen by name in their modules.
"""
from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fednet import plugins
from fednet.algorithms import params as P
from fednet.errors import ConfigError


@dataclass(frozen=True)
class Facts:
    """What a piece of the update's path needs and gives: the composition rules read these."""

    needs_each: bool = False  # it reads each client's update, not only their sum
    summable: bool = True  # its output still sums in secure aggregation's field
    changes_weights: bool = False  # it changes the updates' weights (not only their values)
    spends_privacy: bool = False  # it spends privacy budget (a DP mechanism)
    needs_stage: bool = False  # it needs a protocol stage of its own
    needs_model: bool = False  # it needs the clients' trained models, not only their updates
    poisons_data: bool = False  # (an attack) the attacker trains on data it changed
    forges: bool = False  # (an attack) the attacker sends a value other than its trained update
    colluding: bool = False  # (an attack) it needs the colluders' honest updates


Rule = Callable[..., Any]
"""A defense's rule: rule(x, w, f, p, center) -> (update, chosen rows, row metrics), x the
round's updates (n x d float64, rows in client-id order), w their weights, f the Byzantine
results assumed, p the typed parameters, center the last aggregate update (or None)."""


@dataclass(frozen=True)
class DefenseSpec:
    """A robust aggregation rule, in place of the FedAvg family's mean (--defense NAME)."""

    name: str
    rule: Rule | str  # a callable, or "module:function" imported on first use
    params: type = P.NoParams  # a frozen dataclass of param() fields (--param KEY=VALUE)
    least: Callable[[int], int] = field(default=lambda f: 1)  # the fewest results for f
    uses_f: bool = True  # it assumes f Byzantine results (its params have f)
    keeps_center: bool = False  # its state keeps the last aggregate update (centered clipping)
    facts: Facts = Facts(needs_each=True, summable=False)
    doc: str = ""

    def run(self, *args: object) -> tuple[object, list[int], dict[str, float]]:
        """The rule on (x, w, f, p, center): (update, chosen rows, row metrics)."""
        return _resolve(self.rule)(*args)  # (a plugin's callable)


@dataclass(frozen=True)
class AttackSpec:
    """What the malicious clients do (--attack NAME): train on poisoned data, send a forged
    update, or both. `forge(delta, p, gen) -> malicious delta` for an attack of a plugin
    (numpy float64 vectors; gen: a numpy Generator seeded from (seed, round, client)); the
    built-in ones run in algorithms/attack_client.py."""

    name: str
    params: type = P.NoParams
    forge: Rule | str | None = None
    facts: Facts = Facts(forges=True)
    doc: str = ""

    def forged(self, *args: object) -> object:
        assert self.forge is not None, f"--attack {self.name} has no forgery"
        return _resolve(self.forge)(*args)


Piece = Any  # DefenseSpec or AttackSpec (a TypeVar would tie the table to its spec's type)
DEFENSES: dict[str, DefenseSpec] = {}
ATTACKS: dict[str, AttackSpec] = {}


def register_defense(spec: DefenseSpec) -> DefenseSpec:
    """Add a defense (a plugin's too); a name taken by another is a ConfigError."""
    return _register(DEFENSES, spec, "defense")


def register_attack(spec: AttackSpec) -> AttackSpec:
    """Add an attack (a plugin's too); a name taken by another is a ConfigError."""
    return _register(ATTACKS, spec, "attack")


def _register(table: dict[str, Piece], spec: Piece, kind: str) -> Piece:
    old = table.get(spec.name)
    if old is not None and old != spec:
        raise ConfigError(f"--{kind} {spec.name} is registered twice (a plugin's name must be "
                          "new)")
    table[spec.name] = spec
    plugins.provide(kind, spec.name)  # (the plugin being loaded, if any, provides it)
    return spec


def lookup(table: dict[str, Piece], name: str, kind: str) -> Piece:
    """The piece called `name` in `table`, or a ConfigError naming --KIND and the choices."""
    if name not in table:
        a = "an" if kind[0] in "aeiou" else "a"
        raise ConfigError(f"--{kind} {name!r} is not {a} {kind}; choose one of "
                          f"{', '.join(table)} (or register one: docs/extending.md)")
    return table[name]


def _resolve(ref: Rule | str) -> Rule:
    if callable(ref):
        return ref
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)  # (a "module:function" ref)


# ---- the composition rules, from the facts -----------------------------------------------------


def problems(d: DefenseSpec, a: AttackSpec, secagg: str) -> str:
    """Why the chosen defense and attack do not go with the rest of the path (one line), or ''.
    Under secure aggregation the server holds only the masked sum: a rule that reads each
    update cannot run, and an attacker's output must still sum in the field (a forged float
    update is made after the client half, which under --secagg already sent the masked one)."""
    defense_name, attack_name = d.name, a.name
    if secagg == "off":
        return ""
    if defense_name != "none" and (d.facts.needs_each or not d.facts.summable):
        return (f"--defense {defense_name} does not go with --secagg {secagg}: it reads each "
                "client's update, and secure aggregation shows the server only their masked sum; "
                "drop one")
    if attack_name != "none" and (a.facts.forges or not a.facts.summable):
        return (f"--attack {attack_name} does not go with --secagg {secagg}: it forges the "
                "update after local training, and under secure aggregation the client half has "
                "then already sent the masked one; drop one")
    return ""
