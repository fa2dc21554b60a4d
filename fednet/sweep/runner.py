"""`fednet sweep`: a grid of runs, each cell one `fednet local` (or `fednet launch`) subprocess
with its own folder under --out, at most --jobs at once; resumable (a cell whose summary.json says
completed or diverged is not run again). The grid: sweep/grid.py; the metric and the tables:
metrics/sweep_table.py."""
from __future__ import annotations

import datetime
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fednet.errors import ConfigError
from fednet.metrics import paper, sweep_table as T
from fednet.metrics.export import cells_csv, export_table, sweep_rows
from fednet.metrics.files import make_dir, write_json, write_text
from fednet.sweep.grid import Cell, CellCommand, check_cells, plan, reference, state


class Runner:
    """Runs cells as subprocesses, at most `jobs` at once; stop() interrupts them all."""

    def __init__(self, root: Path, runtime: str, jobs: int) -> None:
        self.root, self.runtime, self.jobs = root, runtime, jobs
        self.procs: set[subprocess.Popen[bytes]] = set()
        self.lock = threading.Lock()
        self.stopping = False

    def run_one(self, c: Cell) -> dict[str, Any]:
        """One cell into its folder (cell.json: its options; log.txt: what it printed)."""
        if self.stopping:
            return {"rc": None, "seconds": 0.0}
        folder = self.root / c.folder
        make_dir(folder)
        write_json(folder / "cell.json", c.record())
        cmd = [sys.executable, "-m", "fednet", self.runtime, *c.args, "--out", str(folder),
               "--overwrite"]
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        t0 = time.monotonic()
        with open(folder / "log.txt", "wb") as log:
            with self.lock:
                if self.stopping:
                    return {"rc": None, "seconds": 0.0}
                # its own process group: Ctrl-C reaches the sweep, which interrupts each cell once
                p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                     stdin=subprocess.DEVNULL, process_group=0)
                self.procs.add(p)
            rc = p.wait()
        with self.lock:
            self.procs.discard(p)
        return {"rc": rc, "seconds": time.monotonic() - t0}

    def run(self, cells: list[Cell], done: Callable[[Cell, dict[str, Any]], None]) -> None:
        pool = ThreadPoolExecutor(self.jobs)
        try:
            futs = {pool.submit(self.run_one, c): c for c in cells}
            for f in as_completed(futs):
                done(futs[f], f.result())
        except KeyboardInterrupt as e:
            self.stop(signal.SIGTERM if type(e).__name__ == "Terminated" else signal.SIGINT)
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    def stop(self, sig: int, grace_s: float = 60.0) -> None:
        """Interrupt every running cell (it keeps its partial results) and wait for them."""
        with self.lock:
            self.stopping = True
            procs = list(self.procs)
        for p in procs:
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        for p in procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()


@dataclass
class Options:
    """What `fednet sweep` was given (cli/commands.py)."""

    out: str
    grid: list[str]
    fixed: list[str] = field(default_factory=list)
    methods: list[str] = field(default_factory=list)
    by: list[str] = field(default_factory=lambda: ["algo"])
    runtime: str = "local"
    jobs: int = 1
    metric: str = "final_accuracy"
    reference: str = ""
    baseline: str = ""
    show: list[str] = field(default_factory=list)
    dry_run: bool = False
    argv: list[str] = field(default_factory=list)
    latex: str = ""  # --latex FILE: the tables as LaTeX (booktabs)
    markdown: str = ""  # --markdown FILE: the tables as Markdown


def prepare(o: Options, command: CellCommand
            ) -> tuple[dict[str, Any], list[Cell], Cell | None, list[Cell]]:
    """Everything checked before a cell starts: (spec, cells, reference cell, cells to run)."""
    T.parse_metric(o.metric)
    for s in o.show:
        if T.is_metric(s):
            T.parse_metric(s, "--show")
    if o.jobs < 1:
        raise ConfigError(f"--jobs must be at least 1 (got {o.jobs})")
    cells, axes_of = plan(o.grid, o.fixed, o.methods, o.by, command.flags)
    if o.baseline and o.baseline not in axes_of:
        raise ConfigError(f"--baseline {o.baseline}: not a method of this sweep; its methods: "
                          f"{', '.join(axes_of)}")
    ref_acc, ref_cell = reference(o.reference, o.fixed) if o.reference else (None, None)
    every = ([ref_cell] if ref_cell else []) + cells
    check_cells(every, command)
    root = Path(o.out)
    if root.exists() and not root.is_dir():
        raise ConfigError(f"--out {root} is a file; give a folder")
    states = {c.name: state(c, root) for c in every}
    other = [c for c in every if states[c.name] == "other"]
    if other:
        raise ConfigError(f"--out {root}: {len(other)} cell folder(s) hold runs made with other "
                          f"options (e.g. {root / other[0].folder}); give a new --out, or remove "
                          "those folders to run them again")
    for f, opt in ((o.latex, "--latex"), (o.markdown, "--markdown")):
        if f and Path(f).is_dir():
            raise ConfigError(f"{opt} {f} is a folder; give a file")
    spec = {"metric": o.metric, "reference": o.reference, "reference_accuracy": ref_acc,
            "baseline": o.baseline, "show": o.show, "by": o.by, "runtime": o.runtime,
            "methods": o.methods, "grid": o.grid, "fixed": o.fixed, "axes": axes_of,
            "command": o.argv}
    return spec, cells, ref_cell, [c for c in every if states[c.name] == "todo"]


def run_sweep(o: Options, command: CellCommand,
              echo: Callable[[str], None]) -> str:
    """Run what is left of the sweep; the table (also when interrupted: then KeyboardInterrupt
    follows, after sweep.json, sweep.csv and the table of what finished are written)."""
    spec, cells, ref_cell, todo = prepare(o, command)
    root = Path(o.out)
    if o.dry_run:
        lines = [f"{c.name}: {'to run' if c in todo else 'done'}: fednet {o.runtime} "
                 + " ".join(c.args) for c in ([ref_cell] if ref_cell else []) + cells]
        return "\n".join(lines + [f"{len(todo)} of {len(lines)} cells to run"])
    make_dir(root)
    seconds = _old_seconds(root)
    exports = (o.latex or None, o.markdown or None)
    finish(root, spec, cells, seconds, ref_cell, exports)  # `fednet report OUT` works meanwhile
    echo(f"fednet sweep: {len(cells) + bool(ref_cell)} cells, {len(todo)} to run "
         f"({o.jobs} at a time) into {root}")
    runner, t0, n = Runner(root, o.runtime, o.jobs), time.monotonic(), [0]
    took: list[float] = []  # the seconds of each cell run so far

    def done(c: Cell, res: dict[str, Any]) -> None:
        if res["rc"] is None:
            return
        n[0] += 1
        seconds[c.name] = round(res["seconds"], 2)
        s = T.read_summary(root / c.folder) or {}
        acc = s.get("final_accuracy")
        line = (f"[{n[0]}/{len(todo)}] {c.name}: {s.get('status', 'failed')}"
                + (f", final accuracy {acc:.4f}" if isinstance(acc, float) else "")
                + f" ({res['seconds']:.1f}s")
        left = len(todo) - n[0]
        took.append(res["seconds"])
        if left:  # cells take about their mean so far; o.jobs run at once
            line += f"; about {_dur(sum(took) / len(took) * left / min(o.jobs, left))} left"
        echo(line + ")")
        if s.get("status") not in T.FINISHED:
            echo(f"  exit code {res['rc']}; {_last_line(root / c.folder / 'log.txt')} "
                 f"(see {root / c.folder / 'log.txt'})")

    stopped: KeyboardInterrupt | None = None
    try:
        if ref_cell in todo:
            runner.run([ref_cell], done)
        runner.run([c for c in todo if c is not ref_cell], done)
    except KeyboardInterrupt as e:
        stopped = e
    spec.update(elapsed_s=round(time.monotonic() - t0, 1), cells_run=n[0],
                finished_at=datetime.datetime.now().astimezone().isoformat(timespec="seconds"))
    text = finish(root, spec, cells, seconds, ref_cell, exports)
    if stopped is not None:
        print(text, flush=True)
        raise stopped
    return text + f"\n{n[0]} cells run in {_dur(time.monotonic() - t0)}; results: " \
                  f"{root / 'sweep.json'}, {root / 'sweep.csv'} (cells), {root / 'table.csv'}" \
                  + "".join(f", {f}" for f in exports if f)


def _dur(s: float) -> str:
    return f"{s:.0f}s" if s < 90 else f"{s / 60:.1f} min" if s < 5400 else f"{s / 3600:.1f} h"


def _last_line(log: Path) -> str:
    try:
        lines = [x for x in log.read_text(errors="replace").splitlines() if x.strip()]
    except OSError:
        return "no log"
    return lines[-1] if lines else "it printed nothing"


def _old_seconds(root: Path) -> dict[str, float]:
    try:
        return {c["name"]: c["seconds"] for c in json.loads((root / "sweep.json").read_text())
                ["cells"] if c.get("seconds") is not None}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def finish(root: Path, spec: dict[str, Any], cells: list[Cell], seconds: dict[str, float],
           ref_cell: Cell | None, exports: tuple[str | None, str | None] = (None, None)) -> str:
    """Measure every cell, write sweep.json, sweep.csv, table.csv (and --latex, --markdown's
    files: exports); the text table."""
    if ref_cell is not None:
        s = T.read_summary(root / ref_cell.folder) or {}
        spec["reference_accuracy"] = s.get("best_accuracy")
    metric = T.parse_metric(spec["metric"])
    recs = [dict(T.measure(c.record(), root, metric, spec["show"],
                           spec.get("reference_accuracy")), seconds=seconds.get(c.name))
            for c in cells]
    result = T.evaluate(spec, recs)
    if ref_cell is not None and spec["reference_accuracy"] is None and metric.x is not None:
        result["notes"].append(f"the reference run ({root / ref_cell.folder}) has not finished: "
                               f"{metric.text} uses {metric.x:g} as an absolute accuracy")
    axes = list(dict.fromkeys(a for c in cells for a in c.setting))
    write_json(root / "sweep.json", {"spec": spec, "cells": recs, **result})
    write_text(root / "sweep.csv", cells_csv(recs, axes, spec["show"]))
    write_text(root / "table.csv", export_table(sweep_rows(str(root), spec, result)))
    paper.write([T.sweep_tables(spec, result)], *exports)
    return T.render(spec, result)
