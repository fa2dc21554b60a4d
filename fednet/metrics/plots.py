"""PNG plots: a run's accuracy vs round, vs simulated time and vs cumulative bytes (three files in
its folder), and `fednet report --plot`: several runs, or a sweep's best settings, overlaid.
Drawn on matplotlib Figures without pyplot: importing this never changes the caller's backend
(a notebook's plt.show() keeps working after fednet.api.run())."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

from fednet.metrics.files import atomic_file
from fednet.metrics.history import read_rows
from fednet.metrics.plot_text import (ADVERSARY, INFO, caption, label_curves, legend, wrap,
                                      describe)
from fednet.metrics.report import run_info

AXES = (("round", "round"), ("sim_time", "simulated time (s)"),
        ("bytes", "traffic on all links (MiB)"))
EPSILON = ("epsilon", "epsilon spent (user-level DP, at the run's delta)")  # --dp runs' own axis


def _cum_bytes(rows: list[dict[str, Any]]) -> list[float]:
    out, tot = [], 0.0
    for r in rows:
        b = r.get("bytes_round", {})
        tot += b.get("server_to_client", 0) + b.get("client_to_server", 0) + b.get("client_to_client", 0)
        out.append(tot / 2**20)
    return out


def _xs(rows: list[dict[str, Any]]) -> dict[str, list[float]]:
    return {"round": [r["round"] + 1 for r in rows], "sim_time": [r["sim_s"] for r in rows],
            "bytes": _cum_bytes(rows),
            "epsilon": [float(r.get("epsilon", math.nan)) for r in rows]}


def _private(rows: list[dict[str, Any]]) -> bool:
    """Every row reports the epsilon spent (a --dp run)."""
    return bool(rows) and all(isinstance(r.get("epsilon"), (int, float)) for r in rows)


def _acc(rows: list[dict[str, Any]]) -> list[float]:
    return [100 * r["accuracy"] if isinstance(r.get("accuracy"), (int, float)) else math.nan
            for r in rows]


def ylabel(evals: set[str]) -> str:
    """'test accuracy (%)' (the global model on the test set), 'mean client accuracy (%)' (each
    client's own model on its own split), or both kinds: 'accuracy (%)'."""
    if evals == {"clients"}:
        return "mean client accuracy (%)"
    return "test accuracy (%)" if evals <= {"global"} else "accuracy (%)"


def plot_formats() -> set[str]:
    """The extensions a plot may have: what matplotlib writes (pgf, which needs LaTeX, left out)."""
    from matplotlib.backend_bases import FigureCanvasBase

    return set(FigureCanvasBase.get_supported_filetypes()) - {"pgf"}


def _save(fig: Any, path: Path) -> None:
    """In the format its extension names (PNG without one; cli/sweep_options.py refuses one
    matplotlib cannot write)."""
    fmt = path.suffix.lower().lstrip(".")
    with atomic_file(path) as fh:  # a failed write keeps the previous plot
        fig.savefig(fh, format=fmt if fmt in plot_formats() else "png", dpi=110)


def plot_run(out: Path, rows: list[dict[str, Any]], title: str = "") -> list[Path]:
    """Write accuracy_vs_round.png, accuracy_vs_sim_time.png, accuracy_vs_bytes.png (and
    accuracy_vs_epsilon.png when the rows report epsilon: --dp); titled with
    the algorithm, dataset, partition, clients, attack and defense of the run's config.toml;
    --target's accuracy a dashed line."""
    info = run_info(out)
    title = title or describe(info) or out.name
    acc, xs, target = _acc(rows), _xs(rows), run_target(out, {})
    paths = []
    for key, label in AXES + ((EPSILON,) if _private(rows) else ()):
        fig = Figure(figsize=(5.5, 3.8), constrained_layout=True)
        a = fig.subplots()
        a.plot(xs[key], acc, marker="o", ms=2.5, lw=1.2, label="accuracy")
        asr = [r.get("attack_success") for r in rows]
        if any(v is not None for v in asr):  # --attack backdoor: its success, same scale
            a.plot(xs[key], [math.nan if v is None else 100 * v for v in asr], ls="--", lw=1.2,
                   color="tab:red", label="attack success (backdoor)")
        if target is not None:
            a.axhline(100 * target, color="0.4", ls="--", lw=0.8,
                      label=f"--target {100 * target:.1f}%")
        if target is not None or any(v is not None for v in asr):
            a.legend(fontsize=8, loc="best")
        a.set_xlabel(label)
        a.set_ylabel(ylabel({info.get("eval", "global")}))
        if key == "round":
            a.xaxis.set_major_locator(MaxNLocator(integer=True))
        a.set_title(wrap(title, 90), fontsize=9)
        a.grid(alpha=0.3)
        path = out / f"accuracy_vs_{key}.png"
        _save(fig, path)
        paths.append(path)
    return paths


def run_target(folder: Path, summary: dict[str, Any]) -> float | None:
    """The accuracy a run made with --target waits for: its summary's `to_target`, else its
    config.toml's --target (a run still going); None without one."""
    t = summary.get("to_target")
    if isinstance(t, dict) and isinstance(t.get("target"), (int, float)):
        return float(t["target"])
    from fednet.config import load_toml
    from fednet.metrics.target import parse_target

    try:
        target = parse_target(str(load_toml(folder / "config.toml").get("target") or ""))
    except Exception:  # noqa: BLE001 -- no config.toml, or a reference run gone: no line
        return None
    return target.accuracy if target else None


_IGNORED = ("seed", "out")  # config keys that do not tell two runs' experiments apart


def _config(folder: Path) -> dict[str, Any]:
    """A run folder's config.toml, flattened ('train.lr': 0.1), without seed and out."""
    from fednet.config import flatten, load_toml

    try:
        return {k: v for k, v in flatten(load_toml(folder / "config.toml")).items()
                if k not in _IGNORED}
    except Exception:  # noqa: BLE001 - no (or an unreadable) config.toml: nothing to group by
        return {}


def _sweep_series(p: Path) -> tuple[list[dict[str, Any]], list[tuple[float, str]]]:
    """Per method of a sweep folder: its best setting over every finished seed."""
    from fednet.metrics import sweep_table as T

    spec, recs = T.load_sweep(p)
    res = T.evaluate(spec, recs)
    metric = T.parse_metric(spec["metric"])
    goal = metric.target(spec.get("reference_accuracy"))
    out = []
    for b in res["best"]:
        cells = [r for r in recs if r["method"] == b["method"]
                 and r["setting"] == b["setting"] and r["status"] in T.RESULTS]
        kept = [(rw, r.get("flag")) for r in cells if (rw := read_rows(p / r["folder"]))]
        if kept:
            label = f"{b['method']} ({b['text']})" if b["text"] != "-" else b["method"]
            out.append({"label": label, "runs": [k[0] for k in kept],
                        "statuses": ["completed"] * len(kept), "flags": [k[1] for k in kept],
                        "info": run_info(p / cells[0]["folder"]), "config": {}})
    return out, [] if goal is None else [(goal, metric.text)]


def _run_series(src: str) -> dict[str, Any]:
    from fednet.metrics.seed_health import seed_flag
    from fednet.metrics.sweep_table import RESULTS, read_summary

    folder = Path(src) if Path(src).is_dir() else Path(src).parent
    info = run_info(folder)
    name, algo = folder.resolve().name, info.get("algorithm", "")
    summary = read_summary(folder) or {}
    status, rows = summary.get("status", "running"), read_rows(folder)
    return {"label": name if not algo or algo in name else f"{name} ({algo})",
            "runs": [rows], "statuses": [status], "info": info,
            "target": run_target(folder, summary),
            "flags": [seed_flag(summary, rows) if status in RESULTS else None],
            "config": _config(folder), "seeds": [info.get("seed", "?")]}


def _group_seeds(series: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Run folders whose configurations differ only in the seed: one curve (their mean)."""
    out: list[dict[str, Any]] = []
    for s in series:
        twin = next((o for o in out if s.get("seeds") and o.get("seeds") and s["config"]
                     and o["config"] == s["config"] and s["seeds"][0] not in o["seeds"]), None)
        if twin is None:
            out.append(s)
            continue
        for k in ("runs", "statuses", "seeds", "flags"):
            twin[k] = twin[k] + s[k]
        twin["label"] = twin["info"].get("algorithm") or twin["label"]
    return out


def _series(sources: list[str]) -> tuple[list[dict[str, Any]], list[tuple[float, str]]]:
    """One curve per run folder (or per group of seeds), and per method of each sweep folder;
    and the accuracies the sweeps' metrics wait for (drawn as lines)."""
    out: list[Any] = []
    targets: list[Any] = []
    for src in sources:
        if (Path(src) / "sweep.json").is_file():
            more, goal = _sweep_series(Path(src))
            out, targets = out + more, targets + goal
        else:
            out.append(_run_series(src))
            if out[-1]["target"] is not None:  # --target: its line, as a sweep's metric's
                targets.append((out[-1]["target"], "--target"))
    return _group_seeds([s for s in out if s["runs"] and s["runs"][0]]), targets


def _draw(axs: Any, panels: list[tuple[str, str]], s: dict[str, Any], color: str,
          targets: list[tuple[float, str]]) -> None:
    """One curve on every panel: the mean over seeds, the seeds' range shaded, a star on each
    target's line at the mean of the seeds' first crossings (the table's value), an x at its
    end when a run did not complete."""
    n = min(len(r) for r in s["runs"])
    accs, xss = [_acc(r[:n]) for r in s["runs"]], [_xs(r[:n]) for r in s["runs"]]
    mean = [sum(a[j] for a in accs) / len(accs) for j in range(n)]
    ends = [j for j in range(n) if math.isfinite(mean[j])]
    for a, (key, _) in zip(axs, panels):
        x = [sum(xs[key][j] for xs in xss) / len(xss) for j in range(n)]
        a.plot(x, mean, lw=1.4, color=color, label=s["label"] if key == "round" else None,
               marker="o" if n <= 30 else None, ms=3, ls=":" if _no_result(s) else "-")
        if len(accs) > 1:
            a.fill_between(x, [min(c[j] for c in accs) for j in range(n)],
                           [max(c[j] for c in accs) for j in range(n)], color=color,
                           alpha=0.15, lw=0)
        for t, _ in set(targets):
            first = _first_reached(s["runs"], key, t)
            if first is not None:
                a.plot([first], [100 * t], marker="*", ms=11, color=color, mec="k", mew=0.6,
                       zorder=5)
        mark = _end_marker(s["statuses"])
        if ends and mark:
            a.plot([x[ends[-1]]], [mean[ends[-1]]], marker=mark, ms=10, color=color, mec="k",
                   mew=0.6, zorder=5)
        _draw_flagged(a, key, s, color)


def _no_result(s: dict[str, Any]) -> bool:
    """Every run of a curve failed, diverged, or completed marked collapsed or diverged: no
    result of the method, drawn dotted."""
    from fednet.metrics.report import NOT_RESULTS

    flags = s.get("flags") or [None] * len(s["statuses"])
    return all(st in NOT_RESULTS or f for st, f in zip(s["statuses"], flags))


def _draw_flagged(a: Any, key: str, s: dict[str, Any], color: str) -> None:
    """A seed marked collapsed or diverged (seed_health.py; * in the table): its own curve
    dotted (a curve of one run: that curve itself), a hollow circle where it ends, so that a
    mean it pulls down is not taken at face value."""
    for rows, flag in zip(s["runs"], s.get("flags") or []):
        if not flag:
            continue
        acc, xs = _acc(rows), _xs(rows)[key]
        if len(s["runs"]) > 1:
            a.plot(xs, acc, ls=":", lw=1.0, color=color)
        ends = [j for j in range(len(rows)) if math.isfinite(acc[j])]
        if ends:
            a.plot([xs[ends[-1]]], [acc[ends[-1]]], marker="o", ms=9, mfc="none", mec=color,
                   mew=1.5, zorder=5)


def _first_reached(runs: list[list[dict[str, Any]]], key: str, target: float) -> float | None:
    """The mean over seeds of each seed's first x at which its accuracy reached the target, over
    the seeds that reached it: the value the sweep's table reports for a *_to metric (not where
    the mean curve crosses, which can be rounds later); None when no seed reached it."""
    firsts = []
    for rows in runs:
        xs = _xs(rows)[key]
        j = next((j for j, r in enumerate(rows) if isinstance(r.get("accuracy"), (int, float))
                  and r["accuracy"] >= target), None)  # the table's own test (sweep_table)
        if j is not None:
            firsts.append(xs[j])
    return sum(firsts) / len(firsts) if firsts else None


def _end_marker(statuses: list[str]) -> str | None:
    """X: a run ended without completing (failed, diverged, interrupted; not one that spent
    its privacy budget); >: one still runs."""
    if any(st not in ("completed", "running", "budget_spent") for st in statuses):
        return "X"
    return ">" if "running" in statuses else None


def _title(series: list[dict[str, Any]], targets: list[tuple[float, str]], panels: list[str],
           log_x: bool) -> str:
    infos = [s["info"] for s in series]
    shared = tuple(k for k in (*INFO, *ADVERSARY) if len({i.get(k) for i in infos}) == 1)
    parts = [d for d in (describe(infos[0], shared),) if d]
    if targets:
        parts.append("dashed: " + ", ".join(f"{100 * t:.1f}% ({m})" for t, m in
                                            sorted(set(targets)))
                     + ", star: the mean of the seeds' first crossings (as tabled)")
    if any(len(s["runs"]) > 1 for s in series):
        parts.append("line: mean over seeds, shaded: their range")
    marks = {_end_marker(s["statuses"]) for s in series}
    if "X" in marks:
        parts.append("x: a run ended there without completing")
    if ">" in marks:
        parts.append("triangle: still running")
    if any(f for s in series for f in s.get("flags") or []):
        parts.append("dotted, hollow circle: a seed marked collapsed or diverged (* in the "
                     "table)")
    from fednet.metrics.report import NOT_RESULTS

    if any(_no_result(s) and set(s["statuses"]) & set(NOT_RESULTS) for s in series):
        parts.append("dotted: a run that failed or diverged (no result)")
    if "sim_time" not in panels:
        parts.append("no simulated time (--latency none)")
    if log_x:
        parts.append("log-scale time and traffic")
    return "; ".join(parts)


SPLIT = (("download_s", "download"), ("client_compute_s", "client compute"),
         ("protocol_s", "protocol compute"), ("upload_s", "upload"), ("server_s", "server"),
         ("wait_s", "waiting"))
"""The parts of a row's sim_split (core/time_split.PARTS), in the order they are stacked."""


def _mean_split(runs: list[list[dict[str, Any]]]) -> dict[str, float]:
    """The simulated seconds of each SPLIT part summed over a run's rows (summary.json's
    time_split), the mean over the runs (seeds) of a curve; {} when no row has a split."""
    from fednet.metrics.target import time_split

    splits = [time_split(rows) for rows in runs]
    splits = [sp for sp in splits if any(k in sp for k, _ in SPLIT)]
    return {k: sum(float(sp.get(k, 0.0)) for sp in splits) / len(splits)
            for k, _ in SPLIT} if splits else {}


def _stack_split(a: Axes, labels: list[str], splits: list[dict[str, float]]) -> None:
    """One horizontal bar per curve: its run's simulated time stacked by where it went."""
    left = [0.0] * len(labels)
    ys = list(range(len(labels)))
    for i, (key, name) in enumerate(SPLIT):
        widths = [sp.get(key, 0.0) for sp in splits]
        a.barh(ys, widths, left=left, color=f"C{i}", label=name, height=0.6)
        left = [x + w for x, w in zip(left, widths)]
    a.set_yticks(ys, [wrap(lab, 28) for lab in labels], fontsize=7)
    a.invert_yaxis()
    a.set_xlabel("simulated time (s), by where it went")
    # below the bars, never over them (one part may fill a whole bar); constrained layout
    # makes room for it
    a.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncols=3,
             frameon=False)
    a.grid(alpha=0.3, axis="x")


def plot_overlay(sources: list[str], path: Path, log_x: bool = False) -> Path:
    """One figure, three panels (accuracy vs round, vs simulated time, vs traffic; two without
    any simulated time), one curve per run, group of seeds or sweep method (_draw); and where a
    run's rows split their simulated time (sim_split), a panel that stacks it per curve
    (download, client compute, protocol compute, upload, server, waiting)."""
    from fednet.errors import ConfigError

    series, targets = _series(sources)
    if not series:
        raise ConfigError("--plot: none of the runs has any rows in metrics.jsonl yet")
    label_curves(series)
    panels = [(k, lab) for k, lab in AXES if k != "sim_time" or any(
        r.get("sim_s") for s in series for rows in s["runs"] for r in rows)]
    if all(_private(rows) for s in series for rows in s["runs"]):  # accuracy against epsilon
        panels.append(EPSILON)
    splits = [_mean_split(s["runs"]) for s in series]
    stacked = any(sum(sp.values()) > 0 for sp in splits)  # a panel of where the time went
    fig = Figure(figsize=(5 * (len(panels) + stacked), 4.4), constrained_layout=True)
    axs = fig.subplots(1, len(panels) + stacked)
    for i, s in enumerate(series):
        _draw(axs, panels, s, f"C{i % 10}", targets)
    if stacked:
        _stack_split(axs[-1], [s["label"] for s in series], splits)
    for a, (key, label) in zip(axs, panels):
        a.set_xlabel(label)
        a.set_ylabel(ylabel({s["info"].get("eval", "global") for s in series}))
        a.grid(alpha=0.3)
        for t, _ in sorted(set(targets)):
            a.axhline(100 * t, color="0.4", ls="--", lw=0.8)
        if key == "round":
            a.xaxis.set_major_locator(MaxNLocator(integer=True))
        elif log_x:
            a.set_xscale("log")
            a.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
            a.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            a.xaxis.set_minor_formatter(NullFormatter())
    title = _title(series, targets, [k for k, _ in panels], log_x)
    caption(fig, title)
    legend(fig, axs[0], len(series))
    _save(fig, path)
    return path


