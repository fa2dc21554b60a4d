"""Distributed differential privacy under secure aggregation (`--dp distributed`, with --secagg):
the distributed discrete Gaussian mechanism of Kairouz, Liu and Steinke, "The Distributed
Discrete Gaussian Mechanism for Federated Learning with Secure Aggregation" (ICML 2021; arXiv
2102.06387). Spec: docs/algorithms.md §11.6.

Each client clips its update x to l2 norm C, scales it onto the integer grid of step
gamma = C / 2^GRID_BITS, rounds it with conditional randomized rounding (each coordinate up with
the probability of its fractional part, redrawn until the rounded vector's norm is within the
bound delta2 of the paper, at beta = exp(-1/2)), adds discrete Gaussian noise N_Z(0, sigma^2) to
every coordinate, and sends the result as elements of Z_{2^64} for secure aggregation to mask.
The server unmasks only the sum: k clients' rounded updates plus the sum of their noises.

The guarantee against the server (which sees only that sum): the third bound of the paper's
Proposition 14, (alpha, alpha rho)-RDP for every alpha, that is rho-zCDP, with
rho = (delta2 / (sqrt(k) sigma) + tau sqrt(d))^2 / 2 and tau = 10 sum_{j=1}^{k-1}
exp(-2 pi^2 sigma^2 j / (j + 1)), for one user's update replaced by zero. The accountant takes
it as dp-accounting's ZCDpEvent(rho) (privacy/accountant.py), one per round; the server knows
who took part, so no amplification by sampling holds against it.

Against whoever sees only the released models (not who took part), each round is that
mechanism run on a cohort of m drawn without replacement from the N clients: for one user
replaced by another (sensitivity 2 delta2, rho at span 2), its Renyi divergences are at most
Wang, Balle and Kasiviswanathan's general bound for sampling without replacement (AISTATS 2019,
Theorem 9, which needs only the mechanism's RDP curve; sampled_rdp), summed over rounds and
converted to epsilon by dp-accounting. The paper's own experiments calibrate with such
amplification (its code: the sampled RDP of Zhu and Wang 2019 at q = clients per round over
clients, Poisson); fednet's cohorts are drawn without replacement, so the bound is that
sampling's. --dp-against names which of the two --dp-epsilon calibrates and the budget stops
(default release, as the paper); summary.json reports both.

Each client's sigma is z (the noise multiplier) times C/gamma over sqrt(t), t the fewest clients
a round may unmask (the protocol's threshold, privacy/plan.ddg_threshold): with k >= t survivors
the sum's noise has standard deviation at least z C, as DP-FedAvg's of multiplier z.

Deviation from the paper, stated: no random rotation and no modular clipping. The paper flattens
the update with a randomized Hadamard transform so that a small field (16 to 20 bits a value)
holds the sum; here the field is Z_{2^64} and the grid fine (GRID_BITS), sized so that the
largest sum of k <= MAX_SUMMANDS clipped coordinates (each at most C in absolute value) and
10 standard deviations of the noise never wrap: the rounding error is 2^-40 C a coordinate and
no coordinate is clipped. The cost is 8 bytes a value on the uplink, as secure aggregation's
64-bit field; the paper's point, fewer bits, is not pursued."""
from __future__ import annotations

import math

import numpy as np

from fednet import opcount

GRID_BITS = 40
"""gamma = C / 2^GRID_BITS: a clipped coordinate is at most 2^40 grid steps."""
BETA = math.exp(-0.5)
"""Conditional rounding's beta (the paper's and TensorFlow Federated's default)."""
FIELD_BITS = 64
TAIL_SIGMAS = 10.0
"""The noise's sum is taken to stay within this many standard deviations (a 10-sigma tail of a
Gaussian is about 1.5e-23 a coordinate)."""
MAX_SUMMANDS = (1 << (FIELD_BITS - 1 - GRID_BITS)) - 1
"""The most clients whose clipped, rounded coordinates add up without wrapping (2^23 - 1)."""
D_PLAN = 1 << 31
"""The dimension a calibration assumes before the model exists (delta2 grows with d; the model's
own d, at most this, gives an epsilon at most the planned one)."""


def scale() -> float:
    """C / gamma: a clipped update's norm in grid steps."""
    return float(1 << GRID_BITS)


def delta2(d: int, beta: float = BETA) -> float:
    """The l2 bound of a clipped update after conditional randomized rounding, in grid steps:
    min(sqrt(s^2 + d/4 + sqrt(2 ln(1/beta)) (s + sqrt(d)/2)), s + sqrt(d)), s = C/gamma
    (Kairouz et al. 2021, the rounding's norm bound)."""
    s = scale()
    a = s * s + d / 4 + math.sqrt(2 * math.log(1 / beta)) * (s + math.sqrt(d) / 2)
    return min(math.sqrt(a), s + math.sqrt(d))


def sigma(z: float, t: int) -> float:
    """Each client's noise standard deviation in grid steps: z s / sqrt(t)."""
    return z * scale() / math.sqrt(t)


def tau(sig: float, k: int) -> float:
    """10 sum_{j=1}^{k-1} exp(-2 pi^2 sig^2 j / (j + 1)): how far a sum of k discrete Gaussians
    is from one (0 in floating point once sig is above about 4)."""
    if sig > 10:
        return 0.0
    j = np.arange(1, max(k, 1), dtype=np.float64)
    return float(10 * np.exp(-2 * math.pi ** 2 * sig ** 2 * j / (j + 1)).sum())


def rho(z: float, t: int, k: int, d: int, span: int = 1) -> float:
    """The zCDP rho of one round whose sum holds k clients' noises (each of multiplier z over t)
    for updates of d values: (span delta2 / (sqrt(k) sigma) + tau sqrt(d))^2 / 2; span 1: one
    user's update replaced by zero (sensitivity delta2), span 2: replaced by another user's
    (2 delta2, the replace-one relation of fixed-size sampling)."""
    sig = sigma(z, t)
    return 0.5 * (span * delta2(d) / (math.sqrt(k) * sig) + tau(sig, k) * math.sqrt(d)) ** 2


def _sampled_cgf(r: float, gamma: float, a: int) -> float:
    """(a - 1) times the order-a Renyi divergence bound of a mechanism of RDP curve eps(j) = r j
    run on a uniformly sampled subset (rate gamma), replace-one: the log of Wang, Balle and
    Kasiviswanathan's general bound (AISTATS 2019, Theorem 9; eps(infinity) unbounded)."""
    if a <= 1:
        return 0.0
    e2 = 2 * r
    j = np.arange(3, a + 1, dtype=np.float64)
    comb = math.lgamma(a + 1) - _LGAMMA[3:a + 1] - _LGAMMA[a - 3::-1][:j.size]
    terms = np.concatenate([[0.0, 2 * math.log(gamma) + math.log(a * (a - 1) / 2) + min(
        math.log(4) + e2 + math.log(-math.expm1(-e2)), e2 + math.log(2))],
        math.log(2) + (j - 1) * j * r + j * math.log(gamma) + comb])
    top = float(terms.max())
    return top + math.log(float(np.exp(terms - top).sum()))


_LGAMMA = np.array([math.lgamma(n + 1) for n in range(4097)])
"""log(n!) for n = 0..4096 (the orders a sampled bound is taken at stay below)."""


def sampled_rdp(r: float, gamma: float, orders: np.ndarray) -> np.ndarray:
    """The RDP, at each order, of a rho-zCDP mechanism (eps(a) = r a, for the replace-one
    relation) run on a subset of size m drawn without replacement from N (gamma = m / N), the
    population public: Wang, Balle and Kasiviswanathan 2019, Theorem 9, the bound for any
    mechanism (it needs only eps at integer orders); between integer orders the CGF is
    interpolated (their Corollary 10, the CGF being convex); never above r a (no sampling).
    dp-accounting's SampledWithoutReplacementDpEvent takes only a Gaussian inside, whose bound
    (their Theorem 27) is tighter by the Gaussian's own forward differences, which the discrete
    Gaussian's sum is not shown to have; above order 256 dp-accounting computes this same
    Theorem 9 (tests/test_dp_distributed.py checks the two agree there)."""
    out = []
    for a in np.asarray(orders, dtype=np.float64):
        full = r * a
        if gamma >= 1:
            out.append(full)
            continue
        lo, hi = math.floor(a), math.ceil(a)
        frac = a - lo
        cgf = (1 - frac) * _sampled_cgf(r, gamma, lo) + frac * _sampled_cgf(r, gamma, hi)
        out.append(min(cgf / (a - 1), full))
    return np.array(out, dtype=np.float64)


def largest(k: int, z: float, t: int) -> float:
    """The largest |value| an honest sum of k clients makes, in grid steps: k (C/gamma + 1)
    (clipped and rounded coordinates) plus TAIL_SIGMAS of the summed noise."""
    return k * (scale() + 1) + TAIL_SIGMAS * math.sqrt(k) * sigma(z, t)


def fits(k: int, z: float, t: int) -> str:
    """Why a sum of k clients' values may wrap in Z_{2^64} ('' when it cannot): its largest
    value must stay below 2^63."""
    if k <= MAX_SUMMANDS and largest(k, z, t) < 2.0 ** (FIELD_BITS - 1):
        return ""
    return (f"a round of {k} clients with noise multiplier {z:g} can exceed the 64-bit field "
            f"(at most {MAX_SUMMANDS:,} clients, and the noise within it)")


# ---- the client's side ----------------------------------------------------------------------
def discrete_gaussian(sig: float, size: int, gen: np.random.Generator) -> np.ndarray:
    """`size` draws of N_Z(0, sig^2) (Canonne, Kamath and Steinke 2020, Algorithm 3: a discrete
    Laplace of scale t = floor(sig) + 1, kept with probability exp(-(|Y| - sig^2/t)^2 / (2
    sig^2)); in floating point, vectorized, redrawing the rejected ones). Each attempt's two
    geometric draws and one uniform are charged to the open task meter (opcount "noise", at the
    client's noise rate: the clock's client compute), as many as the seeded stream needed."""
    out = np.empty(size, dtype=np.int64)
    todo = np.arange(size)
    t = math.floor(sig) + 1
    p = -math.expm1(-1.0 / t)  # a geometric's success probability: 1 - e^{-1/t}
    while todo.size:
        n = todo.size
        opcount.charge({"noise": 3.0 * n})  # on the clock: an attempt's three draws
        y = (gen.geometric(p, n) - gen.geometric(p, n)).astype(np.int64)  # discrete Laplace(t)
        keep = gen.random(n) < np.exp(-((np.abs(y) - sig * sig / t) ** 2) / (2 * sig * sig))
        out[todo[keep]] = y[keep]
        todo = todo[~keep]
    return out


def rounded(x: np.ndarray, bound: float, gen: np.random.Generator) -> np.ndarray:
    """x (grid steps) rounded coordinate by coordinate, up with the probability of its
    fractional part, redrawn until the result's l2 norm is at most `bound`."""
    low = np.floor(x)
    frac = x - low
    while True:
        opcount.charge({"noise": float(x.size)})  # a uniform draw a coordinate, each try
        r = low + (gen.random(x.size) < frac)
        if float(np.dot(r, r)) <= bound * bound:
            return r.astype(np.int64)


def encode(update: np.ndarray, clip: float, z: float, t: int, gen: np.random.Generator
           ) -> np.ndarray:
    """A client's update clipped to `clip`, on the grid, rounded, noised: elements of Z_{2^64}
    (uint64, two's complement of the signed values)."""
    x = np.asarray(update, dtype=np.float64)
    norm = float(np.linalg.norm(x))
    if norm > clip:
        x = x * (clip / norm)
    r = rounded(x * (scale() / clip), delta2(x.size), gen)
    noisy = r + discrete_gaussian(sigma(z, t), x.size, gen)
    return noisy.view(np.uint64)


# ---- the server's side ----------------------------------------------------------------------
def decode(total: np.ndarray, clip: float) -> np.ndarray:
    """The unmasked sum (uint64 modulo 2^64) as real numbers: signed, times gamma."""
    return np.asarray(total, dtype=np.uint64).view(np.int64).astype(np.float64) * (clip / scale())


def out_of_bound(total: np.ndarray, k: int, z: float, t: int) -> int:
    """How many values of an unmasked sum of k clients lie outside what honest clients make,
    |value| <= largest(k, z, t) (a wrong masked input or share leaves masks in, uniform over
    the field)."""
    most = largest(k, z, t)
    signed = np.asarray(total, dtype=np.uint64).view(np.int64)
    return int(np.count_nonzero(np.abs(signed.astype(np.float64)) > most))
