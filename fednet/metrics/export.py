"""CSV exports: a sweep's cells (sweep.csv), the table a report prints (`fednet report --csv`:
one line per run folder and per sweep setting, with the statistics over seeds), and the curves
behind its plots (`fednet report --curves`: one line per run and round)."""
from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import Any

from fednet.metrics.history import read_rows
from fednet.metrics.seed_health import flag_text, folder_flag

CELL_KEYS = ("status", "value", "final_accuracy", "best_accuracy", "rounds", "sim_time_s",
             "wall_clock_s", "seconds")
TABLE_KEYS = ("source", "kind", "method", "setting", "best", "status", "metric", "mean", "ci_lo",
              "ci_hi", "sd", "min", "max", "reached", "planned", "final_accuracy",
              "best_accuracy", "rounds", "sim_time_s", "wall_clock_s", "baseline", "vs_baseline",
              "vs_lo", "vs_hi", "p", "pairs", "flagged", "client_epochs", "samples", "target",
              "target_reached", "to_target_rounds", "to_target_client_epochs",
              "to_target_samples", "to_target_sim_s", "to_target_wall_s", "to_target_bytes",
              "to_target_bytes_down", "to_target_bytes_up", "to_target_bytes_peer", "attack",
              "defense", "secagg", "secagg_neighbours", "secagg_field_bits", "secagg_failed_rounds",
              "secagg_overhead")
CURVE_KEYS = ("source", "method", "setting", "seed", "status", "round", "accuracy", "loss",
              "sim_s", "wall_s", "bytes_total", "bytes_server_to_client", "bytes_client_to_server",
              "bytes_client_to_client")


def _csv(v: object) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return ""
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def export_table(rows: list[list[Any]]) -> str:
    """table_csv's header and these lines."""
    return _write(TABLE_KEYS, rows)


def _write(header: tuple[str, ...] | list[str], rows: list[list[Any]]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header)
    w.writerows([[_csv(v) for v in r] for r in rows])
    return buf.getvalue()


def cells_csv(records: list[dict[str, Any]], axes: list[str], shows: list[str]) -> str:
    """sweep.csv: one line per cell (flag: why a finished cell is marked collapsed or diverged,
    metrics/seed_health.py)."""
    rows = [[r["name"], r["method"], *[r["setting"].get(a, "") for a in axes], r["seed"],
             *[r.get(k) for k in CELL_KEYS], *[r["show"].get(k) for k in shows],
             flag_text(r.get("flag")), r["folder"]]
            for r in records]
    return _write(["cell", "method", *axes, "seed", *CELL_KEYS, *shows, "flag", "folder"], rows)


def _setting_row(src: str, spec: dict[str, Any], s: dict[str, Any], best: bool) -> list[Any]:
    ci = s.get("ci") or (None, None)
    v = s.get("versus") or {}
    base = spec.get("baseline") if v else None
    return [src, "sweep", s["method"], s["text"], int(best), "", spec["metric"], s["mean"],
            ci[0], ci[1], s["sd"], s["min"], s["max"], s["reached"], s["planned"],
            s["final_accuracy"], None, None, None, None, base, v.get("estimate"), v.get("lo"),
            v.get("hi"), v.get("p"), v.get("pairs"), _flagged(s.get("flagged")),
            *[None] * (len(TABLE_KEYS) - TABLE_KEYS.index("flagged") - 1)]  # a run's (_run_costs)


def _flagged(flagged: dict[str, str] | None) -> str:
    """'seed 2: collapsed: ...; seed 4: diverged: ...' (the seeds a table marks)."""
    return "; ".join(f"seed {k}: {v}" if k != "" else v for k, v in (flagged or {}).items())


def _run_row(folder: str, s: dict[str, Any]) -> list[Any]:
    acc = s.get("final_accuracy")
    row = {"source": folder, "kind": "run", "method": s.get("algorithm"), "setting": "-",
           "best": 1, "status": s.get("status"), "metric": "final_accuracy", "mean": acc,
           "reached": int(isinstance(acc, (int, float))
                          and s.get("status") in ("completed", "budget_spent")),
           "planned": 1}
    row.update({k: s.get(k) for k in ("final_accuracy", "best_accuracy", "rounds", "sim_time_s",
                                      "wall_clock_s")})
    if s.get("status") in ("completed", "budget_spent"):
        p = Path(folder)
        row["flagged"] = flag_text(folder_flag(p if p.is_dir() else p.parent, s))
    row.update(_run_costs(s))
    return [row.get(k) for k in TABLE_KEYS]


def _run_costs(s: dict[str, Any]) -> dict[str, Any]:
    """A run's client compute, its cost to --target (the printed table's `to target` rows), what
    attack, defense and secure aggregation ran."""
    from fednet.metrics.what_ran import with_params

    c, t = s.get("compute") or {}, s.get("to_target")
    out = {"client_epochs": c.get("client_epochs"), "samples": c.get("samples")}
    if isinstance(t, dict):
        b = t.get("bytes") or {}
        out.update({"target": t.get("target"), "target_reached": int(bool(t.get("reached"))),
                    "to_target_rounds": t.get("rounds"),
                    "to_target_client_epochs": t.get("client_epochs"),
                    "to_target_samples": t.get("samples"), "to_target_sim_s": t.get("sim_s"),
                    "to_target_wall_s": t.get("wall_s"), "to_target_bytes": b.get("total"),
                    "to_target_bytes_down": b.get("server_to_client"),
                    "to_target_bytes_up": b.get("client_to_server"),
                    "to_target_bytes_peer": b.get("client_to_client")})
    for k in ("attack", "defense"):
        if isinstance(s.get(k), dict):
            out[k] = with_params(s[k].get("name"), s[k].get("params"))
    sa = s.get("secagg")
    if isinstance(sa, dict):
        out.update({"secagg": sa.get("mode"),
                    "secagg_neighbours": "/".join(map(str, sa.get("neighbours") or [])),
                    "secagg_field_bits": "/".join(map(str, sa.get("field_bits") or [])),
                    "secagg_failed_rounds": sa.get("failed_rounds"),
                    "secagg_overhead": sa.get("overhead")})
    return out


def table_csv(paths: list[str]) -> str:
    """What `fednet report` prints, as CSV: a line per run folder, and per setting of each sweep
    folder (best = 1 on each method's best setting, which carries the comparison with the
    sweep's baseline)."""
    from fednet.metrics import sweep_table as T
    from fednet.metrics.report import load_summary

    rows: list[list[Any]] = []
    for p in paths:
        if (Path(p) / "sweep.json").is_file():
            spec, recs = T.load_sweep(Path(p))
            rows += sweep_rows(p, spec, T.evaluate(spec, recs))
        else:
            rows.append(_run_row(p, load_summary(p)))
    return _write(TABLE_KEYS, rows)


def sweep_rows(src: str, spec: dict[str, Any], result: dict[str, Any]) -> list[list[Any]]:
    """A sweep's lines of table_csv, from its evaluated result (sweep_table.evaluate)."""
    best = {(b["method"], b["text"]): b for b in result["best"]}
    return [_setting_row(src, spec, best.get((s["method"], s["text"]), s),
                         (s["method"], s["text"]) in best) for s in result["settings"]]


def _curve(src: str, method: str, setting: str, seed: Any, status: Any,
           rows: list[dict[str, Any]]) -> list[list[Any]]:
    out, tot = [], [0, 0, 0]
    for r in rows:
        b = r.get("bytes_round") or {}
        for i, k in enumerate(("server_to_client", "client_to_server", "client_to_client")):
            tot[i] += b.get(k, 0) or 0
        out.append([src, method, setting, seed, status, r.get("round"), r.get("accuracy"),
                    r.get("loss"), r.get("sim_s"), r.get("wall_s"), sum(tot), *tot])
    return out


def curves_csv(paths: list[str]) -> str:
    """Every round of every run folder and of every finished cell of each sweep folder
    (cumulative bytes), one line each: the data behind `--plot`."""
    from fednet.metrics import sweep_table as T
    from fednet.metrics.report import run_info

    rows: list[list[Any]] = []
    for p in paths:
        if (Path(p) / "sweep.json").is_file():
            _, recs = T.load_sweep(Path(p))
            for r in recs:
                rows += _curve(p, r["method"], T.setting_text(r["setting"]), r["seed"],
                               r["status"], read_rows(Path(p) / r["folder"]))
        else:
            folder = Path(p) if Path(p).is_dir() else Path(p).parent
            info = run_info(folder)
            s = T.read_summary(folder) or {}
            rows += _curve(p, info.get("algorithm", ""), "-", info.get("seed", ""),
                           s.get("status", "running"), read_rows(folder))
    return _write(CURVE_KEYS, rows)
