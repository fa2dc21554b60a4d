"""PNG plots: a run's accuracy vs round, vs simulated time and vs cumulative bytes (three files in
its folder), and `fednet report --plot`: several runs, or a sweep's best settings, overlaid."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from fednet.metrics.files import atomic_file  # noqa: E402
from fednet.metrics.history import read_rows  # noqa: E402
from fednet.metrics.report import run_info  # noqa: E402

AXES = (("round", "round"), ("sim_time", "simulated time (s)"),
        ("bytes", "traffic on all links (MiB)"))


def _cum_bytes(rows: list[dict[str, Any]]) -> list[float]:
    out, tot = [], 0.0
    for r in rows:
        b = r.get("bytes_round", {})
        tot += b.get("server_to_client", 0) + b.get("client_to_server", 0) + b.get("client_to_client", 0)
        out.append(tot / 2**20)
    return out


def _xs(rows: list[dict[str, Any]]) -> dict[str, list[float]]:
    return {"round": [r["round"] + 1 for r in rows], "sim_time": [r["sim_s"] for r in rows],
            "bytes": _cum_bytes(rows)}


def _acc(rows: list[dict[str, Any]]) -> list[float]:
    return [100 * r["accuracy"] if isinstance(r.get("accuracy"), (int, float)) else math.nan
            for r in rows]


def ylabel(evals: set[str]) -> str:
    """'test accuracy (%)' (the global model on the test set), 'mean client accuracy (%)' (each
    client's own model on its own split), or both kinds: 'accuracy (%)'."""
    if evals == {"clients"}:
        return "mean client accuracy (%)"
    return "test accuracy (%)" if evals <= {"global"} else "accuracy (%)"


def describe(info: dict[str, str], keys: tuple[str, ...] = ("algorithm", "dataset", "partition",
                                                           "clients")) -> str:
    """'fedavg, digits shards, 100 clients' from run_info (the keys given)."""
    parts = []
    if "algorithm" in keys and info.get("algorithm"):
        parts.append(info["algorithm"])
    data = " ".join(info[k] for k in ("dataset", "partition") if k in keys and info.get(k))
    if data:
        parts.append(data)
    if "clients" in keys and info.get("clients"):
        parts.append(f"{info['clients']} clients")
    return ", ".join(parts)


def _save(fig: Any, path: Path) -> None:
    """PNG, or PDF / SVG by the file's extension."""
    fmt = path.suffix.lower().lstrip(".") if path.suffix.lower() in (".pdf", ".svg") else "png"
    try:
        with atomic_file(path) as fh:  # a failed write keeps the previous plot
            fig.savefig(fh, format=fmt, dpi=110)
    finally:
        plt.close(fig)


def plot_run(out: Path, rows: list[dict[str, Any]], title: str = "") -> list[Path]:
    """Write accuracy_vs_round.png, accuracy_vs_sim_time.png, accuracy_vs_bytes.png; titled with
    the algorithm, dataset, partition and clients of the run's config.toml."""
    info = run_info(out)
    title = title or describe(info) or out.name
    acc, xs = _acc(rows), _xs(rows)
    paths = []
    for key, label in AXES:
        fig, a = plt.subplots(figsize=(5.5, 3.8), constrained_layout=True)
        a.plot(xs[key], acc, marker="o", ms=2.5, lw=1.2)
        a.set_xlabel(label)
        a.set_ylabel(ylabel({info.get("eval", "global")}))
        if key == "round":
            a.xaxis.set_major_locator(MaxNLocator(integer=True))
        a.set_title(title, fontsize=9)
        a.grid(alpha=0.3)
        path = out / f"accuracy_vs_{key}.png"
        _save(fig, path)
        paths.append(path)
    return paths


def _series(sources: list[str]) -> tuple[list[dict[str, Any]], list[tuple[float, str]]]:
    """One curve per run folder, and per method of each sweep folder (its best setting, every
    finished seed); and the accuracies the sweeps' metrics wait for (drawn as lines)."""
    from fednet.metrics import sweep_table as T

    out, targets = [], []
    for src in sources:
        p = Path(src)
        if (p / "sweep.json").is_file():
            spec, recs = T.load_sweep(p)
            res = T.evaluate(spec, recs)
            metric = T.parse_metric(spec["metric"])
            goal = metric.target(spec.get("reference_accuracy"))
            if goal is not None:
                targets.append((goal, metric.text))
            for b in res["best"]:
                cells = [r for r in recs if r["method"] == b["method"]
                         and r["setting"] == b["setting"] and r["status"] in T.RESULTS]
                runs = [rw for r in cells if (rw := read_rows(p / r["folder"]))]
                if runs:
                    n = f", {len(runs)} seeds" if len(runs) > 1 else ""
                    label = f"{b['method']} ({b['text']}{n})" if b["text"] != "-" else \
                        f"{b['method']}{n}"
                    out.append({"label": label, "runs": runs,
                                "info": run_info(p / cells[0]["folder"])})
        else:
            folder = p if p.is_dir() else p.parent
            info = run_info(folder)
            name = folder.resolve().name
            algo = info.get("algorithm", "")
            label = name if not algo or algo in name else f"{name} ({algo})"
            out.append({"label": label, "runs": [read_rows(folder)], "info": info})
    return [s for s in out if s["runs"] and s["runs"][0]], targets


def plot_overlay(sources: list[str], path: Path) -> Path:
    """One PNG, three panels (accuracy vs round, vs simulated time, vs traffic; two without any
    simulated time), one curve per run or sweep method: the mean over seeds, with the range of
    the seeds shaded."""
    from fednet.errors import ConfigError

    series, targets = _series(sources)
    if not series:
        raise ConfigError("--plot: none of the runs has any rows in metrics.jsonl yet")
    if len({s["info"].get("eval", "global") for s in series}) > 1:  # say which is which
        for s in series:
            if s["info"].get("eval") == "clients":
                s["label"] += ", mean client accuracy"
    # no simulated time to show (--latency none in every run): two panels
    panels = [(k, lab) for k, lab in AXES if k != "sim_time" or any(
        r.get("sim_s") for s in series for rows in s["runs"] for r in rows)]
    keys = ("algorithm", "dataset", "partition", "clients")
    differ = [k for k in keys if len({s["info"].get(k) for s in series}) > 1]
    for s in series:  # every key that differs between the runs is named in their labels
        more = [f"{k} {s['info'].get(k)}" for k in differ if str(s["info"].get(k)) not in s["label"]]
        s["label"] += f" [{', '.join(more)}]" if more else ""
    rows = -(-len(series) // 3)  # legend rows, below the panels
    fig, axs = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4.4 + 0.22 * rows),
                            constrained_layout=True)
    for i, s in enumerate(series):
        n = min(len(r) for r in s["runs"])
        if n < max(len(r) for r in s["runs"]):  # seeds of unequal length: said, not hidden
            s["label"] += f", first {n} rounds (the shortest seed)"
        accs = [_acc(r[:n]) for r in s["runs"]]
        xss = [_xs(r[:n]) for r in s["runs"]]
        mean = [sum(a[j] for a in accs) / len(accs) for j in range(n)]
        color = f"C{i % 10}"
        for a, (key, label) in zip(axs, panels):
            x = [sum(xs[key][j] for xs in xss) / len(xss) for j in range(n)]
            a.plot(x, mean, lw=1.4, color=color, label=s["label"] if key == "round" else None,
                   marker="o" if n <= 30 else None, ms=3)
            if len(accs) > 1:
                a.fill_between(x, [min(c[j] for c in accs) for j in range(n)],
                               [max(c[j] for c in accs) for j in range(n)], color=color,
                               alpha=0.15, lw=0)
            for t, _ in set(targets):  # where the mean first reaches each target
                hit = next((j for j in range(n) if mean[j] >= 100 * t), None)
                if hit is not None:
                    a.plot([x[hit]], [mean[hit]], marker="*", ms=11, color=color, mec="k",
                           mew=0.6, zorder=5)
    infos = [s["info"] for s in series]
    shared = {k for k in ("algorithm", "dataset", "partition", "clients")
              if len({i.get(k) for i in infos}) == 1}
    for a, (key, label) in zip(axs, panels):
        a.set_xlabel(label)
        a.set_ylabel(ylabel({i.get("eval", "global") for i in infos}))
        a.grid(alpha=0.3)
        for t, _ in sorted(set(targets)):
            a.axhline(100 * t, color="0.4", ls="--", lw=0.8)
        if key == "round":
            a.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.legend(fontsize=8, loc="outside lower center", ncols=min(len(series), 3))
    title = describe(infos[0], tuple(k for k in ("algorithm", "dataset", "partition", "clients")
                                     if k in shared))
    if targets:
        title += ("; " if title else "") + "dashed: " + ", ".join(
            f"{100 * t:.1f}% ({m})" for t, m in sorted(set(targets))) + ", star: first reached"
    if any(len(s["runs"]) > 1 for s in series):
        title += ("; " if title else "") + "shaded: range over seeds"
    if len(panels) < len(AXES):
        title += ("; " if title else "") + "no simulated time (--latency none)"
    fig.suptitle(title, fontsize=10)
    _save(fig, path)
    return path
