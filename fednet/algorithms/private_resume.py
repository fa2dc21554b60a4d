"""A DP run's checkpointed state checked at --resume (algorithms/private.py's Privacy asks):
its JSON record (privacy/record.py), the clip norm, the events, the tasks per client, and the
epsilon the state gives against the one its last row reported, so that a resumed run never
reports an epsilon below the truth."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from fednet.privacy import plan, record
from fednet.privacy.accountant import counts_problem
from fednet.privacy.mechanisms import clip_problem

Problem = tuple[str, str] | None  # ('json' or 'npz', one line)


def resume_problem(srv: Any, st: Any, rounds_done: int, participants: Any,
                   last_row: dict[str, Any] | None) -> Problem:
    """The first problem of a checkpointed DP state: its JSON record's types and ranges, the
    clip norm (privacy/mechanisms.clip_problem), the central events (privacy/record.events_problem), the
    tasks per client (accountant.counts_problem), then the epsilon against the last row."""
    cfg, dp = srv.cfg, st.dp
    row = last_row if last_row is not None and last_row.get("round") == rounds_done - 1 else None
    why = record.record_problem(dp)
    if why:
        return "json", why
    why = clip_problem(cfg.dp, dp["clip"], srv.central and cfg.dp.adaptive, rounds_done, row)
    why = why or record.events_problem(cfg, dp["events"], rounds_done)
    if why:
        return "json", why
    why = counts_problem(st.dp_counts, srv.local or srv.sgd, cfg.clients, rounds_done,
                         participants.tasks)
    return ("npz", why) if why else _epsilon_problem(srv, st, rounds_done, row)


def _epsilon_of(srv: Any, st: Any) -> float:
    """Epsilon at the run's delta that a checkpointed state gives (central or local DP)."""
    if srv.central or srv.distributed:
        hist = [(tuple(k), int(c)) for k, c in st.dp["events"]]
        if srv.distributed:  # (the adversary --dp-against names, as the rows report)
            hist = plan.ddg_histories(srv.cfg, hist)[srv.cfg.dp.against]
        return srv.acc.epsilon(hist)
    worst = int(st.dp_counts.max(initial=0))
    return srv.acc.epsilon([(plan.local_key(srv.cfg.dp.noise), worst)])


def _sgd_worst(srv: Any, st: Any) -> float:
    """DP-SGD's worst per-example epsilon over the clients, from their task counts."""
    seen: dict[tuple[float, int], float] = {}
    for cid in np.flatnonzero(st.dp_counts):
        n = int(st.dp_counts[cid])
        q, steps = plan.sgd_steps(srv.info.sizes(int(cid)), srv.cfg.train.batch_size)
        if (q, n * steps) not in seen:
            seen[q, n * steps] = srv.sgd_epsilon(int(cid), n)
    return max(seen.values(), default=0.0)


def _epsilon_problem(srv: Any, st: Any, rounds_done: int,
                     row: dict[str, Any] | None) -> Problem:
    """The epsilon the state gives is never below the one its last round's row reported, and
    DP-SGD's recorded worst epsilon is the one its counts give."""
    def low(got: float, said: Any) -> bool:
        return isinstance(said, float) and math.isfinite(said) and got < said * (1 - 1e-9)
    if srv.acc is not None and row is not None:
        got = _epsilon_of(srv, st)
        if low(got, row.get("epsilon")):
            return ("json" if srv.central or srv.distributed else "npz"), (
                f"the accountant's record gives epsilon {got:.6g} after round {rounds_done}, "
                f"below the {row['epsilon']:.6g} that round's row reported")
    if srv.sgd and srv.info.sizes is not None:
        worst, said = _sgd_worst(srv, st), st.dp["sgd_epsilon"]
        if not math.isclose(worst, said, rel_tol=1e-9, abs_tol=1e-12):
            return "json", (f"algo.dp.sgd_epsilon is {said:.6g}, the clients' task counts give "
                            f"{worst:.6g}")
    return None
