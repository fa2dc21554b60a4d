"""Byzantine clients and robust aggregation, declared: each attack's and each defense's typed
parameters (the param() language of config/declare.py), who the malicious clients are (drawn
from the run's seed), and the checks of a configuration. No torch, no numpy beyond the draw:
the CLI and config.validate read this before anything heavy is imported.

The rules are in docs/algorithms.md section 10; the attacks run in algorithms/attacks.py (the
math) and algorithms/attack_client.py (inside a client's executor), the defenses in
algorithms/robust.py.
"""
from __future__ import annotations

import functools
import math
import statistics
from dataclasses import dataclass
from typing import Any

from fednet import rng
from fednet.algorithms import params as P
from fednet.algorithms import seam
from fednet.algorithms.seam import (ATTACKS, DEFENSES, AttackSpec, DefenseSpec, Facts,
                                    register_attack, register_defense)
from fednet.config.declare import declared, param
from fednet.errors import ConfigError
from fednet.config import RunConfig

# ---- attacks ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SignFlipParams:
    """Sign flipping: the update sent is -flip times the client's honest update."""

    flip: float = param(4.0, "sign flipping: the update sent is -flip x the honest update", gt=0)


@dataclass(frozen=True)
class NoiseParams:
    """Gaussian noise: the update sent is drawn from N(0, sigma^2 I)."""

    sigma: float = param(1.0, "Gaussian attack: the standard deviation of the update sent", gt=0)


@dataclass(frozen=True)
class BackdoorParams:
    """Model replacement with a backdoor trigger (Bagdasaryan et al., AISTATS 2020)."""

    target: int = param(0, "backdoor: the label the trigger asks for", ge=0)
    poison: float = param(0.3, "backdoor: the share of the attacker's examples stamped with the "
                          "trigger and relabelled", gt=0, le=1)
    boost: float = param(0.0, "backdoor: the update's scale gamma (0: n / (eta a), n clients "
                         "and a attackers expected per round)", ge=0)
    trigger_size: int = param(0, "backdoor: the side of the square trigger in the image's "
                              "bottom-right corner (0: max(2, side / 8))", ge=0)


@dataclass(frozen=True)
class CollusionParams:
    """What colluding attacks know: the honest updates of the colluders (their own data)."""

    known: int = param(0, "colluding attacks: how many colluders' honest updates each attacker "
                       "computes its statistics from, its own first (0: the attackers expected "
                       "in a round, at least 2)", ge=0)


@dataclass(frozen=True)
class AlieParams(CollusionParams):
    """A Little Is Enough (Baruch et al., NeurIPS 2019): mu - z sigma, coordinate-wise."""

    z: float = param(0.0, "ALIE: the standard deviations to shift by (0: the paper's z_max from "
                     "the round's clients and attackers)", ge=0)


@dataclass(frozen=True)
class IpmParams(CollusionParams):
    """Inner-product manipulation (Xie et al., UAI 2020): -epsilon times the honest mean."""

    epsilon: float = param(0.1, "IPM: the update sent is -epsilon x the colluders' honest mean",
                           gt=0)


@dataclass(frozen=True)
class MinMaxParams(CollusionParams):
    """Min-max and min-sum (Shejwalkar and Houmansadr, NDSS 2021), AGR-agnostic."""

    deviation: str = param("unit_vec", "min-max, min-sum: the perturbation, -mu/|mu| (unit_vec), "
                           "-std or -sign(mu)", choices=("unit_vec", "std", "sign"))
    gamma_init: float = param(10.0, "min-max, min-sum: the first scale gamma tried", gt=0)


_FORGES, _COLLUDES = Facts(forges=True), Facts(forges=True, colluding=True)
for _a in (AttackSpec("none", facts=Facts()),
           AttackSpec("labelflip", facts=Facts(poisons_data=True), doc="labels y -> C - 1 - y"),
           AttackSpec("signflip", SignFlipParams, doc="-flip x the honest update"),
           AttackSpec("noise", NoiseParams, doc="an update drawn from N(0, sigma^2 I)"),
           AttackSpec("backdoor", BackdoorParams, facts=Facts(poisons_data=True, forges=True),
                      doc="a trigger's examples relabelled, the update boosted"),
           AttackSpec("alie", AlieParams, facts=_COLLUDES, doc="mu - z sigma"),
           AttackSpec("ipm", IpmParams, facts=_COLLUDES, doc="-epsilon mu"),
           AttackSpec("minmax", MinMaxParams, facts=_COLLUDES, doc="min-max (AGR-agnostic)"),
           AttackSpec("minsum", MinMaxParams, facts=_COLLUDES, doc="min-sum (AGR-agnostic)")):
    with seam.built_in():  # (no plugin provides them, whoever imports this module first)
        register_attack(_a)
BUILTIN_ATTACKS = tuple(ATTACKS)  # (their data poisoning and forgeries: attack_client.py)

# ---- defenses -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ByzantineCount:
    """The number of Byzantine results a defense assumes in a round."""

    f: int = param(-1, "robust aggregation: the Byzantine results assumed per round (-1: "
                   "ceil(share x n), the --malicious share of the round's n results, with or "
                   "without an attack)", ge=-1)


@dataclass(frozen=True)
class MultiKrumParams(ByzantineCount):
    """Multi-Krum (Blanchard et al., NeurIPS 2017)."""

    keep: int = param(0, "Multi-Krum: the m best-scored updates averaged (0: n - f)", ge=0)


@dataclass(frozen=True)
class TrimmedMeanParams(ByzantineCount):
    """Coordinate-wise trimmed mean (Yin et al., ICML 2018)."""

    trim: float = param(-1.0, "trimmed mean: beta, the share cut from each end of every "
                        "coordinate (-1: f / n)", ge=-1, lt=0.5)


@dataclass(frozen=True)
class NormBoundParams:
    """Norm bounding (Sun et al., 2019)."""

    bound: float = param(0.0, "norm bounding: M, each update scaled to at most this norm (0: "
                         "the median of the round's update norms)", ge=0)


@dataclass(frozen=True)
class CenteredClipParams:
    """Centered clipping (Karimireddy, He and Jaggi, ICML 2021); tau on the scale of the round's
    updates unless given (robust.centered_clip says why)."""

    radius: float = param(0.0, "centered clipping: tau, the clipping radius around the center "
                          "(0: the median of the round's update distances to the center, at "
                          "each iteration)", ge=0)
    iters: int = param(1, "centered clipping: L, the clipping iterations", ge=1)


def _trimmed_sensitivity(c: float, m: int, f: int, p: TrimmedMeanParams) -> float | str:
    """Replacing one of m rows of norm <= C moves each coordinate's trimmed sum by at most that
    coordinate's change (sorting is non-expansive in l1), so the mean of the m - 2k kept values
    moves by at most 2C / (m - 2k) in l2."""
    k = f if p.trim < 0 else int(p.trim * m)
    return 2.0 * c / (m - 2 * k) if m > 2 * k else f"it cuts {k} of {m} values from each end"


def _bound_sensitivity(c: float, m: int, f: int, p: NormBoundParams) -> float | str:
    """Every row scaled to norm <= min(C, M), then their mean (weight 1 each under DP)."""
    if p.bound <= 0:
        return ("its bound M is the median of the round's update norms, which one update "
                "moves (give --param bound=M)")
    return 2.0 * min(c, p.bound) / m


def bulyan_work(n: int, d: int, f: int, p: Any = None) -> dict[str, float]:
    """The server's work of algorithms/robust.bulyan on n updates of d values, f assumed
    Byzantine, in fednet/opcount.py's operations, counted as it runs: the updates stacked (n d)
    and their norms (2 n d), the Gram matrix x x^T (2 n^2 d FLOPs: sq_distances); then the
    theta = n - 2f Krum choices, each over the m rows left: their m x m distances gathered, a
    diagonal of infinities built and added (3 m^2), each row sorted (np.sort: m^2 log2 m
    compare-moves, vectorised: "stream") and its k = max(1, m - f - 2) smallest summed; then the
    theta chosen rows copied and, per coordinate (closest_mean), transposed (theta d), their
    median selected (2 (1 + ln 2) theta d compare-moves: quickselect's expected count), the
    distances to it (2 theta d), a stable argsort of them (theta d log2 theta compare-moves:
    "sort") and the beta = theta - 2f closest gathered and summed (2 beta d)."""
    if n <= 0 or d <= 0:
        return {}
    theta = max(1, n - 2 * f)
    beta = max(1, theta - 2 * f)
    select = 0.0
    for m in range(n, n - theta, -1):
        k = min(max(1, m - f - 2), m - 1)
        select += 3 * m * m + m * m * math.log2(max(m, 2)) + m * k
    return {"gemm": 2 * n * n * d,
            "stream": 3 * n * d + select + 2 * theta * d + 2 * theta * d + 2 * beta * d,
            "sort": theta * d * (math.log2(max(theta, 2)) + 2 * (1 + math.log(2)))}


_RULES = "fednet.algorithms.robust:"  # the built-in rules' math (numpy), imported when used
_CHOOSES = "it chooses rows by their distances, and one update changes which rows are chosen"
for _d in (DefenseSpec("none", "", uses_f=False, facts=Facts()),
           DefenseSpec("krum", _RULES + "rule_krum", ByzantineCount, lambda f: 2 * f + 3,
                       dp_why=_CHOOSES),
           DefenseSpec("multikrum", _RULES + "rule_multikrum", MultiKrumParams,
                       lambda f: 2 * f + 3, dp_why=_CHOOSES),
           DefenseSpec("bulyan", _RULES + "rule_bulyan", ByzantineCount, lambda f: 4 * f + 3,
                       dp_why=_CHOOSES, work=bulyan_work),
           DefenseSpec("median", _RULES + "rule_median", ByzantineCount, lambda f: 2 * f + 1,
                       dp_why="one update can move a coordinate's median from one neighbouring "
                       "value to the next, which may lie up to 2C away in every coordinate"),
           DefenseSpec("trimmed_mean", _RULES + "rule_trimmed_mean", TrimmedMeanParams,
                       lambda f: 2 * f + 1, sensitivity=_trimmed_sensitivity),
           DefenseSpec("norm_bound", _RULES + "rule_norm_bound", NormBoundParams, uses_f=False,
                       sensitivity=_bound_sensitivity),
           DefenseSpec("centered_clip", _RULES + "rule_centered_clip", CenteredClipParams,
                       uses_f=False, keeps_center=True,
                       dp_why="its center (the last aggregate) is state central DP's server does "
                       "not keep, and its default radius is the median distance, which one "
                       "update moves")):
    with seam.built_in():
        register_defense(_d)


def defense_spec(name: str) -> DefenseSpec:
    """The defense called `name` (a plugin's too), or a ConfigError naming --defense and the
    choices."""
    return seam.lookup(DEFENSES, name, "defense")


def attack_spec(name: str) -> AttackSpec:
    """The attack called `name` (a plugin's too), or a ConfigError naming --attack and the
    choices."""
    return seam.lookup(ATTACKS, name, "attack")


def assumed_f(spec: DefenseSpec, p: Any) -> int:
    """The f a defense's parameters give (-1: the --malicious share of the round); a rule that
    assumes f but declares no `f` parameter (a plugin's) takes the share's."""
    return int(getattr(p, "f", -1 if spec.uses_f else 0))


def least_results(defense: str, f: int) -> int:
    """The fewest results a round needs for the defense's assumption on f attackers (its
    spec's `least`): Krum and Multi-Krum n >= 2f + 3, Bulyan n >= 4f + 3, median and trimmed
    mean n >= 2f + 1, the others 1."""
    return int(defense_spec(defense).least(f))


# ---- who is malicious ---------------------------------------------------------------------------


def _ids(text: str, clients: int) -> list[int]:
    out: set[int] = set()
    for part in text.replace("+", ",").split(","):
        lo, dash, hi = part.strip().partition("-")
        try:
            a, b = int(lo), int(hi) if dash else int(lo)
        except ValueError:
            raise ConfigError(f"--malicious ids:{text}: expected client ids such as ids:3,17 or "
                              "ids:0-9") from None
        if not 0 <= a <= b < clients:
            raise ConfigError(f"--malicious ids:{text}: ids must lie in 0..{clients - 1}")
        out.update(range(a, b + 1))
    return sorted(out)


def parse_malicious(text: str, clients: int) -> float | list[int]:
    """A fraction in [0, 1], or the listed ids (sorted); ConfigError naming --malicious."""
    t = text.strip()
    if t.startswith("ids:"):
        return _ids(t[4:], clients)
    try:
        v = float(t)
    except ValueError:
        v = math.nan
    if not 0 <= v <= 1:
        raise ConfigError(f"--malicious {text}: give a fraction in [0, 1] (0.2) or ids:LIST "
                          "(ids:3,17 or ids:0-9)")
    return v


def malicious_ids(cfg: RunConfig) -> list[int]:
    """The malicious clients of the run, sorted: none without --attack; a fraction F draws
    max(1, round(F K)) of the K clients (0 for F = 0) from the seed's 'malicious' stream."""
    a = cfg.attack
    if a.name == "none":
        return []
    return list(_draw(a.malicious, cfg.clients, cfg.seed))


@functools.lru_cache(maxsize=16)
def _draw(text: str, clients: int, seed: int) -> tuple[int, ...]:
    got = parse_malicious(text, clients)
    if isinstance(got, list):
        return tuple(got)
    k = 0 if got == 0 else max(1, round(got * clients))
    pick = rng.generator(seed, "malicious").choice(clients, k, replace=False)
    return tuple(sorted(int(i) for i in pick))


def assumed_share(cfg: RunConfig) -> float:
    """The share of malicious clients a defense's f assumes (f = -1): the one --malicious
    declares (0.2 by default), whether or not an attack runs, so that a defense is the same
    rule in a run without attackers."""
    return len(_draw(cfg.attack.malicious, cfg.clients, cfg.seed)) / cfg.clients


def round_size(cfg: RunConfig) -> int:
    """The clients a synchronous round selects: max(floor(fraction x K), 1)."""
    return max(int(cfg.algo.fraction * cfg.clients), 1)


def byzantine_count(f: int, share: float, n: int) -> int:
    """The defense's f for a round of n results: f itself, or ceil(share x n) for f = -1."""
    return f if f >= 0 else math.ceil(round(share * n, 9))


def alie_z(n: int, m: int) -> float:
    """ALIE's z_max (Baruch et al. 2019): s = floor(n/2 + 1) - m supporters are needed, and z
    is the largest with Phi(z) < (n - s) / n."""
    s = math.floor(n / 2 + 1) - m
    p = min(max((n - s) / n, 1e-6), 1 - 1e-6)
    return statistics.NormalDist().inv_cdf(p)


# ---- parameters and checks ----------------------------------------------------------------------


def attack_params(cfg: RunConfig) -> Any:
    """The attack's typed parameters."""
    return P.parse(attack_spec(cfg.attack.name).params, dict(cfg.attack.params), cfg.attack.name)


def defense_params(cfg: RunConfig) -> Any:
    """The defense's typed parameters."""
    return P.parse(defense_spec(cfg.defense.name).params, dict(cfg.defense.params),
                   cfg.defense.name)


def names_of(cls: type) -> set[str]:
    """The parameter names a declaration holds."""
    return {i.name for i in declared(cls)}


def route_params(raw: dict[str, Any], algo_names: set[str], attack: str, defense: str
                 ) -> dict[str, dict[str, Any]]:
    """--param KEY=VALUE pairs split into the algorithm's, the attack's and the defense's tables
    by who declares KEY (ConfigError when two of them do; an undeclared key stays the
    algorithm's, whose check names what it takes)."""
    owners = {"algo": algo_names,
              "attack": names_of(ATTACKS[attack].params if attack in ATTACKS else P.NoParams),
              "defense": names_of(DEFENSES[defense].params if defense in DEFENSES
                                  else P.NoParams)}
    out: dict[str, dict[str, Any]] = {"algo": {}, "attack": {}, "defense": {}}
    for key, v in raw.items():
        who = [w for w, names in owners.items() if key in names]
        if len(who) > 1:
            raise ConfigError(f"--param {key} is a parameter of both the {who[0]} and the "
                              f"{who[1]}; set it in a --config file's [{who[0]}.params] or "
                              f"[{who[1]}.params] table")
        if not who and (owners["attack"] or owners["defense"]) and key not in algo_names:
            known = sorted(owners["algo"] | owners["attack"] | owners["defense"])
            raise ConfigError(f"--param {key} is not a parameter of the algorithm, the attack "
                              f"({attack}) or the defense ({defense}); they take: "
                              f"{', '.join(known) or 'none'}")
        out[who[0] if who else "algo"][key] = v
    return out


def problem(cfg: RunConfig, robust_algorithms: tuple[str, ...]) -> str:
    """Why the attack and defense settings do not fit the run (one line), or ''."""
    a, d = cfg.attack, cfg.defense
    try:
        attack_spec(a.name), defense_spec(d.name)
        parse_malicious(cfg.attack.malicious, cfg.clients)  # (drawn only under an attack)
        attack_params(cfg), defense_params(cfg)
    except ConfigError as e:
        return str(e)
    for what, name in (("--attack", a.name), ("--defense", d.name)):
        if name != "none" and cfg.algo.name not in robust_algorithms:
            return (f"{what} {name} needs an algorithm whose server averages models: "
                    f"{', '.join(robust_algorithms)} (not {cfg.algo.name})")
    why = seam.problems(defense_spec(d.name), attack_spec(a.name),
                        getattr(cfg.net, "secagg", "off"))
    if why:
        return why
    if a.name not in BUILTIN_ATTACKS and attack_spec(a.name).forge is None:
        return (f"--attack {a.name} registers no forgery: an attack of a plugin sends "
                "forge(delta, p, gen) in place of its update (data poisoning is built in only: "
                "labelflip, backdoor); docs/extending.md")
    if a.name == "backdoor" and cfg.data.dataset in ("synthetic-fedprox", "shakespeare",
                                                     "sent140"):
        return (f"--attack backdoor stamps an image trigger; {cfg.data.dataset} holds no images "
                "(use digits, cifar10, cifar100, svhn or femnist)")
    if a.name != "none":
        why = _attackers_problem(cfg)
        if why:
            return why
    if d.name == "none":
        return ""
    n = round_size(cfg)
    p = defense_params(cfg)
    f = byzantine_count(assumed_f(defense_spec(d.name), p), assumed_share(cfg), n)
    need = least_results(d.name, f)
    if n < need:
        return (f"--defense {d.name} assumes f = {f} Byzantine results per round and needs "
                f"n >= {need}, but a round selects {n} clients; select more clients (--clients, "
                "--fraction) or assume fewer attackers (--param f=, --malicious)")
    if not defense_spec(d.name).uses_f and a.name != "none" and assumed_share(cfg) >= 0.5:
        return (f"--defense {d.name} --malicious {a.malicious}: {d.name} has no f to check, and "
                "no rule holds against a majority of malicious clients (it bounds each update, "
                "and the majority's bounded updates still decide the mean); give a share below "
                "0.5")
    keep = getattr(p, "keep", 0)
    if keep > n - f:
        return (f"--param keep={keep}: Multi-Krum averages the m best-scored of a round's n "
                f"results, at most n - f = {n - f} here (a round selects {n} clients, f = {f}); "
                f"give keep <= {n - f}, or 0 for n - f")
    return ""


def _attackers_problem(cfg: RunConfig) -> str:
    """Why --malicious does not fit an attack (one line), or '': an attack needs at least one
    attacker and at least one honest client."""
    k, text = len(_draw(cfg.attack.malicious, cfg.clients, cfg.seed)), cfg.attack.malicious
    if k == 0:
        return (f"--attack {cfg.attack.name} --malicious {text}: no client is malicious, so no "
                "attack would run; give a share above 0 (or ids:LIST), or drop --attack")
    if k >= cfg.clients:
        return (f"--attack {cfg.attack.name} --malicious {text}: every one of the {cfg.clients} "
                "clients would be malicious, leaving no honest update to attack or defend; "
                "give a share below 1")
    known = int(getattr(attack_params(cfg), "known", 0) or 0)
    if known > k:
        return (f"--param known={known}: --attack {cfg.attack.name}'s colluders are the {k} "
                f"malicious clients (--malicious {text}); give known <= {k}, or 0 for the "
                "attackers expected in a round")
    return ""
