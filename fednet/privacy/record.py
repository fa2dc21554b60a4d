"""A DP run's checkpointed record checked at --resume (the server state's `dp`, JSON): its
types and ranges, and its events against the run's mechanism and noise (privacy/plan.py makes
the events; algorithms/private.py checks a state with these)."""
from __future__ import annotations

import math
from typing import Any

from fednet.privacy import EVENTS, kind
from fednet.privacy.plan import central_key, cohort_size, ddg_threshold, piece_key


def _finite(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def record_problem(dp: object) -> str:
    """Why a checkpoint's DP record (the server state's `dp`, JSON) is not one (one line), or
    '': an object with a finite clip norm above 0, a finite DP-SGD epsilon >= 0, a count of
    non-finite results >= 0 and a list of [event, count >= 1] pairs."""
    if not isinstance(dp, dict) or not all(k in dp for k in ("clip", "events", "sgd_epsilon")):
        return "algo.dp must be an object with clip, events and sgd_epsilon"
    if not (_finite(dp["clip"]) and dp["clip"] > 0):
        return f"algo.dp.clip must be a finite clip norm above 0 (got {dp['clip']!r})"
    if not (_finite(dp["sgd_epsilon"]) and dp["sgd_epsilon"] >= 0):
        return f"algo.dp.sgd_epsilon must be a finite number >= 0 (got {dp['sgd_epsilon']!r})"
    bad = dp.get("non_finite", 0)
    if not (isinstance(bad, int) and not isinstance(bad, bool) and bad >= 0):
        return f"algo.dp.non_finite must be a whole number >= 0 (got {bad!r})"
    if not isinstance(dp["events"], list) or not all(
            isinstance(e, list) and len(e) == 2 and isinstance(e[0], list) and isinstance(e[1], int)
            and not isinstance(e[1], bool) and e[1] >= 1 for e in dp["events"]):
        return "algo.dp.events must be a list of [event, count >= 1] pairs"
    return ""


def event_of_run(cfg: Any, key: list[Any]) -> bool:
    """Whether `key` is an event this run's central DP records: its sampling, rate and noise
    (central_key; a fixed-size cohort of a population of 1 to --clients)."""
    dp, q = cfg.dp, cfg.algo.fraction
    if dp.mode in EVENTS or (key and key[0] == "piece"):  # a plugin's: its name, z and q
        return dp.mode in EVENTS and tuple(key) == piece_key(dp.mode, dp.noise, q)
    if kind(cfg.dp.mode) == "distributed":  # ("ddg", z, t, k, d): this run's z and t, t <= k <= clients
        ints = all(isinstance(v, int) and not isinstance(v, bool) for v in key[2:])
        return (len(key) == 5 and key[0] == "ddg" and key[1] == float(dp.noise) and ints
                and key[2] == ddg_threshold(cfg) and key[2] <= key[3] <= cfg.clients
                and key[4] >= 1)
    if dp.sampling == "poisson":
        return tuple(key) == central_key("poisson", dp.noise, q, cfg.clients, 0)
    n = key[1] if len(key) == 4 else None
    if not (isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= cfg.clients):
        return False
    return tuple(key) == central_key("fixed", dp.noise, q, n, cohort_size(q, n))


def events_problem(cfg: Any, events: list[Any], rounds_done: int) -> str:
    """Why a checkpoint's events (record_problem checked them) are not this run's after
    `rounds_done` rounds (one line), or '': central DP records one event a round done, each of
    this run's mechanism and noise; local DP and DP-SGD record none."""
    if kind(cfg.dp.mode) not in ("central", "distributed"):
        return "" if not events else (f"algo.dp.events: --dp {cfg.dp.mode} records no central "
                                      f"events (got {len(events)})")
    total = sum(c for _, c in events)
    if total != rounds_done:
        return (f"algo.dp.events account for {total} rounds, the checkpoint has done "
                f"{rounds_done} (each round is one event of the accountant)")
    dp = cfg.dp
    want = (("ddg", dp.noise, ddg_threshold(cfg), "k", "d") if kind(cfg.dp.mode) == "distributed" else
            piece_key(dp.mode, dp.noise, cfg.algo.fraction) if kind(cfg.dp.mode) == "central" and
            dp.mode != "central" else
            central_key("poisson", dp.noise, cfg.algo.fraction, 0, 0) if
            dp.sampling == "poisson" else ("fixed", "N", "m", dp.noise / 2))
    for key, _ in events:
        if not event_of_run(cfg, key):
            return (f"algo.dp.events holds {key}, not an event of this run's mechanism and "
                    f"noise ({list(want)})")
    return ""
