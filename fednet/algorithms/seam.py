"""The update's path, declared (issue 58): what may happen to a client's update after its local
training (an attack's forgery, clipping, noise, a codec, masking) and how the server makes one
update of a round's (the mean, a robust rule, a secure sum, central noise, then the server
optimizer). Each piece that can be chosen by name (--defense, --attack) is a small spec that
declares what it needs and gives (Facts), registered in one table; the rules between pieces are
derived from those facts here (`problems`), not written pair by pair.

A plugin adds a defense, an attack, a DP mechanism or a codec through `fednet.api`
(register_defense, register_attack, register_dp, register_codec; a codec's common grid under
secure aggregation: register_field_grid), exactly as the built-in ones
are (algorithms/robust_spec.py, algorithms/dp_spec.py and compress/codecs.py, which also look
them up by name): docs/extending.md shows a geometric-median defense, a central mechanism of its
own noise and accounting, and a bfloat16 codec. No torch and
no numpy here: the CLI reads these tables before anything heavy is imported (a rule, a forgery,
a noise or an accounting event named as "module:function" is imported when first used).
"""
from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from fednet import plugins, privacy
from fednet.algorithms import params as P
from fednet.errors import ConfigError

if TYPE_CHECKING:
    from fednet.compress.codecs import CodecSpec
    from fednet.compress.field import FieldGrid


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
    on_client: bool = False  # it runs in the client half, after local training
    needs_secagg: bool = False  # it is private only inside secure aggregation's sum


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
    # under central DP (clip each update to C, the rule, then noise): sensitivity(C, m, f, p),
    # how far replacing one of m updates of norm <= C moves the rule's output (l2), or a str:
    # why these parameters give no such bound; None: the rule has none (refused with dp_why)
    sensitivity: Callable[..., float | str] | None = None
    dp_why: str = ""
    # the server's work on the simulated clock: work(n, d, f, p) -> {"gemm": FLOPs of matrix
    # products, "stream": values read or written} for n updates of d values, f assumed
    # Byzantine (network/server_cost.py's units, at --server-profile's rates); None: the
    # built-in rules' own counts (server_cost.defense_ops), a plugin's charged as the mean's
    work: Callable[..., dict[str, float]] | None = None

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


Noise = Callable[..., Any]
"""A central mechanism's noise: noise(shapes, scale, gen) -> {name: float64 array}, shapes the
model's floating arrays' {name: shape} (draw them in sorted name order), scale the noise
multiplier times the clip norm, gen the round's numpy Generator."""
Event = Callable[..., Any]
"""A mechanism's accounting: event(z, q) -> the dp-accounting DpEvent of one round at noise
multiplier z when each user takes part with probability q (Poisson sampling)."""


@dataclass(frozen=True)
class DPSpec:
    """A user-level DP mechanism (--dp NAME): where its noise is added (`kind`: central, on the
    server's sum of the clipped updates; local, on each client's update; distributed, the
    clients' shares inside secure aggregation's sum) and what it declares to the accountant.
    A plugin's mechanism is central: its `noise` replaces the Gaussian on the clipped sum, its
    `event` is the round's dp-accounting event (Poisson sampling at rate q), `norm` the norm each
    update is clipped in (its sensitivity's: "l2" or "l1")."""

    name: str
    kind: str = "central"
    noise: Noise | str | None = None  # None: the Gaussian of DP-FedAvg (built in)
    event: Event | str | None = None  # None: the built-in kind's event (privacy/plan.py)
    norm: str = "l2"
    samplings: tuple[str, ...] = ("poisson", "fixed")  # the --dp-sampling it accounts for
    accountants: tuple[str, ...] = ("rdp", "pld")  # the --dp-accountant that take its event
    facts: Facts = Facts(spends_privacy=True, needs_each=True, summable=False)
    guarantee: str = ""  # the guarantee in words (summary.json's dp.guarantee)
    doc: str = ""

    def noised(self, *args: object) -> Any:
        assert self.noise is not None, f"--dp {self.name} adds the built-in Gaussian"
        return _resolve(self.noise)(*args)

    def dp_event(self, *args: object) -> Any:
        assert self.event is not None, f"--dp {self.name} accounts with the built-in events"
        return _resolve(self.event)(*args)


Piece = Any  # DefenseSpec, AttackSpec or DPSpec (a TypeVar would tie a table to its spec's type)
DEFENSES: dict[str, DefenseSpec] = {}
ATTACKS: dict[str, AttackSpec] = {}
MECHANISMS: dict[str, DPSpec] = {}


def register_defense(spec: DefenseSpec) -> DefenseSpec:
    """Add a defense (a plugin's too); a name taken by another is a ConfigError."""
    return _register(DEFENSES, spec, "defense")


def register_attack(spec: AttackSpec) -> AttackSpec:
    """Add an attack (a plugin's too); a name taken by another is a ConfigError."""
    return _register(ATTACKS, spec, "attack")


def register_dp(spec: DPSpec) -> DPSpec:
    """Add a DP mechanism (a plugin's too); a name taken by another is a ConfigError."""
    if spec.kind != "central" and spec.noise is not None:
        raise ConfigError(f"--dp {spec.name}: a mechanism of a plugin adds its noise at the "
                          "server (kind central); local and distributed noise are built in")
    if spec.norm not in ("l2", "l1"):
        raise ConfigError(f"--dp {spec.name}: its norm is l2 or l1 (got {spec.norm!r})")
    _register(MECHANISMS, spec, "dp")
    privacy.KINDS[spec.name] = spec.kind  # (the planning reads the kind, the accountant the event)
    if spec.event is not None:
        privacy.EVENTS[spec.name] = spec.dp_event
    return spec


def register_codec(spec: CodecSpec) -> CodecSpec:
    """Add a codec (compress/codecs.CodecSpec; a plugin's too): its facts go into the tables
    --compress and the composition rules read (codecs.register_codec); a name taken by another
    is a ConfigError."""
    from fednet.compress.codecs import register_codec as add  # (numpy: imported when used)

    try:
        got = add(spec)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    plugins.provide("codec", spec.name)
    return got


def register_field_grid(grid: FieldGrid) -> FieldGrid:
    """Declare that a codec's output sums in secure aggregation's field on a grid common to
    every client of a round (compress/field.FieldGrid: its steps a side of zero for the codec's
    ARG; a plugin's codec too): --compress NAME then composes with --secagg. A codec given two
    different grids is a ConfigError."""
    from fednet.compress.field import register_field_grid as add

    try:
        return add(grid)
    except ValueError as e:
        raise ConfigError(str(e)) from None


_BUILT_IN: list[bool] = []  # set while fednet's own pieces register (built_in)


@contextlib.contextmanager
def built_in() -> Iterator[None]:
    """Register fednet's own pieces: no plugin provides them, even when a plugin's import of
    fednet.api is what first imports their module."""
    _BUILT_IN.append(True)
    try:
        yield
    finally:
        _BUILT_IN.pop()


def _register(table: dict[str, Piece], spec: Piece, kind: str) -> Piece:
    old = table.get(spec.name)
    if old is not None and old != spec:
        raise ConfigError(f"--{kind} {spec.name} is registered twice (a plugin's name must be "
                          "new)")
    table[spec.name] = spec
    if not _BUILT_IN:
        plugins.provide(kind, spec.name)  # (the plugin being loaded, if any, provides it)
    return spec


_WHAT = {"dp": "DP mechanism"}


def lookup(table: dict[str, Piece], name: str, kind: str) -> Piece:
    """The piece called `name` in `table`, or a ConfigError naming --KIND and the choices."""
    if name not in table:
        what = _WHAT.get(kind, kind)
        a = "an" if what[0] in "aeiou" else "a"
        raise ConfigError(f"--{kind} {name!r} is not {a} {what}; choose one of "
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


def dp_secagg_problem(m: DPSpec, secagg: str) -> str:
    """Why the DP mechanism does not go with --secagg SECAGG (one line), or '', from its facts:
    under secure aggregation one that reads each update (the server's clipping, a per-client
    account) cannot run, and one that is private only inside the secure sum needs it."""
    if m.name == "none":
        return ""
    if secagg != "off" and (m.facts.needs_each or not m.facts.summable):
        return (f"--dp {m.name}'s clipping or accounting reads each client's update, which "
                "secure aggregation hides; use --dp distributed (each client's share of the "
                "noise in the sum it unmasks)")
    if secagg == "off" and m.facts.needs_secagg:
        return (f"--dp {m.name} adds each client's share of the noise under secure aggregation, "
                "which unmasks only the noisy sum; add --secagg plus (or full), or use --dp "
                "central")
    return ""


def codec_secagg_problem(c: CodecSpec, grid: FieldGrid | None, text: str, secagg: str,
                         dp_kind: str = "", gridded: str = "int8, qsgd:S") -> str:
    """Why the codec of --compress TEXT does not go with --secagg SECAGG (one line), or '', from
    its facts: under secure aggregation the server unmasks only a sum, so the codec's output
    must sum in the field, value by value, on one grid for every client of the round (its
    FieldGrid, compress/field.py; CodecSpec.why says why a codec's own output does not); a
    DP mechanism that rounds each value onto its own grid (`dp_kind` distributed) leaves no
    room for another. `gridded`: the codecs that declare a grid, as the refusal names them."""
    if secagg == "off" or c.name == "none":
        return ""
    if dp_kind == "distributed":  # (first: a gridded codec, the advice below, is refused too)
        return (f"--compress {text}: --dp distributed rounds each value onto its own grid (its "
                "noise's), so no codec's can be applied as well; drop --compress")
    if grid is None:
        why = c.why if not c.summable else "it declares no common grid (register_field_grid)"
        return (f"--compress {text}: {why}, and secure aggregation unmasks only their sum; use "
                f"a codec with a common grid ({gridded}), or drop --compress")
    return ""


class DPSettings(Protocol):
    """What the rules read of the run's DP settings (config/privacy.DPConfig)."""

    @property
    def sampling(self) -> str: ...
    @property
    def adaptive(self) -> bool: ...


def dp_problems(m: DPSpec, d: DefenseSpec, a: AttackSpec, secagg: str,
                dp: DPSettings | None = None, p: object = None) -> str:
    """Why the chosen DP mechanism does not go with the rest of the path (one line), or '', from
    the facts: secure aggregation's (dp_secagg_problem); an attack before a client's own noise
    is not defined; a robust rule before central noise needs a sensitivity bound (its
    DefenseSpec's, for the parameters p), a fixed cohort and a fixed clip norm (dp: the run's
    DP settings)."""
    why = dp_secagg_problem(m, secagg)
    if why or m.name == "none":
        return why
    if a.name != "none" and m.facts.on_client:
        return (f"--attack does not go with --dp {m.name}: whether a malicious client's forged "
                "update gets its own clipping and noise is not defined here; use --dp central "
                "(the server clips and noises every update)")
    return "" if d.name == "none" else _rule_problem(m, d, dp, p)


def _rule_problem(m: DPSpec, d: DefenseSpec, dp: DPSettings | None, p: object) -> str:
    """Why a robust rule cannot come between central DP's clipping and its noise (one line), or
    '': the rule must bound how far one user's update moves its output (its sensitivity, which
    the noise is calibrated to), over a cohort of fixed size m (a replaced user: --dp-sampling
    fixed), with a fixed clip norm."""
    why = d.dp_why or "it declares no bound on how far one update moves its output"
    got = d.sensitivity(1.0, 10, 0, p) if d.sensitivity is not None and p is not None else why
    if d.sensitivity is None or isinstance(got, str):
        return (f"--defense {d.name} does not go with --dp {m.name}: {got}, so no noise can be "
                "calibrated to it; use --defense trimmed_mean or norm_bound (--param bound=M), "
                "or drop one")
    if m.kind != "central" or m.noise is not None:
        return (f"--defense {d.name} does not go with --dp {m.name}: a robust rule runs between "
                "the server's clipping and its Gaussian noise (--dp central)")
    if dp is not None and (dp.sampling != "fixed" or dp.adaptive):
        return (f"--defense {d.name} with --dp {m.name}: the rule's sensitivity is stated for a "
                "fixed cohort of m users with a fixed clip norm; add --dp-sampling fixed (and "
                "drop --dp-adaptive)")
    return ""
