"""BENCHMARKS.md as a dashboard, generated from the benchmark scripts' --json files (issue 26).

    python3 benchmarks/dashboard.py [--results benchmarks/results] [--out BENCHMARKS.md] [--check]

Reads every RESULTS/*.json (what a benchmark script wrote with --json), keeps for each (area,
metric) of their "headline" rows the newest by the file's date, and writes one table per area
(benchmarks/benchlib/util.py AREAS, in that order): metric, target, current figure, commit, date and the
command that made it, with the JSON file. Below the tables: the benchmark scripts (a .py here
that defines headline()) without a result file that gave a row yet. A file without "headline"
(written before the scripts had one) gets its rows from its script's own headline(data), the
script named by its "script" key or else by its file name (async_hetero.json: bench_async.py);
a file without "command" gets one rebuilt from its "args" when the script has parser(). Every
number in the output comes from those files. --check: exit 1 when OUT differs from what would
be written; more than MAX_LINES lines is an error (fewer headline rows are needed).

Fingerprints (issue 55 item 1; benchlib/fingerprint.py): a result file may keep "fingerprints"
(NAME: a 2-round re-run recipe of a seed-0 cell, its figures and their hash, the *training
path*), and each of its rows names those it rests on ("fingerprint": [NAME, ...]). FINGERPRINTS
(benchmarks/fingerprints.json) holds each recipe's path at HEAD. --check also exits 1 on a row
whose fingerprint was recorded at another path than FINGERPRINTS' (or whose figures do not give
its path), unless its file says why it is "stale" (the row then says STALE). --fingerprints
re-runs every recipe, writes FINGERPRINTS and names the rows it moved (tests/test_fingerprints.py
re-runs them against the files, in the slow lane). Accuracy-bearing rows without a fingerprint
are named below the tables. On a machine of another kind of CPU the same code gives other last
bits of floats, so other paths: --fingerprint-alternates COMMIT records, for this machine's
environment, the path each recorded path gives here (benchmarks/fingerprint_alternates.json;
benchlib/fingerprint.ALTERNATES), which --fingerprints and the test then read as the recorded one.
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import shlex
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from benchlib.util import AREAS  # noqa: E402

MAX_LINES = 175  # (150 until issue 56's batched-training rows; 157 with its whole-run rows;
# 175 with issue 55's robustness table (clean cost per defense, effect per attack) and checks)
HISTORY = ROOT / "docs" / "benchmarks" / "history.md"
FINGERPRINTS = HERE / "fingerprints.json"
ROW_KEYS = ("area", "metric", "value", "unit", "target", "note")
_MODULES: dict[str, ModuleType] = {}


def benchmark_scripts() -> list[str]:
    """The benchmark scripts: every .py in benchmarks/ that defines headline()."""
    return sorted(p.name for p in HERE.glob("*.py")
                  if p.name != Path(__file__).name and "\ndef headline(" in p.read_text())


def script_of(path: Path, data: dict[str, Any]) -> str | None:
    """The script that wrote a result file: its "script" key, else the longest prefix of the
    file's name (split at '_') that names one (NAME.py or bench_NAME.py)."""
    if data.get("script"):
        return str(data["script"])
    known = set(benchmark_scripts())
    parts = path.stem.split("_")
    for k in range(len(parts), 0, -1):
        name = "_".join(parts[:k])
        for cand in (f"bench_{name}.py", f"{name}.py"):
            if cand in known:
                return cand
    return None


def module(script: str) -> ModuleType:
    """The benchmark script, imported by path (once)."""
    if script not in _MODULES:
        spec = importlib.util.spec_from_file_location(f"fednet_dashboard_{Path(script).stem}",
                                                      HERE / script)
        if spec is None or spec.loader is None:
            raise SystemExit(f"dashboard: cannot import benchmarks/{script}")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod  # dataclasses look their module up there
        spec.loader.exec_module(mod)
        _MODULES[script] = mod
    return _MODULES[script]


def rebuilt_command(script: str, args: dict[str, Any]) -> str:
    """'python3 benchmarks/SCRIPT --opt value ...' from a file's "args", leaving out what equals
    the default of the script's parser(); "" when the script has no parser()."""
    make = getattr(module(script), "parser", None)
    if make is None:
        return ""
    ap = make()
    words = ["python3", f"benchmarks/{script}"]
    for key, v in args.items():
        if v is None or v is False or v == ap.get_default(key):
            continue
        opt = "--" + key.replace("_", "-")
        words += [opt] if v is True else [opt, *map(str, v)] if isinstance(v, list) \
            else [opt, str(v)]
    return shlex.join(words)


def check_rows(rows: Any, path: Path) -> list[dict[str, Any]]:
    """The headline rows of a file, checked: a list of {area, metric, value, unit, target, note}."""
    ok = isinstance(rows, list) and all(
        isinstance(r, dict) and all(k in r for k in ROW_KEYS)
        and isinstance(r["value"], (int, float, str)) for r in rows)
    if not ok:
        raise SystemExit(f"dashboard: {path}: 'headline' must be a list of rows with the keys "
                         f"{', '.join(ROW_KEYS)} (a number or text for 'value')")
    return rows


def read_result(path: Path) -> dict[str, Any]:
    """One result file as the dashboard needs it: script, rows, command, commit, date."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise SystemExit(f"dashboard: cannot read {path}: {e}") from None
    if not isinstance(data, dict):
        raise SystemExit(f"dashboard: {path} is not a benchmark's --json (an object)")
    script = script_of(path, data)
    if "headline" in data:
        rows = data["headline"]
    elif script and hasattr(module(script), "headline"):
        rows = module(script).headline(data)
    else:
        raise SystemExit(f"dashboard: {path} has no 'headline' and no script to make one")
    info = data.get("machine") if isinstance(data.get("machine"), dict) else {}
    command = data.get("command") or (
        rebuilt_command(script, data["args"]) if script and isinstance(data.get("args"), dict)
        else "")
    return {"path": path, "script": script or "?", "rows": check_rows(rows, path),
            "command": command, "commit": str(data.get("commit") or info.get("git") or "?"),
            "date": str(data.get("date") or info.get("date") or ""),
            "fingerprints": data.get("fingerprints") or {}, "stale": data.get("stale") or ""}


def when(date: str) -> datetime.datetime:
    """A file's date, comparable (an unreadable one sorts first)."""
    try:
        d = datetime.datetime.fromisoformat(date)
    except ValueError:
        return datetime.datetime.min.replace(tzinfo=datetime.timezone.utc)
    return d if d.tzinfo else d.replace(tzinfo=datetime.timezone.utc)


def newest(results: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """Per (area, metric): the row of the newest file (ties: the later file name)."""
    best: dict[tuple[str, str], dict[str, Any]] = {}
    for res in sorted(results, key=lambda r: (when(r["date"]), r["path"].name)):
        for i, r in enumerate(res["rows"]):
            best[(r["area"], r["metric"])] = {
                **r, **{k: res[k] for k in ("path", "script", "command", "commit", "date",
                                            "fingerprints", "stale")},
                "order": (res["script"], res["path"].name, i)}
    return best


def link(target: Path, out: Path) -> str:
    """target as a link from out's folder (relative inside the repository)."""
    try:
        target.resolve().relative_to(ROOT)
        out.resolve().relative_to(ROOT)
    except ValueError:
        return str(target.resolve())
    return Path(os.path.relpath(target.resolve(), out.resolve().parent)).as_posix()


def shown(path: Path) -> str:
    """A path as typed from the repository root (absolute outside it)."""
    try:
        return path.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return str(path.resolve())


def number(v: Any, unit: str) -> str:
    """A value with its unit: 2.64 s, 0.465x, 3.4%, 1,234 MB."""
    if isinstance(v, bool) or isinstance(v, str):
        text = str(v)
    elif isinstance(v, int) or (isinstance(v, float) and abs(v) >= 1000):
        text = f"{v:,.0f}"
    else:
        text = f"{v:.3g}"
    return text + ("" if not unit else unit if unit in ("x", "%") else " " + unit)


def cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ").strip()


def table_row(r: dict[str, Any], out: Path) -> str:
    current = f"**{number(r['value'], r['unit'])}**" + (f" ({r['note']})" if r["note"] else "")
    if r.get("stale"):
        current = f"STALE ({r['stale']}): " + current
    command = f"`{r['command']}`" if r["command"] else "(not recorded)"
    file = f"[{r['path'].name}]({link(r['path'], out)})"
    date = r["date"][:16].replace("T", " ")
    paths = [fp_path(r, n) for n in r.get("fingerprint") or []]
    commit = r["commit"] + (f" (path {' '.join(p[:8] for p in paths)})" if paths else "")
    return "| " + " | ".join(cell(x) for x in (
        r["metric"], r["target"] or "-", current, commit, date or "?",
        f"{command} → {file}")) + " |"


def fp_path(r: dict[str, Any], name: str) -> str:
    """The training path a row's fingerprint NAME was recorded at ('?' when its file lacks it)."""
    return str((r.get("fingerprints") or {}).get(name, {}).get("path") or "?")


def unchecked(r: dict[str, Any]) -> bool:
    """An accuracy-bearing row (its metric names an accuracy, or its note gives one) without a
    fingerprint."""
    import re

    bearing = "accura" in r["metric"].lower() or re.search(
        r"accura\w*:?\s+[-+]?\d", str(r["note"]).lower()) is not None
    return bearing and not r.get("fingerprint") and not r.get("stale")


def ledger(path: Path = FINGERPRINTS) -> dict[str, Any]:
    """FINGERPRINTS: each recipe's command -> its training path at HEAD ({} when absent)."""
    return json.loads(path.read_text()) if path.exists() else {}


def path_problems(rows: dict[tuple[str, str], dict[str, Any]], paths: dict[str, Any]
                  ) -> list[str]:
    """The shown rows whose fingerprints disagree with HEAD's paths (stale files excepted)."""
    from benchlib.fingerprint import fields_of, path_of

    bad = []
    for r in rows.values():
        for name in [] if r.get("stale") else r.get("fingerprint") or []:
            fp = (r.get("fingerprints") or {}).get(name)
            where = f"{r['area']}: {r['metric']!r} ({r['path'].name}, fingerprint {name})"
            if fp is None:
                bad.append(f"{where}: the file has no such fingerprint")
            elif path_of(fp["rounds"], fields_of(fp)) != fp["path"]:
                bad.append(f"{where}: its figures do not give its path {fp['path']}")
            elif paths.get(fp["command"], {}).get("path") != fp["path"]:
                head = paths.get(fp["command"], {}).get("path", "none recorded")
                bad.append(f"{where}: measured at training path {fp['path']}, HEAD's is {head} "
                           f"({shown(FINGERPRINTS)}): re-measure the row, or say in its file "
                           "why it is \"stale\"")
    return bad


def recipes_of(results: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each recipe of the (not stale) files, by its command: its recorded fingerprint."""
    return {fp["command"]: fp for res in results if not res["stale"]
            for fp in res["fingerprints"].values()}


def refingerprint(results: list[dict[str, Any]], out: Path = FINGERPRINTS) -> list[str]:
    """Re-run every recipe of the (not stale) files, write `out`; the rows whose path moved."""
    from benchlib.fingerprint import expected_here, fields_of, take, translation

    table = translation()  # on another kind of CPU: its paths read as the rows' machine's
    paths, moved = {}, []
    for command, fp in sorted(recipes_of(results).items()):
        now = take(fp["recipe"], fields_of(fp))
        held = now["path"] == expected_here(command, fp["path"], table)
        paths[command] = {"path": fp["path"] if held else now["path"], "status": now["status"]}
        print(f"{now['path']} {'' if held else '(moved)'} {command}")
        if not held:
            moved += [f"{res['path'].name}: {r['metric']}" for res in results
                      for r in res["rows"] if any(
                          res["fingerprints"].get(n, {}).get("command") == command
                          for n in r.get("fingerprint") or [])]
    out.write_text(json.dumps(paths, indent=1, sort_keys=True) + "\n")
    return moved


def render(results: list[dict[str, Any]], results_dir: Path, out: Path) -> str:
    """The whole dashboard."""
    rows = newest(results)
    areas = sorted({a for a, _ in rows}, key=lambda a: (AREAS.index(a) if a in AREAS
                                                       else len(AREAS), a))
    history = f"[{shown(HISTORY)}]({link(HISTORY, out)})"
    lines = ["# Benchmarks", "",
             "The current figure of every measured metric, one table per area, written by "
             "`python3 benchmarks/dashboard.py` from the benchmark scripts' `--json` files in "
             f"`{shown(results_dir)}/`: do not edit it by hand. A row is the newest measurement of "
             "its metric (by the date in its file): the target where the project states one, the "
             "commit (`+dirty`: `fednet/` had uncommitted changes) and date it was measured at, "
             "and the command that made it, with the file it wrote. `(path ...)` beside a commit: "
             "the training paths of the row's fingerprints, checked at HEAD by `--check` and "
             "`tests/test_fingerprints.py`; a row without one (wall-clock, memory) is not "
             "bit-checked: re-run its command at HEAD and compare the ratio "
             "([docs/comparisons.md](docs/comparisons.md)).", "",
             f"To add or update a figure, run the benchmark with `--json {shown(results_dir)}/"
             "NAME.json`, then `python3 benchmarks/dashboard.py`; `python3 benchmarks/dashboard.py "
             "--check` fails when this file is out of date. How each figure was measured, and "
             f"every dated figure before these, is in {history}.", ""]
    for area in areas:
        lines += [f"## {area}", "", "| metric | target | current | commit | date | command |",
                  "|---|---|---|---|---|---|"]
        mine = sorted((r for (a, _), r in rows.items() if a == area), key=lambda r: r["order"])
        lines += [table_row(r, out) for r in mine] + [""]
    measured = {r["script"] for r in results if r["rows"]}
    missing = [s for s in benchmark_scripts() if s not in measured]
    if missing:
        lines.append("Not yet measured with `--json`: " + ", ".join(f"`{s}`" for s in missing)
                     + f" (history: {history}).")
    bare = sorted({r["path"].name for r in rows.values() if unchecked(r)})
    if bare:
        lines += ["", "Accuracy-bearing rows without a fingerprint (not re-checked at HEAD by "
                  "tests/test_fingerprints.py): those of " + ", ".join(f"`{b}`" for b in bare)
                  + "."]
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", type=Path, default=HERE / "results",
                    help="the folder of --json files (default benchmarks/results)")
    ap.add_argument("--out", type=Path, default=ROOT / "BENCHMARKS.md")
    ap.add_argument("--check", action="store_true",
                    help="write nothing; exit 1 when --out differs from what would be written "
                    "or a row's fingerprint was recorded at another training path than HEAD's")
    ap.add_argument("--fingerprints", action="store_true",
                    help="re-run every row's fingerprint recipe and write HEAD's training paths "
                    f"to {shown(FINGERPRINTS)} (slow: about a minute)")
    ap.add_argument("--fingerprint-alternates", metavar="COMMIT",
                    help="re-run every recipe on this machine and record, for its environment "
                    "(library versions, CPU kernels), the path each recorded path gives here "
                    "(benchmarks/fingerprint_alternates.json): run it at COMMIT, a commit where "
                    "the recorded paths hold on the machine they were measured on (CI passed)")
    ap.add_argument("--ledger", type=Path, default=FINGERPRINTS,
                    help="each recipe's training path at HEAD (default benchmarks/"
                    "fingerprints.json)")
    a = ap.parse_args(argv)
    results = [read_result(p) for p in sorted(a.results.glob("*.json"))]
    if a.fingerprint_alternates:
        from benchlib.fingerprint import record_alternates

        record_alternates(recipes_of(results), a.fingerprint_alternates)
        return 0
    if a.fingerprints:
        moved = refingerprint(results, a.ledger)
        print("rows measured at another training path than HEAD's (re-measure them): "
              + ("; ".join(moved) if moved else "none"))
    text = render(results, a.results, a.out)
    n = text.count("\n")
    if n > MAX_LINES:
        print(f"dashboard: {n} lines, more than {MAX_LINES}: fewer headline rows are needed",
              file=sys.stderr)
        return 1
    if a.check:
        bad = path_problems(newest(results), ledger(a.ledger))
        if bad:
            print("dashboard: rows not measured at HEAD's training path:\n  "
                  + "\n  ".join(bad), file=sys.stderr)
            return 1
    if a.check:
        old = a.out.read_text() if a.out.exists() else None
        if old != text:
            print(f"dashboard: {a.out} is out of date; run python3 benchmarks/dashboard.py",
                  file=sys.stderr)
            return 1
        return 0
    a.out.write_text(text)
    print(f"wrote {a.out} ({n} lines, {sum(len(r['rows']) for r in results)} rows from "
          f"{len(results)} files)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
