"""A run's privacy plan: its DP settings (the `dp` section of the run configuration, read as
plain attributes: this leaf imports no config) turned into the accountant's events, and the noise
multiplier calibrated to a target epsilon before the run (docs/algorithms.md §11).

The noise multiplier z of `--dp-noise` is the mechanism's: the Gaussian noise added to the sum
of the clipped updates has standard deviation z*C (central), and each client's own noise z*C
(local). The accountant's multiplier is the noise over the l2-sensitivity of what it is added to:

    central, Poisson sampling (add or remove one user)     sensitivity C     -> z
    central, fixed-size sampling (replace one user)        sensitivity 2C    -> z/2
    local, one release of a client's update (any data)     sensitivity 2C    -> z/2
    distributed, one round's unmasked sum (one user's update replaced by zero): each client adds
        discrete Gaussian noise of multiplier z over sqrt(t) (t: the fewest clients a round
        unmasks), a rho-zCDP event per round (privacy/distributed.py), against the server;
        against whoever sees only the released models (--dp-against release), the same round
        with its cohort of m drawn without replacement from N (replace one user: sensitivity
        2 delta2), amplified by that sampling (ddg_release_key)

With adaptive clipping z is the total multiplier of the two Gaussian releases of a round (the
noised clipped sum and the noised count of unclipped updates, Andrew et al. 2021, §3.1): the
update's own noise is z_u = (z^-2 - (2 sigma_b)^-2)^-1/2 > z, so that the pair is exactly one
Gaussian mechanism with multiplier z (sigma_b: the count's noise, in clients).

Each epsilon holds for one neighbouring relation (relation_words): Poisson sampling's and local
DP's are add-or-remove-one, fixed-size sampling's replace-one, which for the same noise gives
about twice the epsilon; the two are not comparable side by side. What a run should hear before
it starts (a delta not below 1/N, a noise that swamps the updates, an epsilon of 0) is remarks(),
and why a DP run's results can become NaN is noise_cause().
"""
from __future__ import annotations

import functools
import math
from typing import Any

from fednet.errors import ConfigError
from fednet.privacy import EVENTS, kind
from fednet.privacy.accountant import (
    SAMPLED_DDG, Z_MIN, Accountant, Key, NoCalibration, calibrate, calibrate_rdp)
from fednet.privacy.distributed import D_PLAN

MODES = ("none", "central", "local")
SAMPLINGS = ("poisson", "fixed")
DEFAULT_DELTA = 1e-5
"""The largest default delta (the customary value of Abadi et al. 2016 and TensorFlow Privacy)."""
DP_CAUSE = "the DP noise is the likely cause"
"""Part of the reason of a DP run's result refused for NaN/inf (core/replies.py; core/verdict.py
reads it)."""
SWAMPED = 10.0
"""remarks(): the noise on a round's mean update above this many times the clip norm swamps it."""


Z_GIVEN_MAX = 1e8
"""The largest --dp-noise (--dp-sgd-noise) taken: epsilon is 0 from about 1e6 (delta 1e-5), and
dp-accounting's fixed-size RDP fails from 1e9 (a calibration may go above, up to Z_MAX, where its
accountant can)."""
FLOAT32_MAX = 3.4028234663852886e38  # the models' values: a larger noise is inf at once


def default_delta(population: int) -> float:
    """min(1e-5, 1/(10 N)): delta must be well below 1/N, since (epsilon, delta)-DP allows a
    mechanism that publishes each of the N users' data outright with probability delta, delta N
    of them in expectation (Dwork and Roth, "The Algorithmic Foundations of Differential
    Privacy", 2014, §2.3: delta "less than the inverse of any polynomial in the size of the
    database"). 1/(10 N) keeps that expectation at most 0.1 user; 1e-5 is the customary cap
    (Abadi et al. 2016's delta for MNIST's 60,000 examples; TensorFlow Privacy's tutorials)."""
    return min(DEFAULT_DELTA, 1.0 / (10 * max(int(population), 1)))


def delta(cfg: Any) -> float:
    """The run's delta: --dp-delta, or default_delta(--clients)."""
    return float(cfg.dp.delta) if cfg.dp.delta > 0 else default_delta(cfg.clients)


def relation_words(cfg: Any) -> str:
    """The neighbouring relation the user-level epsilon holds for."""
    k = kind(cfg.dp.mode)
    if k == "distributed":
        return ("replace one user (the population public, each cohort drawn without replacement)"
                if cfg.dp.against == "release" else "one user's update replaced by zero")
    if k == "central" and cfg.dp.sampling == "fixed":
        return "replace one user"
    if k == "local":
        return "any change of one user's data"
    return "add or remove one user"


ADVERSARY_RELATIONS = {
    "release": "whoever sees only the released models; neighbours: replace one user; "
               "amplified by sampling each cohort",
    "server": "the server, which knows who took part; neighbours: one user's update replaced "
              "by zero; not amplified",
}
"""--dp distributed: whom each of summary.json's dp.epsilon_by_adversary holds against, and for
which neighbouring relation (one line each: `fednet report` shows them)."""
RELATIONS_DIFFER = (
    "different neighbouring relations, not comparable: replacing a user moves the sum up to 2x "
    "as far as zeroing one's update, which large cohorts' sampling does not offset")
"""Why --dp distributed's epsilon against the released models can exceed the server's (the
reader's trap: it reads as a bug; docs/usage.md, docs/algorithms.md 11.9)."""


def adversary_relations(epsilons: dict[str, float]) -> dict[str, Any]:
    """summary.json's words beside dp.epsilon_by_adversary: relation_by_adversary (whom each
    holds against and its neighbouring relation) and relations_note (RELATIONS_DIFFER)."""
    return {"relation_by_adversary": {who: ADVERSARY_RELATIONS[who] for who in epsilons},
            "relations_note": RELATIONS_DIFFER}


def cohort_size(fraction: float, population: int) -> int:
    """Fixed-size sampling's m (as Strategy.select draws it): max(floor(fraction * N), 1)."""
    return max(int(fraction * population), 1)


def expected_cohort(cfg: Any) -> float:
    """The denominator of the noised mean: q*N (Poisson, the expected cohort), or m (fixed)."""
    n, q = cfg.clients, cfg.algo.fraction
    return q * n if cfg.dp.sampling == "poisson" else float(cohort_size(q, n))


def count_noise(cfg: Any) -> float:
    """The standard deviation of the noise on the count of unclipped updates (adaptive
    clipping): --dp-count-noise, or the expected cohort / 20 (TensorFlow Federated's default)."""
    return float(cfg.dp.count_noise) if cfg.dp.count_noise > 0 else expected_cohort(cfg) / 20.0


def update_noise(z: float, count_std: float) -> float:
    """The multiplier of the update's own noise when a noised count shares the total z."""
    if z >= 2 * count_std:
        raise ConfigError(f"--dp-adaptive: the noise multiplier {z:g} needs a count noise above "
                          f"{z / 2:g} (--dp-count-noise is {count_std:g}); raise "
                          "--dp-count-noise or lower the noise")
    return (z ** -2 - (2 * count_std) ** -2) ** -0.5


def ddg_threshold(cfg: Any) -> int:
    """--dp distributed: the fewest clients a round unmasks, over which each client's noise is
    scaled: floor(F m) + 1 of the planned cohort m, at least 2 and at most m, F = --dp-survivors
    or else secure aggregation's --secagg-threshold; a round that unmasks fewer fails
    (algorithms/secagg.py)."""
    n = cohort_size(cfg.algo.fraction, cfg.clients)
    f = cfg.dp.survivors or cfg.net.secagg_threshold
    return max(2, min(n, int(math.floor(f * n)) + 1))


def ddg_key(z: float, t: int, k: int, d: int) -> Key:
    """One round of distributed DP: k clients' noises of multiplier z over t, d values each."""
    return ("ddg", float(z), int(t), int(k), int(d))


def ddg_release_key(population: int, m: int, key: Key) -> Key:
    """The round `key` (ddg_key's) against whoever sees only the released models: its cohort of
    m drawn without replacement from `population` (accountant's "ddg_wor")."""
    _, z, t, k, d = key
    return (SAMPLED_DDG, int(population), int(m), float(z), int(t), int(k), int(d))


def ddg_histories(cfg: Any, history: list[tuple[Key, int]]) -> dict[str, list[tuple[Key, int]]]:
    """A distributed-DP history (ddg keys) against each adversary: server (as recorded) and
    release (each round amplified by the sampling of its cohort, as Strategy.select draws it:
    cohort_size of --clients)."""
    m = cohort_size(cfg.algo.fraction, cfg.clients)
    return {"server": history,
            "release": [(ddg_release_key(cfg.clients, m, k), c) for k, c in history]}


def central_key(sampling: str, z: float, q: float, population: int, m: int) -> Key:
    """One central round's event: Poisson(q, z) or fixed-size (N, m, z/2)."""
    if sampling == "poisson":
        return ("poisson", float(q), float(z))
    return ("fixed", int(population), int(m), float(z) / 2)


def local_key(z: float) -> Key:
    """One local release of a client's update: a Gaussian mechanism of multiplier z/2."""
    return ("gaussian", float(z) / 2)


def sgd_steps(examples: int, batch_size: int) -> tuple[float, int]:
    """DP-SGD's Poisson rate and steps per epoch over `examples` (as Opacus's DPDataLoader):
    q = 1/ceil(n/B), ceil(n/B) steps, an expected batch of q*n."""
    steps = max(1, math.ceil(examples / batch_size))
    return 1.0 / steps, steps


def sgd_key(z: float, q: float) -> Key:
    """One DP-SGD step: Poisson sampling of the client's examples at rate q, multiplier z."""
    return ("poisson", float(q), float(z))


def piece_key(name: str, z: float, q: float) -> Key:
    """One round of a plugin's mechanism `name` at multiplier z, Poisson sampling at rate q."""
    return ("piece", str(name), float(z), float(q))


def round_key(mode: str, sampling: str, z: float, q: float, population: int) -> Key:
    """One central round's event of the mechanism `mode` (a plugin's: its own) at multiplier z,
    rate q, over `population` clients."""
    if mode in EVENTS:
        return piece_key(mode, z, q)
    return central_key(sampling, z, q, population, cohort_size(q, population))


def planned_key(cfg: Any, z: float) -> Key:
    """The event of one planned round (central) or participation (local) at multiplier z."""
    if kind(cfg.dp.mode) == "local":
        return local_key(z)
    if kind(cfg.dp.mode) == "distributed":
        t = ddg_threshold(cfg)
        key = ddg_key(z, t, t, D_PLAN)
        return key if cfg.dp.against == "server" else ddg_release_key(
            cfg.clients, cohort_size(cfg.algo.fraction, cfg.clients), key)
    return round_key(cfg.dp.mode, cfg.dp.sampling, z, cfg.algo.fraction, cfg.clients)


def planned_epsilon(cfg: Any, z: float) -> float:
    """Epsilon after the planned rounds (local: a client in every round) at multiplier z."""
    return Accountant(cfg.dp.accountant, delta(cfg)).epsilon([(planned_key(cfg, z), cfg.rounds)])


def calibrated(cfg: Any) -> tuple[float, str]:
    """(the noise multiplier, what to say): --dp-noise when given, else the smallest z whose
    planned rounds spend exactly --dp-epsilon (dp-accounting's calibration, done once per process
    for the same plan: checks.validate calibrates first, the session then reads the same); a
    ConfigError in one line naming --dp-epsilon when no z does (calibration_problem says why)."""
    dp = cfg.dp
    if dp.noise > 0:
        return float(dp.noise), ""
    got = _calibrated(*_plan_of(cfg))
    if isinstance(got, str):
        raise ConfigError(got)
    z, eps = got
    who = ("a client in every round" if kind(cfg.dp.mode) == "local" else
           f"at least {ddg_threshold(cfg)} clients' noise in each round's sum, against "
           + ("the server" if dp.against == "server" else "the released models: cohorts of "
              f"{cohort_size(cfg.algo.fraction, cfg.clients)} of {cfg.clients}") if
           kind(cfg.dp.mode) == "distributed" else
           f"{dp.sampling} sampling, q = {cfg.algo.fraction:g} of {cfg.clients}")
    return z, (f"--dp {dp.mode}: noise multiplier {z:.6g} calibrated for epsilon {dp.epsilon:g} "
               f"at delta {delta(cfg):.3g} over {cfg.rounds} rounds ({who}, {dp.accountant}; "
               f"planned epsilon {eps:.6g}; neighbours: {relation_words(cfg)})")


def _plan_of(cfg: Any) -> tuple:
    """What a calibration depends on, hashable."""
    dp = cfg.dp
    return (dp.mode, dp.sampling, float(cfg.algo.fraction), int(cfg.clients), int(cfg.rounds),
            float(dp.epsilon), delta(cfg), dp.accountant,
            ddg_threshold(cfg) if kind(cfg.dp.mode) == "distributed" else 0,
            dp.against if kind(cfg.dp.mode) == "distributed" else "")


@functools.lru_cache(maxsize=32)
def _calibrated(mode: str, sampling: str, q: float, n: int, rounds: int, target: float,
                d: float, accountant: str, t: int = 0, against: str = ""
                ) -> tuple[float, float] | str:
    """(z, the planned epsilon at z) of a plan, or why it has none (one line)."""
    def key(z: float) -> Key:
        if kind(mode) == "distributed":
            k = ddg_key(z, t, t, D_PLAN)
            return k if against == "server" else ddg_release_key(n, cohort_size(q, n), k)
        if mode in EVENTS:
            return piece_key(mode, z, q)
        return local_key(z) if kind(mode) == "local" else central_key(sampling, z, q, n,
                                                                       cohort_size(q, n))

    try:
        z = (calibrate_rdp(key, rounds, target, d) if key(1.0)[0] == SAMPLED_DDG else
             calibrate(key, rounds, target, d, accountant))
    except NoCalibration as e:
        return _no_calibration(key, rounds, target, d, str(e))
    return z, Accountant(accountant, d).epsilon([(key(z), rounds)])


def _no_calibration(key: Any, rounds: int, target: float, d: float, why: str) -> str:
    """Why no noise multiplier meets the target, with the epsilon at the search's lower end."""
    rdp = Accountant("rdp", d, remember=False)
    try:
        low = rdp.epsilon([(key(Z_MIN), rounds)])
    except (ValueError, ArithmeticError):
        low = math.inf
    if low < target:
        return (f"--dp-epsilon {target:g}: {rounds} rounds spend only epsilon {low:.4g} at a "
                f"noise multiplier of {Z_MIN:g} (no noise to speak of), so there is no noise to "
                "calibrate; give a smaller --dp-epsilon, or --dp-noise Z")
    return (f"--dp-epsilon {target:g} at delta {d:.3g}: {why}; give a larger --dp-epsilon or "
            "--dp-delta, or --dp-noise Z")


_FLOATS = ("clip", "noise", "epsilon", "delta", "quantile", "clip_lr", "count_noise", "sgd_noise",
           "sgd_clip", "sgd_delta")  # the dp settings that are numbers


def settings_problem(cfg: Any) -> str:
    """Why the dp settings' numbers cannot be used, in one line naming the option ('' when they
    can): every one finite (a range check lets inf through), a given noise multiplier within
    [Z_MIN, Z_GIVEN_MAX] (the accountant's reach), adaptive clipping's geometric step finite
    (its exponent L |b - Q| below 700 for b within 40 standard deviations of its noise), and the
    noise's standard deviation (multiplier times clip norm) within a float32 model's range."""
    dp = cfg.dp
    for name in _FLOATS:
        v = float(getattr(dp, name))
        if math.isfinite(v):
            continue
        opt = f"--dp-{name.replace('_', '-')}"
        if name == "epsilon":
            return (f"{opt} {v:g}: a privacy budget is a finite number; for a run without a "
                    "budget give --dp-noise Z and no --dp-epsilon, for no privacy drop --dp")
        return f"{opt} {v:g}: give a finite number"
    if dp.against != "release" and kind(cfg.dp.mode) != "distributed":
        return (f"--dp-against {dp.against}: a setting of --dp distributed (central DP's "
                "adversary is whoever sees the released models; local DP's, anyone)")
    if dp.survivors and kind(cfg.dp.mode) != "distributed":
        return (f"--dp-survivors {dp.survivors:g}: a setting of --dp distributed (the clients "
                "whose noise shares a round's sum must hold)")
    for name, z, zero in (("noise", dp.noise, "calibrated"), ("sgd_noise", dp.sgd_noise, "off")):
        if z and not Z_MIN <= z <= Z_GIVEN_MAX:
            return (f"--dp-{name.replace('_', '-')} {z:g}: a noise multiplier is in "
                    f"[{Z_MIN:g}, {Z_GIVEN_MAX:g}] (0: {zero}); below, the accountant divides by "
                    "almost 0 and the run has no privacy to speak of; above, epsilon is 0 long "
                    "before and dp-accounting's sums fail")
    if dp.adaptive and kind(cfg.dp.mode) == "central":
        reach = dp.clip_lr * (1.5 + 40 * count_noise(cfg) / expected_cohort(cfg))
        if reach >= 700:  # math.exp overflows past 709
            return (f"--dp-clip-lr {dp.clip_lr:g}: adaptive clipping's step C exp(-L (b - Q)) "
                    f"can overflow (L x (1.5 + 40 x the count's noise {count_noise(cfg):g} / "
                    f"{expected_cohort(cfg):g} users) = {reach:.3g} >= 700); lower --dp-clip-lr "
                    "or --dp-count-noise")
    for z, c, opt in ((dp.noise or 1.0, dp.clip, "--dp-clip"),
                      (dp.sgd_noise, dp.sgd_clip, "--dp-sgd-clip")):
        if z * c > FLOAT32_MAX:
            return (f"{opt} {c:g}: the noise's standard deviation (noise multiplier x clip = "
                    f"{z * c:.3g}) is beyond a float32 model's range; give a smaller clip norm")
    return ""


def calibration_problem(cfg: Any) -> str:
    """Why the noise cannot be calibrated to --dp-epsilon ('' when it can, or needs no
    calibration), in one line naming the options: no multiplier in [Z_MIN, Z_MAX] meets it, or,
    with --dp-adaptive, the calibrated one is not below twice the count's noise (update_noise).
    Calibrates (once: calibrated() then reads the same)."""
    dp = cfg.dp
    if dp.mode == "none" or dp.noise > 0 or dp.epsilon <= 0:
        return ""
    got = _calibrated(*_plan_of(cfg))
    if isinstance(got, str):
        return got
    std = count_noise(cfg)
    if dp.adaptive and got[0] >= 2 * std:
        return (f"--dp-adaptive with --dp-epsilon {dp.epsilon:g}: the calibrated noise multiplier "
                f"{got[0]:.4g} is not below twice the count's noise (2 x {std:g}), which the two "
                "releases share; raise --dp-count-noise (its default is the expected cohort / 20) "
                "or --dp-epsilon")
    return ""


def noise_ratio(cfg: Any, params: int) -> float:
    """About how many times the clip norm C the noise on a round's mean update is (its l2 norm
    over C, for `params` noised values), the mean's own norm being at most C: central
    z_u sqrt(d) / D, local (the mean of m privatized updates) z sqrt(d / m); 0 without
    user-level DP."""
    dp, d = cfg.dp, max(int(params), 1)
    if kind(cfg.dp.mode) == "central":
        z = update_noise(dp.noise, count_noise(cfg)) if dp.adaptive else dp.noise
        return z * math.sqrt(d) / expected_cohort(cfg)
    if kind(cfg.dp.mode) == "local":
        return dp.noise * math.sqrt(d / max(cfg.algo.fraction * cfg.clients, 1.0))
    if kind(cfg.dp.mode) == "distributed":  # the sum's noise z C sqrt(k/t) over k >= t clients
        return dp.noise * math.sqrt(d) / ddg_threshold(cfg)
    return 0.0


def _noise_words(cfg: Any) -> str:
    """The user-level noise in words: its standard deviation per value and where it comes from."""
    dp = cfg.dp
    if kind(cfg.dp.mode) == "central":
        z = update_noise(dp.noise, count_noise(cfg)) if dp.adaptive else dp.noise
        per, users = z * dp.clip / expected_cohort(cfg), expected_cohort(cfg)
        return (f"--dp {dp.mode}'s noise has std {per:.3g} per parameter of the mean (multiplier "
                f"{dp.noise:.4g}, clip {dp.clip:g}, {users:g} users a round)")
    if kind(cfg.dp.mode) == "distributed":
        t = ddg_threshold(cfg)
        return (f"--dp distributed's noise has std at most {dp.noise * dp.clip / t:.3g} per "
                f"parameter of the mean (multiplier {dp.noise:.4g}, clip {dp.clip:g}, at least "
                f"{t} clients unmasked a round)")
    return (f"--dp local's noise has std {dp.noise * dp.clip:.3g} per parameter of each result "
            f"(multiplier {dp.noise:.4g}, clip {dp.clip:g})")


_LOWER = {"central": "more users a round, a larger --dp-epsilon or fewer --rounds lower it",
          "local": "a larger --dp-epsilon or fewer --rounds lower it",
          "distributed": "more users a round, a larger --dp-epsilon or fewer --rounds lower it"}


def noise_cause(cfg: Any, params: int) -> str:
    """Why a result of this run may hold NaN/inf ('' when the noise is not the likely cause):
    under user-level DP whose noise on the mean is above the clip norm (noise_ratio > 1), the
    noised models are what make the clients' training diverge."""
    if cfg.dp.mode == "none" or noise_ratio(cfg, params) <= 1:
        return ""
    return f"{DP_CAUSE}: {_noise_words(cfg)}; {_LOWER[kind(cfg.dp.mode)]}"


def remarks(cfg: Any, params: int) -> list[str]:
    """What a DP run says before its first round, one line each: a given --dp-delta not below
    1/N (default_delta), and a noise that swamps the round's mean update (noise_ratio above
    SWAMPED: over R rounds the updates add up as R, the noise as sqrt(R))."""
    dp, n = cfg.dp, cfg.clients
    out: list[str] = []
    if dp.mode == "none":
        return out
    if dp.delta > 0 and dp.delta >= 1.0 / n:
        out.append(f"--dp-delta {dp.delta:g} is not below 1/--clients = {1 / n:.3g}: such an "
                   "(epsilon, delta) guarantee allows publishing each user's data outright with "
                   f"probability delta (about {dp.delta * n:.3g} of the {n} users); choose a "
                   f"delta well below 1/N (the default: min(1e-5, 1/(10 N)) = "
                   f"{default_delta(n):.3g})")
    ratio = noise_ratio(cfg, params)
    if ratio > SWAMPED:
        out.append(f"the noise is likely to swamp the updates: {_noise_words(cfg)}; its norm on "
                   f"a round's mean update ({params:,} values) is about {ratio:.3g} times the "
                   f"clip norm, the most the update itself can be; {_LOWER[kind(cfg.dp.mode)]}")
    return out


def epsilon_remark(eps: float, d: float) -> str:
    """A reported epsilon below 0.01 (or not finite), in words ('' otherwise)."""
    if not math.isfinite(eps):
        return f"epsilon is not finite at delta {d:.3g}: the run gives no privacy to speak of"
    if eps < 0.01:
        return (f"epsilon {eps:.3g} at delta {d:.3g}: the noise is so large that the accountant "
                "bounds the privacy loss by delta alone (a model can hardly learn under such "
                "noise), and the guarantee is only as good as that delta")
    return ""
