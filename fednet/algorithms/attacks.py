"""What a malicious client sends instead of its honest update: the attacks' math on flattened
float64 updates (numpy only). Spec: docs/algorithms.md §10.1. The client side (who attacks,
poisoned data, the colluders' honest updates) is algorithms/attack_client.py.

An update is Δ = θ_local − θ (the trained model minus the model the task carried); the
attacker sends θ + Δ_mal, so its sample count, layout and dtypes stay the honest ones and only
the values lie. H below is a (k, d) matrix of honest updates the colluders computed on their own
data (the attacker's own first): the "partial knowledge" of Shejwalkar and Houmansadr, the
estimate from the attackers' own data of Baruch et al.
"""
from __future__ import annotations

import math

import numpy as np

THRESHOLD = 1e-5  # min-max / min-sum: the search for gamma stops at this step


def sign_flip(delta: np.ndarray, flip: float) -> np.ndarray:
    """−flip · Δ."""
    return -float(flip) * delta


def gaussian(size: int, sigma: float, gen: np.random.Generator) -> np.ndarray:
    """An update drawn from N(0, σ² I), ignoring the honest one."""
    return gen.normal(0.0, float(sigma), size)


def boosted(delta: np.ndarray, boost: float) -> np.ndarray:
    """Model replacement: γ · Δ (Bagdasaryan et al.: γ = n / η to replace the global model)."""
    return float(boost) * delta


def spread(h: np.ndarray) -> np.ndarray:
    """The coordinate-wise sample standard deviation (ddof 1; zeros for a single update)."""
    return h.std(axis=0, ddof=1) if len(h) > 1 else np.zeros(h.shape[1])


def alie(h: np.ndarray, z: float) -> np.ndarray:
    """A Little Is Enough: μ − z σ per coordinate (μ, σ of the colluders' honest updates)."""
    return h.mean(axis=0) - float(z) * spread(h)


def ipm(h: np.ndarray, epsilon: float) -> np.ndarray:
    """Inner-product manipulation: −ε μ."""
    return -float(epsilon) * h.mean(axis=0)


def perturbation(h: np.ndarray, deviation: str) -> np.ndarray:
    """∇p of min-max / min-sum: −μ/|μ| (unit_vec), −σ (std) or −sign(μ) (sign)."""
    mu = h.mean(axis=0)
    if deviation == "unit_vec":
        norm = float(np.linalg.norm(mu))
        return -mu / norm if norm > 0 else np.zeros_like(mu)
    if deviation == "std":
        return -spread(h)
    if deviation == "sign":
        return -np.sign(mu)
    raise ValueError(f"unknown deviation {deviation!r}")


def _sq_dist_to(h: np.ndarray, v: np.ndarray) -> np.ndarray:
    d = h - v
    return np.einsum("ij,ij->i", d, d)


def _pairwise(h: np.ndarray) -> np.ndarray:
    return np.stack([_sq_dist_to(h, row) for row in h])


def min_max_bound(h: np.ndarray, kind: str) -> float:
    """The bound a malicious update must keep: min-max, the largest squared distance between
    two honest updates; min-sum, the largest sum of squared distances of one honest update to
    the others."""
    d = _pairwise(h)
    return float(d.max() if kind == "minmax" else d.sum(axis=1).max())


def _fits(h: np.ndarray, mal: np.ndarray, kind: str, bound: float) -> bool:
    d = _sq_dist_to(h, mal)
    return float(d.max() if kind == "minmax" else d.sum()) <= bound


def min_max(h: np.ndarray, kind: str, deviation: str, gamma_init: float) -> np.ndarray:
    """Min-max (kind 'minmax') or min-sum ('minsum'), AGR-agnostic (Shejwalkar and Houmansadr,
    NDSS 2021, Algorithm 1): μ + γ ∇p with the largest γ found by halving steps from γ_init
    such that the malicious update stays within the bound of min_max_bound."""
    mu, dev = h.mean(axis=0), perturbation(h, deviation)
    bound = min_max_bound(h, kind)
    gamma, step, good = float(gamma_init), float(gamma_init) / 2, 0.0
    while abs(good - gamma) > THRESHOLD:
        if _fits(h, mu + gamma * dev, kind, bound):
            good = gamma
            gamma += step
        else:
            gamma -= step
        step /= 2
    return mu + good * dev


def alie_round(n: int, share: float) -> tuple[int, int]:
    """(n, m) of ALIE's z_max for a round of n clients with the run's malicious share."""
    return n, max(1, math.floor(share * n + 0.5))
