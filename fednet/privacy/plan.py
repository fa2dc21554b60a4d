"""A run's privacy plan: its DP settings (the `dp` section of the run configuration, read as
plain attributes: this leaf imports no config) turned into the accountant's events, and the noise
multiplier calibrated to a target epsilon before the run (docs/algorithms.md §11).

The noise multiplier z of `--dp-noise` is the mechanism's: the Gaussian noise added to the sum
of the clipped updates has standard deviation z*C (central), and each client's own noise z*C
(local). The accountant's multiplier is the noise over the l2-sensitivity of what it is added to:

    central, Poisson sampling (add or remove one user)     sensitivity C     -> z
    central, fixed-size sampling (replace one user)        sensitivity 2C    -> z/2
    local, one release of a client's update (any data)     sensitivity 2C    -> z/2

With adaptive clipping z is the total multiplier of the two Gaussian releases of a round (the
noised clipped sum and the noised count of unclipped updates, Andrew et al. 2021, §3.1): the
update's own noise is z_u = (z^-2 - (2 sigma_b)^-2)^-1/2 > z, so that the pair is exactly one
Gaussian mechanism with multiplier z (sigma_b: the count's noise, in clients).
"""
from __future__ import annotations

import math
from typing import Any

from fednet.errors import ConfigError
from fednet.privacy.accountant import Accountant, Key, calibrate

MODES = ("none", "central", "local")
SAMPLINGS = ("poisson", "fixed")


def delta(cfg: Any) -> float:
    """The run's delta: --dp-delta, or 1/population."""
    return float(cfg.dp.delta) if cfg.dp.delta > 0 else 1.0 / cfg.clients


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
        raise ConfigError(f"--dp-noise {z:g} needs a count noise above {z / 2:g} for adaptive "
                          f"clipping (--dp-count-noise is {count_std:g}); raise "
                          "--dp-count-noise or lower the noise")
    return (z ** -2 - (2 * count_std) ** -2) ** -0.5


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


def planned_key(cfg: Any, z: float) -> Key:
    """The event of one planned round (central) or participation (local) at multiplier z."""
    if cfg.dp.mode == "local":
        return local_key(z)
    n, q = cfg.clients, cfg.algo.fraction
    return central_key(cfg.dp.sampling, z, q, n, cohort_size(q, n))


def planned_epsilon(cfg: Any, z: float) -> float:
    """Epsilon after the planned rounds (local: a client in every round) at multiplier z."""
    return Accountant(cfg.dp.accountant, delta(cfg)).epsilon([(planned_key(cfg, z), cfg.rounds)])


def calibrated(cfg: Any) -> tuple[float, str]:
    """(the noise multiplier, what to say): --dp-noise when given, else the smallest z whose
    planned rounds spend exactly --dp-epsilon (dp-accounting's calibration)."""
    dp, d = cfg.dp, delta(cfg)
    if dp.noise > 0:
        return float(dp.noise), ""
    z = calibrate(lambda x: planned_key(cfg, x), cfg.rounds, dp.epsilon, d, dp.accountant)
    eps = planned_epsilon(cfg, z)
    who = ("a client in every round" if dp.mode == "local" else
           f"{dp.sampling} sampling, q = {cfg.algo.fraction:g} of {cfg.clients}")
    return z, (f"--dp {dp.mode}: noise multiplier {z:.6g} calibrated for epsilon {dp.epsilon:g} "
               f"at delta {d:.3g} over {cfg.rounds} rounds ({who}, {dp.accountant}; planned "
               f"epsilon {eps:.6g})")
