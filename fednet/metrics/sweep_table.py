"""What a sweep found: each cell's metric, each setting's mean and spread over seeds, the best
setting per method, and the tables (text, CSV) of `fednet sweep` and `fednet report SWEEP`."""
from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fednet.errors import ConfigError
from fednet.metrics.progress import human_bytes, human_count
from fednet.metrics.history import read_rows
from fednet.metrics.intervals import fmt_p, fmt_versus, mean_ci, versus
from fednet.metrics.paper import MARK, Part, Table
from fednet.metrics.seed_health import flag_text, folder_flag

FINISHED = ("completed", "diverged", "budget_spent")  # a cell that ended so is not run again
RESULTS = ("completed", "budget_spent")  # (deterministic); tabled; the others: in the notes
_ACC = ("final_accuracy", "best_accuracy")
_ASR = ("final_attack_success",)  # --attack backdoor's success rate: lower is better
_READ = _ACC + _ASR  # read from summary.json
_TO = {"rounds_to": "round", "sim_to": "sim_s", "bytes_to": "bytes_total", "wall_to": "wall_s",
       "epochs_to": "client_epochs", "samples_to": "samples"}  # (the row's key)
METRIC_HELP = ("final_accuracy, best_accuracy, final_attack_success (--attack backdoor; lower is "
               "better), or rounds_to:X, sim_to:X, bytes_to:X, wall_to:X, epochs_to:X, "
               "samples_to:X (rounds, simulated seconds, bytes, wall-clock seconds, "
               "client-epochs or samples trained until the accuracy first reaches X, setup "
               "stages included; X x the reference accuracy with --reference)")


@dataclass(frozen=True)
class Metric:
    """final_accuracy / best_accuracy (higher is better) or KIND_to:X (lower is better)."""

    kind: str
    x: float | None = None

    @property
    def text(self) -> str:
        return self.kind if self.x is None else f"{self.kind}:{self.x:g}"

    @property
    def higher(self) -> bool:
        return self.kind in _ACC

    @property
    def difference(self) -> bool:
        """Compared with a baseline by the difference (accuracies, attack success), not a
        ratio (the *_to metrics)."""
        return self.kind in _READ

    @property
    def bounds(self) -> tuple[float, float]:
        """The metric's possible range (its interval is clipped to it): a rate in [0, 1], a
        number of rounds, seconds or bytes >= 0."""
        return (0.0, 1.0) if self.kind in _READ else (0.0, math.inf)

    def target(self, ref: float | None) -> float | None:
        """The accuracy a *_to metric waits for."""
        return None if self.x is None else self.x * (ref if ref is not None else 1.0)

    def of(self, summary: dict[str, Any], rows: list[dict[str, Any]], ref: float | None
           ) -> float | None:
        """This metric for one finished run (None: not reached, or no accuracy)."""
        if self.kind in _READ:
            v = summary.get(self.kind)
            return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None
        target, key = self.target(ref), _TO[self.kind]
        i = None if target is None else first_reaching(rows, target)
        if i is None:
            return None
        v = rows[i]["round"] + 1 if key == "round" else rows[i].get(key)
        return float(v) if isinstance(v, (int, float)) else None  # (rows of an older run: None)

    def fmt(self, v: float | None) -> str:
        if v is None or (isinstance(v, float) and not math.isfinite(v)):
            return "-"
        if self.kind in _READ:
            return f"{v:.4f}"
        if self.kind == "bytes_to":
            return human_bytes(v)
        if self.kind == "samples_to":
            return human_count(v)
        return f"{v:.1f}" if self.kind in ("rounds_to", "epochs_to") else f"{v:.2f}s"


def first_reaching(rows: list[dict[str, Any]], accuracy: float) -> int | None:
    """The index of the first row whose accuracy is >= `accuracy`, or None."""
    for i, r in enumerate(rows):
        a = r.get("accuracy")
        if isinstance(a, (int, float)) and a >= accuracy:
            return i
    return None


def parse_metric(text: str, option: str = "--metric") -> Metric:
    """'final_accuracy', 'rounds_to:0.9', ...; ConfigError naming the option otherwise."""
    kind, colon, x = text.strip().partition(":")
    if kind in _READ and not colon:
        return Metric(kind)
    if kind in _TO and colon:
        try:
            v = float(x)
        except ValueError:
            v = math.nan
        if 0 < v <= 1:
            return Metric(kind, v)
    raise ConfigError(f"{option} '{text}': expected {METRIC_HELP}; X is an accuracy in (0, 1]")


def read_summary(folder: Path) -> dict[str, Any] | None:
    """A cell's summary.json, or None when it has none (not run yet) or it cannot be read."""
    try:
        s = json.loads((folder / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    return s if isinstance(s, dict) else None


def _dotted(d: Any, key: str) -> Any:
    for part in key.split("."):
        d = d.get(part) if isinstance(d, dict) else None
    return d


def measure(cell: dict[str, Any], root: Path, metric: Metric, shows: list[str],
            ref: float | None) -> dict[str, Any]:
    """A cell's record with its status and values read from its folder (root/cell['folder'])."""
    folder = root / cell["folder"]
    s = read_summary(folder) or {}
    status = s.get("status", "not run")
    out = dict(cell, status=status, value=None, final_accuracy=s.get("final_accuracy"),
               best_accuracy=s.get("best_accuracy"), rounds=s.get("rounds"),
               sim_time_s=s.get("sim_time_s"), wall_clock_s=s.get("wall_clock_s"), show={})
    if status not in RESULTS:
        return out
    need = [metric] + [parse_metric(x) for x in shows if is_metric(x)]
    rows = read_rows(folder) if any(m.kind in _TO for m in need) else []
    out["value"] = metric.of(s, rows, ref)
    for key in shows:
        v = parse_metric(key).of(s, rows, ref) if is_metric(key) else _dotted(s, key)
        out["show"][key] = v if isinstance(v, (int, float)) and not isinstance(v, bool) else None
    out["flag"] = folder_flag(folder, s)  # collapsed or diverged, though completed: marked
    return out


def is_metric(key: str) -> bool:
    return key in _READ or key.split(":", 1)[0] in _TO


def _stats(vals: list[float | None], bounds: tuple[float, float] = (-math.inf, math.inf)
           ) -> dict[str, Any]:
    got = [v for v in vals if v is not None]
    ci = mean_ci(got, bounds=bounds)
    return {"runs": len(vals), "reached": len(got),
            "mean": statistics.fmean(got) if got else None,
            "sd": statistics.stdev(got) if len(got) > 1 else None,
            "ci": list(ci) if ci else None,
            "min": min(got) if got else None, "max": max(got) if got else None}


def setting_text(setting: dict[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in setting.items()) or "-"


def evaluate(spec: dict[str, Any], records: list[dict[str, Any]]) -> dict[str, Any]:
    """Per (method, setting): stats over seeds; per method: the best setting, and notes (a best
    setting at the edge of a numeric axis; cells not finished)."""
    metric = parse_metric(spec["metric"])
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in records:
        groups.setdefault((r["method"], setting_text(r["setting"])), []).append(r)
    settings = []
    for (method, text), rs in groups.items():
        done = [r for r in rs if r["status"] in RESULTS]
        st = _stats([r["value"] for r in done], metric.bounds)
        shows = {k: _stats([r["show"].get(k) for r in done])["mean"] for k in spec.get("show", [])}
        fin = _stats([r["final_accuracy"] for r in done])["mean"]
        settings.append({"method": method, "setting": rs[0]["setting"], "text": text,
                         "planned": len(rs), "done": len(done), **st, "final_accuracy": fin,
                         "show": shows, "seeds": {r["seed"]: r["value"] for r in done},
                         "flagged": flagged(done)})

    def rank(s: dict[str, Any]) -> tuple:
        mean = s["mean"] if s["mean"] is not None else (-math.inf if metric.higher else math.inf)
        fin = s["final_accuracy"] if s["final_accuracy"] is not None else -1.0
        return (-s["reached"], -mean if metric.higher else mean, -fin)

    best, notes = [], []
    for method in dict.fromkeys(s["method"] for s in settings):
        mine = [s for s in settings if s["method"] == method and s["done"]]
        if not mine:
            notes.append(f"{method}: no finished cell yet")
            continue
        b = min(mine, key=rank)
        best.append(b)
        for axis, v in b["setting"].items():
            vals = _numbers([s["setting"].get(axis) for s in settings if s["method"] == method])
            if len(vals) >= 2 and _number(v) in (min(vals), max(vals)):
                edge = "largest" if _number(v) == max(vals) else "smallest"
                notes.append(f"{method}: the best {axis}={v} is the {edge} value tried; widen the "
                             "grid to be sure the best lies inside it")
    for status in ("diverged", "failed", "error", "no_clients"):
        cells = [r for r in records if r["status"] == status]
        if cells:
            names = ", ".join(f"{r['method']} {setting_text(r['setting'])} seed {r['seed']}"
                              for r in cells[:5]) + (" ..." if len(cells) > 5 else "")
            notes.append(f"{len(cells)} of {len(records)} cells {status} ({names}): left out of "
                         "the table, not results")
    missing = sum(1 for r in records if r["status"] not in FINISHED + ("failed", "error",
                                                                         "no_clients"))
    if missing:
        notes.append(f"{missing} of {len(records)} cells have not finished (not run or "
                     "interrupted); their seeds are left out")
    base = next((b for b in best if b["method"] == spec.get("baseline")), None)
    for b in best if base is not None else []:
        b["versus"] = ({"baseline": True, "seeds": len(b["seeds"]),
                        "pairs": sum(v is not None for v in b["seeds"].values()),
                        "estimate": None, "lo": None, "hi": None, "p": None} if b is base else
                       versus(b["seeds"], base["seeds"], metric.difference))  # type: ignore[index]  # base: not None here
    return {"metric": metric.text, "settings": settings, "best": best, "notes": notes}


def _number(v: Any) -> float | None:
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def _numbers(vs: list[Any]) -> list[float]:
    out = [_number(v) for v in vs]
    return sorted({v for v in out if v is not None}) if all(v is not None for v in out) else []


def _cells(metric: Metric, s: dict[str, Any]) -> list[str]:
    mean = metric.fmt(s["mean"])
    ci = "-" if not s.get("ci") else f"{metric.fmt(s['ci'][0])}..{metric.fmt(s['ci'][1])}"
    sd = "-" if s["sd"] is None else metric.fmt(s["sd"]).rstrip("s")
    rng = "-" if s["min"] is None else f"{metric.fmt(s['min'])}..{metric.fmt(s['max'])}"
    return [mean, ci, sd, rng, f"{s['reached']}/{s['planned']}" + (MARK if s.get("flagged") else "")]


def _head(metric: Metric, ref: float | None) -> str:
    head = f"metric {metric.text}"
    if metric.x is not None:
        goal = metric.target(ref)
        head += (f": until accuracy >= {metric.x:g} x reference {ref:.4f} = {goal:.4f}"
                 if ref is not None else f": until accuracy >= {goal:g}")
    return head + ("; higher is better" if metric.higher
                   else "; lower is better ('-' = not reached)")


def _versus_note(metric: Metric, base: str) -> str:
    what = (f"the method's minus {base}'s, mean over the seeds" if metric.difference else
            f"{base}'s over the method's (> 1: sooner), geometric mean over the seeds")
    return (f"vs {base}: {what} where both reached it (pairs: those seeds of all planned), its "
            "95% t interval; p: two-sided paired t-test" + ("" if metric.difference else
                                                             " on log ratios"))


def sweep_tables(spec: dict[str, Any], result: dict[str, Any], every: bool = True) -> Part:
    """A sweep's head line (the metric), tables and notes: the best setting per method, then (every=True)
    every setting. The console (render), --latex and --markdown (metrics/paper.py) show these
    same cells."""
    metric = parse_metric(spec["metric"])
    shows = list(spec.get("show", []))
    base = spec.get("baseline") if any("versus" in b for b in result["best"]) else None
    hdr = ["method", "best setting", metric.text, "95% CI", "sd", "min..max", "seeds"]
    hdr += (["final_accuracy"] if metric.kind != "final_accuracy" else []) + shows
    hdr += [f"vs {base}", "p", "pairs"] if base else []
    rows = []
    for b in result["best"]:
        row = [b["method"], b["text"], *_cells(metric, b)]
        if metric.kind != "final_accuracy":
            row.append(Metric("final_accuracy").fmt(b["final_accuracy"]))
        row += [_fmt_show(k, b["show"].get(k)) for k in shows]
        if base:
            v = b["versus"]
            row += [fmt_versus(v, metric.difference), fmt_p(v["p"]),
                    f"{v['pairs']}/{v['seeds']}"]
        rows.append(row)
    best = Table("best setting per method (mean over the seeds that reached it, its 95% t "
                 "interval clipped to the metric's range, sample sd; seeds: reached / planned):",
                 hdr, rows, ([_versus_note(metric, base)] if base else [])
                 + flag_notes(result["best"]), set(range(2, len(hdr))))
    tables = [best]
    if every:
        hdr2 = ["method", "setting", metric.text, "95% CI", "sd", "min..max", "seeds", "per seed"]
        rows2 = [[s["method"], s["text"], *_cells(metric, s), _per_seed(metric, s)]
                 for s in result["settings"]]
        tables.append(Table("every setting:", hdr2, rows2, flag_notes(result["settings"]),
                            set(range(2, 7))))
    return Part([_head(metric, spec.get("reference_accuracy"))], tables, list(result["notes"]))


def render(spec: dict[str, Any], result: dict[str, Any], every: bool = True) -> str:
    """The text table: the best setting per method, then (every=True) every setting."""
    part = sweep_tables(spec, result, every)
    lines = part.head + part.tables[0].text()
    for t in part.tables[1:]:
        lines += ["", *t.text()]
    return "\n".join(lines + [f"note: {n}" for n in part.tail])


def flagged(done: list[dict[str, Any]]) -> dict[str, str]:
    """Seed -> why its run is marked collapsed or diverged (metrics/seed_health.py), over a
    setting's finished cells."""
    return {r["seed"]: flag_text(r["flag"]) for r in done if r.get("flag")}


def flag_notes(settings: list[dict[str, Any]]) -> list[str]:
    """The footnotes of a table's marked rows: '* METHOD SETTING seed S: collapsed: ...'."""
    out = []
    for s in settings:
        for seed, why in (s.get("flagged") or {}).items():
            name = " ".join(x for x in (s["method"], s["text"] if s["text"] != "-" else "",
                                        f"seed {seed}" if seed != "" else "") if x)
            out.append(f"{MARK} {name}: {why}")
    return out


def _per_seed(metric: Metric, s: dict[str, Any]) -> str:
    marked = s.get("flagged") or {}
    return " ".join((f"{k}:{metric.fmt(v)}" if k else metric.fmt(v)) + (MARK if k in marked else "")
                    for k, v in s["seeds"].items())


def _fmt_show(key: str, v: float | None) -> str:
    if is_metric(key):
        return parse_metric(key).fmt(v)
    return "-" if v is None else f"{v:.4g}"


def load_sweep(folder: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """sweep.json of a sweep folder: (spec, cell records re-read from the cells' folders)."""
    try:
        data = json.loads((folder / "sweep.json").read_text())
        spec, cells = data["spec"], data["cells"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"'{folder}' is not a sweep folder (sweep.json: {e})") from None
    metric = parse_metric(spec["metric"])
    ref = spec.get("reference_accuracy")
    keep = ("name", "method", "setting", "seed", "folder", "seconds")
    return spec, [measure({k: c.get(k) for k in keep}, folder, metric, spec.get("show", []), ref)
                  for c in cells]
