"""summary.json of a run: what the round driver knows at its end (names other tools rely on)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fednet.algorithms.contract import Strategy
from fednet.core.status import RunStatus
from fednet.types import ClientInfo, device_counts
from fednet.config import RunConfig

TRAFFIC = ("server_to_client", "client_to_server", "client_to_client", "tensor_bytes",
           "header_bytes")
"""The totals of the run's traffic (the rest, control and what was refused, counts everything)."""


def run_summary(d: Any, clients: Sequence[ClientInfo], extra: dict[str, Any] | None = None
                ) -> dict[str, Any]:
    """The summary.json dictionary of the driver `d` (core/rounds.RoundDriver): names other
    tools rely on."""
    rows = d.history.rows
    rounds, sim, tot, messages = (d.rounds_done, d.sim_time, d.ledger.totals(), d.ledger.messages)
    if d.status != RunStatus.COMPLETED:  # an interrupted run (or one stopped mid-round): its last
        rounds, sim, tot, messages = d.marks.logged  # finished round's totals, not its tasks
        tot = {**d.ledger.totals(), **{k: v for k, v in tot.items() if k in TRAFFIC}}
    acc = [r["accuracy"] for r in rows]
    out: dict[str, Any] = {
        "algorithm": d.cfg.algo.name, "status": d.status.value, "clients": d.cfg.clients,
        "rounds": rounds, "rounds_planned": d.cfg.rounds,
        "final_accuracy": acc[-1] if acc else None, "best_accuracy": max(acc) if acc else None,
        "final_loss": rows[-1]["loss"] if rows else None,
        "wall_clock_s": d.clock.wall(), "sim_time_s": sim,
        "bytes": {k: tot[k] for k in ("server_to_client", "client_to_server", "client_to_client",
                                      "tensor_bytes", "header_bytes", "control", "rejected")},
        "rejected_messages": tot["rejected_messages"],
        "rejects_sent": {"messages": tot["rejects_sent_messages"],
                         "bytes": tot["rejects_sent"]},
        "messages": messages, "control_messages": tot.get("control_messages", 0),
        **({"bytes_by_stage": st} if (st := d.ledger.stage_totals()) else {}),
        "devices": devices_of(clients),
        "failures": d.failures, "seed": d.cfg.seed,
    }
    if d.clock.segments:  # a resumed run: every segment (rounds [from, to), wall-clock)
        out["segments"] = d.clock.all_segments(d.rounds_done)
    if d.error:
        out["error"] = d.error
    if d.setup_stats:
        out["setup"] = d.setup_stats
    availability = d.churn.summary(d.failures)
    if availability is not None:
        out["availability"] = availability
    out.update(d.network.summary())
    if d.cfg.tuned:  # the defaults the algorithm's tuning chose (registry Spec.tuned)
        out["tuned"] = list(d.cfg.tuned)
    out.update(d.algo.report())  # e.g. differential privacy's `dp`
    if d.cfg.net.secagg != "off":
        out["secagg"] = secagg_summary(d.cfg, rows, st, _model_bytes(d.algo))
    out.update(extra or {})
    return out


def devices_of(clients: Sequence[ClientInfo]) -> dict[str, int]:
    """The clients on each device ({"cuda:0": 50, "cuda:1": 50}): each client's own is in
    clients.jsonl (run folders of older fednet hold a map of every client to its device
    here: metrics/report.device_counts reads both)."""
    return device_counts(clients)


def robust_summary(cfg: RunConfig, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """--attack and --defense in summary.json: the attack, its malicious clients and
    parameters, the defense and its parameters, and the backdoor's final success rate."""
    from fednet.algorithms.robust_spec import malicious_ids

    out: dict[str, Any] = {}
    if cfg.attack.name != "none":
        out["attack"] = {"name": cfg.attack.name, "malicious": malicious_ids(cfg),
                         "malicious_spec": cfg.attack.malicious, "params": dict(cfg.attack.params)}
    if cfg.defense.name != "none":
        out["defense"] = {"name": cfg.defense.name, "params": dict(cfg.defense.params)}
    asr = [r["attack_success"] for r in rows if "attack_success" in r]
    if asr:
        out["final_attack_success"] = asr[-1]
        out["best_attack_success"] = max(asr)
    return out


SECAGG_STAGES = ("keys", "shares", "input", "unmask")


def _model_bytes(algo: Strategy) -> int:
    """The tensor bytes of the server's model: what one client's update is in the clear."""
    try:
        return int(sum(a.nbytes for a in algo.eval_arrays().values()))
    except Exception:  # noqa: BLE001 -- a model never set up: no clear update to compare with
        return 0


def _sum_by_stage(rows: list[dict[str, Any]], key: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for r in rows:
        for stage, v in (r.get(key) or {}).items():
            out[stage] = out.get(stage, 0.0) + float(v)
    return out


def secagg_summary(cfg: RunConfig, rows: list[dict[str, Any]], by_stage: dict[str, dict[str, int]],
                   model_bytes: int) -> dict[str, Any]:
    """--secagg full|plus in summary.json: the protocol and its parameters, the neighbours each
    client had (k), the clients left after each stage, per-stage bytes and CPU seconds over the
    run, the rounds that failed, and the update path's bytes against the clear update's."""
    n, sec = cfg.net, [r for r in rows if "secagg_clients" in r or "secagg_failed" in r]
    ks = sorted({int(r["secagg_neighbours"]) for r in sec
                 if isinstance(r.get("secagg_neighbours"), int)})
    if not ks and n.secagg == "full":  # every other client of the cohort
        ks = sorted({int(r["secagg_clients"][0]) - 1 for r in sec if r.get("secagg_clients")})
    alive = [r.get("secagg_clients") or [] for r in sec]
    tasks, uploads = (sum(a[i] for a in alive if len(a) > i) for i in (2, 3))
    failed = [r for r in sec if r.get("secagg_failed")]
    fbits = sorted({int(r["secagg_field_bits"]) for r in sec if r.get("secagg_field_bits")})
    wbits = sorted({int(r["secagg_wire_bits"]) for r in sec if r.get("secagg_wire_bits")})
    grid = cfg.net.codecs().field  # --compress under --secagg: the codec's common grid
    sent = sum(sum(v.values()) for v in by_stage.values())
    update = sent - model_bytes * tasks  # less the model each input task carries (as in the clear)
    clear = model_bytes * uploads
    return {
        "mode": n.secagg, "neighbours": ks, "neighbours_asked": n.secagg_neighbours,
        "dropout": n.secagg_dropout, "threshold": n.secagg_threshold, "clip": n.secagg_clip,
        "drop": getattr(n, "secagg_drop", ""),  # --secagg-drop's simulated dropouts
        # a value's quantization: --secagg-bits, or the --compress codec's grid (compress/field.py)
        "bits": None if grid.on else n.secagg_bits, "codec": n.compress if grid.on else None,
        "field_bits": fbits, "field_asked": n.secagg_field,
        "wire_bits": wbits,  # bits a masked value travels in (packed; [] : the field's words)
        "rounds": len(sec), "failed_rounds": len(failed),
        "last_failure": ({"round": failed[-1].get("round"), "why": failed[-1]["secagg_failed"]}
                         if failed else None),
        "clients_by_stage": {k: sum(a[i] for a in alive if len(a) > i)  # summed over rounds
                             for i, k in enumerate(("cohort", *SECAGG_STAGES))},
        "bytes_by_stage": {k: by_stage[k] for k in SECAGG_STAGES if k in by_stage},
        "server_cpu_s": _sum_by_stage(sec, "secagg_server_s"),
        "client_cpu_s": _sum_by_stage(sec, "secagg_client_s"),
        "sim_s": _sum_by_stage(sec, "secagg_sim_s"),  # simulated seconds per stage
        "model_bytes": model_bytes, "input_tasks": tasks, "uploads": uploads,
        "update_bytes": update, "clear_bytes": clear,
        "overhead": update / clear if clear else None,
    }
