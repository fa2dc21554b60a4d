"""summary.json of a run: what the round driver knows at its end (names other tools rely on)."""
from __future__ import annotations

from typing import Any

from fednet.types import ClientInfo


def run_summary(d: Any, clients: list[ClientInfo], extra: dict[str, Any] | None = None
                ) -> dict[str, Any]:
    """The summary.json dictionary of the driver `d` (core/rounds.RoundDriver): names other
    tools rely on."""
    rows = d.history.rows
    tot = d.ledger.totals()
    acc = [r["accuracy"] for r in rows]
    out: dict[str, Any] = {
        "algorithm": d.cfg.algo.name, "status": d.status, "clients": d.cfg.clients,
        "rounds": d.rounds_done, "rounds_planned": d.cfg.rounds,
        "final_accuracy": acc[-1] if acc else None, "best_accuracy": max(acc) if acc else None,
        "final_loss": rows[-1]["loss"] if rows else None,
        "wall_clock_s": d.wall(), "sim_time_s": d.sim_time,
        "bytes": {k: tot[k] for k in ("server_to_client", "client_to_server", "client_to_client",
                                      "tensor_bytes", "header_bytes", "control", "rejected")},
        "rejected_messages": tot["rejected_messages"],
        "rejects_sent": {"messages": tot["rejects_sent_messages"],
                         "bytes": tot["rejects_sent"]},
        "messages": d.ledger.messages,
        "devices": {str(c.cid): c.device for c in sorted(clients, key=lambda c: c.cid)},
        "failures": d.failures, "seed": d.cfg.seed,
    }
    if d.segments:  # a resumed run: every segment (rounds [from, to), wall-clock)
        out["segments"] = [*d.segments, d.segment()]
    if d.error:
        out["error"] = d.error
    if d.setup_stats:
        out["setup"] = d.setup_stats
    if d.churn is not None:
        out["availability"] = d.churn.summary(d.failures)
    if d.network is not None:
        out.update(d.network.summary())
    if d.cfg.tuned:  # the defaults the algorithm's tuning chose (registry Spec.tuned)
        out["tuned"] = list(d.cfg.tuned)
    out.update(extra or {})
    return out
