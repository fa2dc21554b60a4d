"""Text tables: the end-of-run summary and `fednet report` (runs side by side)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fednet.errors import ConfigError
from fednet.metrics.paper import Part, Table
from fednet.metrics.progress import human_bytes, human_count, table
from fednet.metrics.what_ran import adversary_info, privacy_rows, robust_rows, secagg_rows


def _fmt(v: Any, kind: str = "") -> str:
    if v is None:
        return "-"
    if kind == "bytes":
        return human_bytes(float(v))
    if kind == "pct":
        return f"{100 * float(v):.2f}%"
    if kind == "s":
        return f"{float(v):.2f}s"
    return str(v)


def run_info(folder: str | Path | None) -> dict[str, str]:
    """What a run folder's config.toml says about the experiment: algorithm, dataset, partition,
    clients, and what the run resolved at its start (run.json): the model built (summary.json's
    once the run ended) and the evaluation (global: the server's model on the test set;
    clients: each client's own model on its own split). A folder of a fednet older than
    run.json shows --model as given ('auto' as the dataset's default) and no evaluation. {}
    without a config.toml."""
    if folder is None:
        return {}
    try:
        from fednet.config import RunConfig, from_dict, load_toml, merge

        cfg = from_dict(merge(RunConfig().to_dict(), load_toml(Path(folder) / "config.toml")))
    except Exception:  # noqa: BLE001 -- a folder without (or with an old) config.toml
        return {}
    d = cfg.data
    part = {"dirichlet": f"dirichlet(alpha={d.alpha:g})"}.get(d.partition, d.partition)
    if d.partition == "dirichlet" and d.alpha == 0:
        part = "shards"
    fedprox = d.dataset == "synthetic-fedprox"  # FedProx's Synthetic(alpha, beta)
    f = Path(folder)
    mode = _recorded(f, "run.json", "eval")
    return {**adversary_info(cfg), "algorithm": cfg.algo.name, "dataset": d.dataset + (
                f"({d.synthetic_alpha:g},{d.synthetic_beta:g})" if fedprox else ""),
            "partition": part + (", permuted labels" if d.permute else ""),
            "clients": str(cfg.clients),
            "model": (_recorded(f, "summary.json", "model") or _recorded(f, "run.json", "model")
                      or _concrete(cfg.train.model, d.dataset)),
            **({"eval": mode} if mode else {}), "seed": str(cfg.seed)}


def _recorded(folder: Path, name: str, key: str) -> str | None:
    """A value the run wrote into its folder's `name` (run.json at its start, summary.json at
    its end): the model built (auto resolved, a plugin dataset's default too), the evaluation
    mode; None where the file or the key is not there (yet, or from an older fednet)."""
    try:
        v = json.loads((folder / name).read_text()).get(key)
    except (OSError, ValueError, AttributeError):
        return None
    return v if isinstance(v, str) and v != "auto" else None


def _concrete(model: str, dataset: str) -> str:
    """'auto' -> the model it stands for on this dataset (models/nets.AUTO_MODELS, read from its
    source: importing it would import torch)."""
    if model != "auto":
        return model
    import ast
    import importlib.util

    try:
        spec = importlib.util.find_spec("fednet")
        assert spec is not None and spec.origin is not None
        tree = ast.parse((Path(spec.origin).parent / "models" / "nets.py").read_text())
        for node in tree.body:
            if (isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
                    and node.targets[0].id == "AUTO_MODELS"):
                return str(ast.literal_eval(node.value).get(dataset, model))
    except (OSError, SyntaxError, ValueError, AssertionError):
        pass
    return model


NOT_RESULTS = ("failed", "diverged", "error")  # runs whose accuracy is no result of the method
EVAL_TEXT = {"global": "global model, test set", "clients": "each client's model, own split"}


def summary_rows(s: dict[str, Any], info: dict[str, str] | None = None) -> list[tuple[str, str]]:
    """(label, value) pairs describing one run's summary (info: run_info of its folder; by
    default that of the summary's own `out`)."""
    info = run_info(s.get("out")) if info is None else info
    b = s.get("bytes", {})
    tb = b.get("tensor_bytes") or 0
    wire = (b.get("server_to_client", 0) + b.get("client_to_server", 0) + b.get("client_to_client", 0))
    status = s.get("status")
    bad = f" ({status}: not a result)" if status in NOT_RESULTS else ""  # marked, never tabled
    rows = [
        ("algorithm", _fmt(s.get("algorithm"))),
        *[(k, info[k]) for k in ("dataset", "partition", "model") if k in info],
        *([("evaluation", EVAL_TEXT.get(info["eval"], info["eval"]))] if "eval" in info else []),
        ("status", _fmt(s.get("status"))),
        ("clients", _fmt(s.get("clients"))),
        ("rounds", f"{s.get('rounds')}/{s.get('rounds_planned', s.get('rounds'))}"),
        ("final accuracy", _fmt(s.get("final_accuracy"), "pct") + bad),
        ("best accuracy", _fmt(s.get("best_accuracy"), "pct") + bad),
        *robust_rows(s),
        ("wall-clock", _fmt(s.get("wall_clock_s"), "s")),
        ("simulated time", _fmt(s.get("sim_time_s"), "s")),
        ("server -> client", _fmt(b.get("server_to_client"), "bytes")),
        ("client -> server", _fmt(b.get("client_to_server"), "bytes")),
        ("client -> client", _fmt(b.get("client_to_client"), "bytes")),
        ("tensor bytes (minimum)", _fmt(tb, "bytes")
         + (" (masked vectors counted)" if isinstance(s.get("secagg"), dict) else "")),
        ("wire / minimum", f"{wire / tb:.4f}" if tb else "-"),
        ("control traffic", _fmt(b.get("control"), "bytes")),
        *_cost_rows(s),
    ]
    link = s.get("server_link")
    if link:  # --server-bandwidth (and --deadline/--over-select: stragglers)
        rate = link.get("rate_Bps")
        rows.append(("server link busy", _fmt(link.get("busy_s"), "s")
                     + f" at {rate * 8 / 1e6:g} Mbit/s"))
    if "stragglers" in s:
        rows.append(("stragglers", str(s["stragglers"])))
    rows += secagg_rows(s.get("secagg"), s.get("rounds"))
    rows += privacy_rows(s.get("dp") or {})
    if s.get("ready_s") is not None:
        rows.append(("clients ready after", _fmt(s.get("ready_s"), "s")))
    if s.get("server_peak_rss_bytes"):
        label = "server peak memory" if s.get("runtime") != "local" else "peak memory (RSS)"
        rows.append((label, _fmt(s.get("server_peak_rss_bytes"), "bytes")))
    if s.get("client_pss_bytes"):
        rows.append(("client memory (PSS)", _fmt(s.get("client_pss_bytes"), "bytes")))
    counts = device_counts(s)
    if counts:
        rows.append(("devices", ", ".join(f"{d} x{n}" for d, n in sorted(counts.items()))))
    if s.get("failures"):
        rows.append(("failures", str(len(s["failures"]))))
    if s.get("error"):  # why a failed, diverged or broken run ended
        rows.append(("error", str(s["error"])[:100] + ("..." if len(str(s["error"])) > 100 else "")))
    return rows


def _compute(c: dict[str, Any]) -> str:
    secs = c.get("client_compute_s")
    return (f"{_fmt(c.get('client_epochs'))} client-epochs, "
            f"{human_count(float(c.get('samples') or 0))} samples"
            + (f", {secs:.3g} s simulated (client-seconds)" if secs else ""))


SPLIT_NAMES = (("download_s", "download"), ("client_compute_s", "client compute"),
               ("protocol_s", "protocol"), ("upload_s", "upload"), ("server_s", "server"),
               ("wait_s", "waiting"))


def _split(split: dict[str, Any]) -> str:
    """A time split (summary.json's time_split) as one line of seconds."""
    return ", ".join(f"{name} {float(split.get(k, 0.0)):.3g}" for k, name in SPLIT_NAMES) + " s"


def _split_rows(s: dict[str, Any]) -> list[tuple[str, str]]:
    """The simulated time's split (core/time_split.py), and per stage of secure aggregation."""
    t = s.get("time_split")
    if not isinstance(t, dict) or not t:
        return []
    rows = [("time split", _split(t))]
    for stage, split in (t.get("by_stage") or {}).items():
        rows.append((f"  stage {stage}", _split(split)))
    return rows


def _cost_rows(s: dict[str, Any]) -> list[tuple[str, str]]:
    """The run's client compute (summary.json's `compute`), the simulated time's split and,
    with --target, what reaching the target cost (`to_target`; '-' where it was not reached)."""
    rows = [("client compute", _compute(s["compute"]))] if s.get("compute") else []
    server = (s.get("compute") or {}).get("server_compute_s")
    rows += [("server compute", f"{server:.3g} s simulated")] if server else []
    rows += _split_rows(s)
    t = s.get("to_target")
    if not isinstance(t, dict):
        return rows
    ref = t.get("reference") or {}
    goal = f"accuracy >= {_fmt(t.get('target'), 'pct')}" + (
        f" ({ref.get('fraction'):g} x {_fmt(ref.get('best_accuracy'), 'pct')}, the best of "
        f"{ref.get('run')})" if ref else "")
    rows.append(("target", goal))
    if not t.get("reached"):
        return rows + [("to target: rounds", "not reached")]
    b = t.get("bytes") or {}
    return rows + [
        ("to target: rounds", _fmt(t.get("rounds"))),
        ("to target: client compute", _compute(t)),
        ("to target: simulated time", _fmt(t.get("sim_s"), "s")),
        ("to target: wall-clock", _fmt(t.get("wall_s"), "s")),
        ("to target: bytes", f"{_fmt(b.get('total'), 'bytes')} (down "
         f"{_fmt(b.get('server_to_client'), 'bytes')}, up {_fmt(b.get('client_to_server'), 'bytes')}"
         f", peer {_fmt(b.get('client_to_client'), 'bytes')})"),
    ]


def summary_table(s: dict[str, Any]) -> str:
    """The end-of-run table for one summary."""
    return table(["", "value"], [[k, v] for k, v in summary_rows(s)])


def running_summary(folder: Path) -> dict[str, Any] | None:
    """What a run folder without summary.json shows so far (its metrics.jsonl: rows are written
    as the run goes), as status `running`; None without rows. A run killed before its summary
    looks the same: the status says `running (no summary.json yet)`."""
    from fednet.metrics.history import read_rows

    rows = [r for r in read_rows(folder)
            if not r.get("interim") and isinstance(r.get("round"), int)]
    if not rows:
        return None
    acc = [r["accuracy"] for r in rows if isinstance(r.get("accuracy"), (int, float))]
    try:
        from fednet.config import load_toml
        planned = load_toml(folder / "config.toml").get("rounds")
    except Exception:  # noqa: BLE001 - no (or an old) config.toml: the rounds so far
        planned = None
    info = run_info(folder)
    return {"status": "running (no summary.json yet)", "rounds": rows[-1]["round"] + 1,
            "algorithm": info.get("algorithm"), "clients": info.get("clients"),
            "rounds_planned": planned if isinstance(planned, int) else rows[-1]["round"] + 1,
            "final_accuracy": acc[-1] if acc else None, "best_accuracy": max(acc) if acc else None,
            "wall_clock_s": rows[-1].get("wall_s"), "sim_time_s": rows[-1].get("sim_s"),
            "out": str(folder)}


def load_summary(run: str | Path) -> dict[str, Any]:
    """summary.json of a run folder (or the file itself), or what a run in progress shows so
    far (running_summary); ConfigError when neither is there."""
    p = Path(run)
    f = p / "summary.json" if p.is_dir() else p
    if not f.exists():
        partial = running_summary(p) if p.is_dir() else None
        if partial is not None:
            return partial
        raise ConfigError(f"'{run}' has no summary.json; give a run folder such as runs/<name>")
    try:
        s = json.loads(f.read_bytes().decode("utf-8"))
    except OSError as e:
        raise ConfigError(f"cannot read '{f}': {e.strerror or e}") from None
    except ValueError as e:
        raise ConfigError(f"'{f}' is not valid JSON ({e})") from None
    if not isinstance(s, dict):
        raise ConfigError(f"'{f}' is not a run summary (a JSON object)")
    return s


def compare(runs: list[str]) -> str:
    """Runs side by side: one column per run, one row per label any of them has."""
    t = compare_table(runs)
    return table(t.headers, t.rows)


def compare_table(runs: list[str]) -> Table:
    """compare's cells (also for --latex and --markdown)."""
    sums = [load_summary(r) for r in runs]
    folders = [Path(r) if Path(r).is_dir() else Path(r).parent for r in runs]
    cols = [_marked(summary_rows(s, run_info(f)), s, f) for s, f in zip(sums, folders)]
    labels: list[str] = []
    for c in cols:  # the union, each new label placed after the one before it in its run
        at = 0
        for lab, _ in c:
            if lab in labels:
                at = labels.index(lab) + 1
            else:
                labels.insert(at, lab)
                at += 1
    rows = [[lab] + [dict(c).get(lab, "-") for c in cols] for lab in labels]
    headers = ["run"] + [Path(r).name or str(r) for r in runs]
    return Table("runs side by side:", headers, rows)


def report(paths: list[str]) -> str:
    """`fednet report`: run folders side by side; each sweep folder (sweep.json) as its table."""
    from fednet.metrics import sweep_table as T

    runs = [p for p in paths if not (Path(p) / "sweep.json").is_file()]
    parts = [compare(runs)] if runs else []
    for p in paths:
        if p not in runs:
            spec, recs = T.load_sweep(Path(p))
            parts.append(f"sweep {p}:\n" + T.render(spec, T.evaluate(spec, recs)))
    return "\n\n".join(parts)


def _marked(rows: list[tuple[str, str]], s: dict[str, Any], folder: Path
            ) -> list[tuple[str, str]]:
    """A completed run that collapsed or diverged (metrics/seed_health.py): a `marked` row after
    its status, saying why."""
    from fednet.metrics.seed_health import flag_text, folder_flag

    flag = folder_flag(folder, s) if s.get("status") in ("completed", "budget_spent") else None
    if not flag:
        return rows
    at = next((i + 1 for i, (lab, _) in enumerate(rows) if lab == "status"), len(rows))
    return rows[:at] + [("marked", flag_text(flag))] + rows[at:]


def report_parts(paths: list[str]) -> list[Part]:
    """What `fednet report` prints, as tables for --latex and --markdown: the runs side by
    side, then each sweep's tables (the same cells as on the console)."""
    from fednet.metrics import sweep_table as T

    runs = [p for p in paths if not (Path(p) / "sweep.json").is_file()]
    parts = [Part([], [compare_table(runs)])] if runs else []
    for p in paths:
        if p not in runs:
            spec, recs = T.load_sweep(Path(p))
            part = T.sweep_tables(spec, T.evaluate(spec, recs))
            parts.append(Part([f"sweep {p}", *part.head], part.tables, part.tail))
    return parts


def device_counts(s: dict[str, Any]) -> dict[str, int]:
    """summary.json's clients per device: {device: count}, or (older run folders) a map of
    every client id to its device, counted here."""
    devices = s.get("devices") or {}
    if all(isinstance(v, int) and not isinstance(v, bool) for v in devices.values()):
        return {str(d): int(n) for d, n in devices.items()}
    counts: dict[str, int] = {}
    for d in devices.values():
        counts[str(d)] = counts.get(str(d), 0) + 1
    return counts
