"""The privacy accountant: Google's dp-accounting (RDP or PLD); a formula of fednet's own only
where the library has no event (a sampled distributed-DP round's Renyi divergences, "ddg_wor"
below, converted to epsilon by the library).

A run's privacy history is a list of *events*, each a JSON-friendly key of dp-accounting's own
parameters, with how many times it happened:

    ["poisson", q, z]     PoissonSampledDpEvent(q, GaussianDpEvent(z))       add or remove one
    ["fixed", n, m, z]    SampledWithoutReplacementDpEvent(n, m, GaussianDpEvent(z))  replace one
    ["gaussian", z]       GaussianDpEvent(z)                                  (no sampling)
    ["ddg", z, t, k, d]   ZCDpEvent(rho)      one round of distributed DP: k clients' discrete
                          Gaussian noises (multiplier z over t) on updates of d values, rho by
                          privacy/distributed.rho (Kairouz et al. 2021, Proposition 14)
    ["piece", name, z, q] the event a plugin's mechanism `name` declares for one round at
                          multiplier z, Poisson sampling at rate q (fednet.api.DPSpec.event)
    ["ddg_wor", N, m, z, t, k, d]  the same round of distributed DP seen by whoever sees only the
                          released models, its cohort of m drawn without replacement from N:
                          no dp-accounting event takes a sampled zCDP mechanism, so its Renyi
                          divergences are Wang, Balle and Kasiviswanathan's general bound for
                          sampling without replacement (privacy/distributed.sampled_rdp) of the
                          round's zCDP curve for replace-one (rho at span 2) at dp-accounting's
                          orders, and the epsilon is dp-accounting's conversion of their sum

z is the accountant's noise multiplier: the noise's standard deviation over the l2-sensitivity
of what it is added to (privacy/plan.py turns a mechanism's settings into these keys). The
epsilon of a history at delta is the library's for the composition of its events: with RDP, the
library's Renyi divergences of each event (computed once per distinct event) times its count,
summed, then the library's conversion to (epsilon, delta); with PLD, the library's privacy loss
distribution of the whole composition. tests/test_dp_accountant.py checks both against
dp-accounting's accountants run on the same events from scratch.
"""
from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from fednet.privacy import EVENTS, require

Key = tuple  # ("poisson", q, z) | ("fixed", n, m, z) | ("gaussian", z) | ("ddg", z, t, k, d)
SAMPLED_DDG = "ddg_wor"  # ("ddg_wor", N, m, z, t, k, d): see the module's docstring
ACCOUNTANTS = ("rdp", "pld")
Z_MIN = 1e-3
"""calibrate()'s lower endpoint: a target epsilon that this noise multiplier already meets has no
calibration (dp-accounting's search cannot bracket it)."""
Z_MAX = Z_MIN + (1.0 - Z_MIN) * (2 ** 31 - 1)
"""The largest noise multiplier calibrate()'s search reaches (dp-accounting doubles the interval
[Z_MIN, 1] 30 times), about 2.1e9."""


PLD_FLOOR = 0.2
"""calibrate() never goes below this noise multiplier with PLD (a PLD of a much smaller noise needs
gigabytes of memory)."""


class NoCalibration(ValueError):
    """No noise multiplier within [Z_MIN, Z_MAX] meets the target epsilon."""


def _dp() -> Any:
    dp = require("dp_accounting", "differential privacy (--dp, --dp-sgd-noise)")
    # RDP orders whose series do not converge (large sampling rates) are left out of the bound,
    # which stays valid; the library says so once per order and per call, at WARNING
    logging.getLogger("absl").setLevel(logging.ERROR)
    return dp


def event(key: Sequence[Any]) -> Any:
    """The dp-accounting DpEvent of one key."""
    dp = _dp()
    kind = key[0]
    if kind == "poisson":
        return dp.PoissonSampledDpEvent(float(key[1]), dp.GaussianDpEvent(float(key[2])))
    if kind == "fixed":
        return dp.SampledWithoutReplacementDpEvent(int(key[1]), int(key[2]),
                                                   dp.GaussianDpEvent(float(key[3])))
    if kind == "gaussian":
        return dp.GaussianDpEvent(float(key[1]))
    if kind == "ddg":
        from fednet.privacy.distributed import rho

        return dp.ZCDpEvent(rho(float(key[1]), int(key[2]), int(key[3]), int(key[4])))
    if kind == "piece" and key[1] in EVENTS:
        return EVENTS[key[1]](float(key[2]), float(key[3]))
    if kind == SAMPLED_DDG:
        raise ValueError("a sampled distributed-DP round has no dp-accounting event (its Renyi "
                         "divergences are distributed.sampled_rdp's); use Accountant('rdp')")
    raise ValueError(f"unknown privacy event {key!r}")


def sampled_ddg_rdp(key: Sequence[Any], orders: np.ndarray) -> np.ndarray:
    """The Renyi divergences, at `orders`, of one ("ddg_wor", N, m, z, t, k, d) round."""
    from fednet.privacy.distributed import rho, sampled_rdp

    n, m, z, t, k, d = key[1:]
    return sampled_rdp(rho(float(z), int(t), int(k), int(d), span=2), int(m) / int(n), orders)


def relation(keys: Sequence[Sequence[Any]]) -> Any:
    """The neighbouring relation of a history: replace one for fixed-size sampling (the
    population is public), add or remove one otherwise. A history mixes none of the two."""
    rel = _dp().NeighboringRelation
    fixed = {k[0] in ("fixed", SAMPLED_DDG) for k in keys}
    if len(fixed) > 1:
        raise ValueError("a privacy history cannot mix fixed-size and Poisson sampling")
    return rel.REPLACE_ONE if fixed == {True} else rel.ADD_OR_REMOVE_ONE


def fresh(kind: str, keys: Sequence[Sequence[Any]]) -> Any:
    """A new dp-accounting accountant of `kind` (rdp, pld) for a history of these keys."""
    dp = _dp()
    rel = relation(keys)
    if kind == "rdp":
        return dp.rdp.RdpAccountant(neighboring_relation=rel)
    if kind == "pld":
        if rel != rel.ADD_OR_REMOVE_ONE:
            raise ValueError("the PLD accountant has no fixed-size sampling; use rdp")
        return dp.pld.PLDAccountant(neighboring_relation=rel)
    raise ValueError(f"unknown accountant {kind!r} (rdp, pld)")


def composed(history: Sequence[tuple[Sequence[Any], int]]) -> Any:
    """The composition of a history [(key, count), ...] as one dp-accounting event."""
    dp = _dp()
    return dp.ComposedDpEvent([dp.SelfComposedDpEvent(event(k), int(c)) for k, c in history
                               if c > 0])


class Accountant:
    """Epsilon at `delta` of histories of events, with what can be reused kept: RDP keeps each
    distinct event's Renyi divergences (a composition is their sum, weighted by counts); PLD
    keeps the epsilon of every history it has computed (a budget check before a round asks for
    the history the round's row then reports)."""

    def __init__(self, kind: str, delta: float, remember: bool = True) -> None:
        if kind not in ACCOUNTANTS:
            raise ValueError(f"unknown accountant {kind!r} ({', '.join(ACCOUNTANTS)})")
        if not 0 < delta < 1:
            raise ValueError(f"delta must be in (0, 1) (got {delta})")
        self.kind, self.delta = kind, float(delta)
        self._unit: dict[tuple, np.ndarray] = {}
        self._orders: np.ndarray | None = None
        self._seen: dict[tuple, float] = {}
        self.remember = remember  # keep every history's epsilon (not for one per client)

    def _rdp_of(self, key: Sequence[Any]) -> np.ndarray:
        k = tuple(key)
        if k not in self._unit and k[0] == SAMPLED_DDG:
            orders = np.array(fresh("rdp", [k]).orders, dtype=np.float64)
            self._unit[k], self._orders = sampled_ddg_rdp(k, orders), orders
        if k not in self._unit:
            acc = fresh("rdp", [k]).compose(event(k))
            self._unit[k] = np.array(acc.rdp, dtype=np.float64)
            self._orders = np.array(acc.orders, dtype=np.float64)
        return self._unit[k]

    def epsilon(self, history: Sequence[tuple[Sequence[Any], int]]) -> float:
        """Epsilon of the composition of `history` [(key, count), ...] at this delta (0 for an
        empty one)."""
        history = [(tuple(k), int(c)) for k, c in history if c > 0]
        if not history:
            return 0.0
        relation([k for k, _ in history])  # one relation per history
        sig = tuple(history)
        if sig in self._seen:
            return self._seen[sig]
        if self.kind == "rdp":
            total = np.zeros_like(self._rdp_of(history[0][0]))
            for k, c in history:
                total += c * self._rdp_of(k)
            rdp_mod = _dp().rdp.rdp_privacy_accountant
            eps = float(rdp_mod.compute_epsilon(self._orders, total, self.delta)[0])
        else:
            acc = fresh("pld", [k for k, _ in history]).compose(composed(history))
            eps = float(acc.get_epsilon(self.delta))
        if self.remember:
            self._seen[sig] = eps
        return eps


def calibrate(make_key: Callable[[float], Sequence[Any]], count: int, target: float,
              delta: float, kind: str) -> float:
    """The smallest noise multiplier z (within 1e-6) whose history [(make_key(z), count)] has
    epsilon <= target at delta: dp-accounting's calibrate_dp_mechanism (Brent's method), each
    candidate on a fresh accountant of `kind`; NoCalibration when no z in [Z_MIN, Z_MAX] has (the
    target is met without noise to speak of, or is below what the library can bracket). PLD is
    bracketed by RDP's answer (RDP's bound is looser, so its z suffices) and never below
    z = PLD_FLOOR (a PLD of a much smaller noise needs gigabytes of memory)."""
    dp = _dp()
    keys = [make_key(1.0)]

    def make_event(z: float) -> Any:
        return dp.SelfComposedDpEvent(event(make_key(z)), int(count))

    def run(k: str, bracket: Any) -> float:
        return float(dp.calibrate_dp_mechanism(lambda: fresh(k, keys), make_event, float(target),
                                               float(delta), bracket, tol=1e-6))

    try:
        z_rdp = run("rdp", dp.LowerEndpointAndGuess(Z_MIN, 1.0))
    except dp.UnsupportedEventError:  # (a plugin's event only PLD takes, e.g. Laplace's)
        if kind == "rdp":
            raise NoCalibration("dp-accounting's RDP accountant does not take this mechanism's "
                                "event; use --dp-accountant pld") from None
        try:
            return run("pld", dp.LowerEndpointAndGuess(PLD_FLOOR, 1.0))
        except dp.mechanism_calibration.NoBracketIntervalFoundError as e:
            raise NoCalibration(f"no noise multiplier from {PLD_FLOOR:g} meets it") from e
    except dp.mechanism_calibration.NoBracketIntervalFoundError as e:
        raise NoCalibration(f"no noise multiplier in [{Z_MIN:g}, {Z_MAX:.3g}] meets it") from e
    except (ValueError, ArithmeticError) as e:  # the library's own numerics (e.g. a domain error)
        raise NoCalibration(f"dp-accounting could not calibrate the noise ({e})") from e
    if kind == "rdp":
        return z_rdp
    pld = Accountant("pld", delta)
    lo = z_rdp / 2
    while lo > PLD_FLOOR and pld.epsilon([(make_key(lo), count)]) <= target:
        lo /= 2
    lo = max(lo, PLD_FLOOR)
    if lo >= z_rdp or pld.epsilon([(make_key(lo), count)]) <= target:
        return min(lo, z_rdp)
    return run("pld", dp.ExplicitBracketInterval(lo, z_rdp))


def calibrate_rdp(make_key: Callable[[float], Sequence[Any]], count: int, target: float,
                  delta: float) -> float:
    """calibrate() for events no dp-accounting event stands for ("ddg_wor"): the smallest z
    (within a relative 1e-9) whose history [(make_key(z), count)] has this module's RDP epsilon
    <= target, by bisection (epsilon falls as z grows); NoCalibration as calibrate()."""
    acc = Accountant("rdp", delta, remember=False)

    def eps(z: float) -> float:
        return acc.epsilon([(make_key(z), count)])

    if eps(Z_MIN) <= target:
        raise NoCalibration(f"the target is met at z = {Z_MIN:g}")
    lo, hi = Z_MIN, 1.0
    while eps(hi) > target:
        lo, hi = hi, hi * 2
        if hi > Z_MAX:
            raise NoCalibration(f"no noise multiplier in [{Z_MIN:g}, {Z_MAX:.3g}] meets it")
    while hi - lo > 1e-9 * hi:
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if eps(mid) <= target else (mid, hi)
    return hi


def is_finite(eps: float) -> bool:
    """False for the infinite epsilon of a mechanism without noise."""
    return math.isfinite(eps)


def counts_problem(counts: np.ndarray | None, kept: bool, clients: int, rounds_done: int,
                   participants: dict[int, int]) -> str:
    """Why a checkpoint's tasks per client (local DP and DP-SGD account from them) are not the
    run's (one line), or '': `kept` (local DP, DP-SGD) one integer count per client, each at
    most the rounds done and each the tasks the checkpoint's participants record for it (a
    round's tasks count once it is done, in both; no participants: a checkpoint of an older
    fednet); otherwise none."""
    if not kept:
        return "" if counts is None else ("array 'state/dp_counts': only --dp local and DP-SGD "
                                          "count tasks per client")
    if counts is None or counts.shape != (clients,) or counts.dtype.kind not in "iu":
        return f"array 'state/dp_counts' must be {clients} integer task counts, one per client"
    if counts.size and not (counts.min() >= 0 and counts.max() <= rounds_done):
        return (f"array 'state/dp_counts' holds a count outside 0..{rounds_done} (the rounds "
                f"done; a client has at most one task a round): "
                f"{int(counts.min())}..{int(counts.max())}")
    if rounds_done and not participants:
        return ""
    want = np.zeros(clients, dtype=np.int64)
    for cid, n in participants.items():
        want[cid] = n
    wrong = np.flatnonzero(counts != want)
    if not wrong.size:
        return ""
    c = int(wrong[0])
    return (f"array 'state/dp_counts' gives client {c} {int(counts[c])} tasks, the checkpoint's "
            f"participants {int(want[c])} ({wrong.size} clients differ): the accountant would "
            "not count what the clients released")
