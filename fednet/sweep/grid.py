"""The grid of `fednet sweep`: its options parsed into axes, the cells (one run each) with
their folders, the checks made before anything runs, and whether a cell is already done."""
from __future__ import annotations

import itertools
import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from fednet.errors import ConfigError
from fednet.metrics import sweep_table as T

NO_SPLIT = ("--gpus",)  # values that are comma lists themselves: never a grid
SET_BY_SWEEP = ("--out", "--resume", "--overwrite")
SEED = "seed"


@dataclass(frozen=True)
class Axis:
    """One grid dimension: an option (or a --param KEY) and its values."""

    name: str
    flag: str
    values: tuple[str, ...]

    def args(self, v: str) -> list[str]:
        return [self.flag, f"{self.name}={v}" if self.flag == "--param" else v]


@dataclass
class Cell:
    name: str
    method: str
    setting: dict[str, str]
    seed: str
    args: list[str]
    folder: str  # relative to the sweep folder

    def record(self) -> dict[str, Any]:
        return {"name": self.name, "method": self.method, "setting": self.setting,
                "seed": self.seed, "folder": self.folder, "args": self.args}


def parse_grid(tokens: list[str], flags: set[str], where: str
               ) -> tuple[list[Axis], list[str]]:
    """'--lr 0.05,0.1 --param mu=0.01,0.1 --permute' -> axes (lr, mu) and fixed flags."""
    axes: list[Axis] = []
    fixed: list[str] = []
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        opt, eq, val = tok.partition("=")
        if not tok.startswith("-"):
            raise ConfigError(f"{where}: '{tok}' is not an option; write --NAME V1,V2,... "
                              "(e.g. --lr 0.05,0.1)")
        if opt in SET_BY_SWEEP:
            raise ConfigError(f"{where}: {opt} is chosen by fednet sweep for each cell; drop it")
        if opt in flags:
            fixed.append(tok)
            i += 1
            continue
        if not eq:
            if i + 1 >= len(tokens):
                raise ConfigError(f"{where}: {opt} needs a value")
            val = tokens[i + 1]
        i += 1 if eq else 2
        name, listed = opt.lstrip("-"), val
        if opt == "--param":
            key, eq2, listed = val.partition("=")
            name = key.strip()
            if not eq2 or not name:
                raise ConfigError(f"{where}: --param expects KEY=V1,V2,... (got '{val}')")
        values = [listed.strip()] if opt in NO_SPLIT else [v.strip() for v in listed.split(",")]
        if "" in values or len(set(values)) != len(values):
            raise ConfigError(f"{where}: {opt} {val}: give distinct, non-empty values separated "
                              "by commas")
        if any(a.name == name for a in axes):
            raise ConfigError(f"{where}: {opt} {name} is given twice; list its values once, "
                              "separated by commas")
        axes.append(Axis(name, opt, tuple(values)))
    return axes, fixed


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._=+-]", "_", text)


def _algo_in(tokens: list[str]) -> str | None:
    for i, t in enumerate(tokens):
        if t == "--algo" and i + 1 < len(tokens):
            return tokens[i + 1]
        if t.startswith("--algo="):
            return t.split("=", 1)[1]
    return None


def plan(grid: list[str], fixed: list[str], methods: list[str], by: list[str], flags: set[str]
         ) -> tuple[list[Cell], dict[str, dict[str, list[str]]]]:
    """Every cell of the grid; and per method its setting axes (for the edge notes)."""
    g_axes, _ = parse_grid(grid, flags, "fednet sweep")
    for tok in fixed:  # passed on as given (a later value wins), but not --out and the like
        if tok.partition("=")[0] in SET_BY_SWEEP:
            raise ConfigError(f"fednet sweep (after --): {tok.partition('=')[0]} is chosen by "
                              "fednet sweep for each cell; drop it")
    specs: list[tuple[str, list[Axis], list[str]]] = []
    for m in methods:
        name, eq, opts = m.partition("=")
        if not eq or not re.fullmatch(r"[A-Za-z0-9_.+-]+", name.strip()):
            raise ConfigError(f"--method '{m}': write NAME=OPTIONS, e.g. --method "
                              "'greedy=--algo fedseq --grouping greedy' (NAME: letters, digits, "
                              "._+-)")
        if any(s[0] == name.strip() for s in specs):
            raise ConfigError(f"--method {name.strip()} is given twice")
        try:
            tokens = shlex.split(opts)
        except ValueError as e:
            raise ConfigError(f"--method {name.strip()}: {e}") from None
        specs.append((name.strip(), *parse_grid(tokens, flags, f"--method {name.strip()}")))
    effective = []
    for mname, m_axes, m_fixed in specs or [("", [], [])]:
        axes = {a.name: a for a in g_axes}
        axes.update({a.name: a for a in m_axes})  # a method's own values replace the sweep's
        effective.append((mname, axes, m_fixed))
    # options with one value everywhere are fixed: not part of the names and settings
    varying = {n for _, axes, _ in effective for n, a in axes.items() if len(a.values) > 1}
    cells: list[Any] = []
    axes_of: dict[str, Any] = {}
    for mname, axes, m_fixed in effective:
        order = list(axes.values())
        for combo in itertools.product(*(a.values for a in order)):
            vals = dict(zip(axes, combo))
            shown = {k: v for k, v in vals.items() if k in varying or k == SEED}
            label = ([mname] if mname else []) + [
                vals[b] if b == "algo" else f"{b}={vals[b]}"
                for b in by if b in (shown if mname else vals)]
            method = " ".join(label) or _algo_in(m_fixed) or _algo_in(fixed) or "fedavg"
            setting = {k: v for k, v in shown.items() if k != SEED and k not in by}
            seed = vals.get(SEED, "")
            args = [*fixed, *m_fixed, *[x for a, v in zip(order, combo) for x in a.args(v)]]
            parts = [method] + [f"{k}={v}" for k, v in setting.items()]
            parts += [f"seed={seed}"] if seed else []
            cells.append(Cell(_safe("__".join(parts)), method, setting, seed, args, ""))
            axes_of.setdefault(method, {k: list(axes[k].values) for k in setting})
    seen: dict[str, int] = {}
    for c in cells:  # names made equal by _safe get a number
        n = seen[c.name] = seen.get(c.name, 0) + 1
        c.folder = f"cells/{c.name}" + (f"-{n}" if n > 1 else "")
    return cells, axes_of


class CellCommand(Protocol):
    """What a sweep needs of the command its cells run (the command line gives one:
    cli/sweep_options.ClickCells): its options that take no value, and a cell's options parsed
    and validated into the run's configuration (a ConfigError naming the option)."""

    flags: set[str]

    def config(self, args: list[str]) -> Any: ...


def check_cells(cells: list[Cell], command: CellCommand) -> None:
    """Parse and validate every cell's options as its command will, before anything runs."""
    for c in cells:
        try:
            command.config(list(c.args))
        except ConfigError as e:
            raise ConfigError(f"cell {c.name}: {e}") from None


def state(c: Cell, root: Path) -> str:
    """'done' (finished with these options), 'todo', or 'other' (run with other options)."""
    folder = root / c.folder
    try:
        old = json.loads((folder / "cell.json").read_text()).get("args")
    except FileNotFoundError:
        return "other" if folder.is_dir() and any(folder.iterdir()) else "todo"
    except (OSError, ValueError, AttributeError):
        return "other"
    if old != c.args:
        return "other"
    s = T.read_summary(folder)
    return "done" if s is not None and s.get("status") in T.FINISHED else "todo"


def reference(spec: str, fixed: list[str]) -> tuple[float | None, Cell | None]:
    """--reference: an accuracy, a run folder (its best accuracy), or centralized[:OPTIONS] (a
    `--algo centralized` cell run with the fixed options, then OPTIONS)."""
    try:
        v = float(spec)
    except ValueError:
        pass
    else:
        if not 0 < v <= 1:
            raise ConfigError(f"--reference {spec}: an accuracy must lie in (0, 1]")
        return v, None
    if spec.split(":", 1)[0] == "centralized":
        try:
            extra = shlex.split(spec.partition(":")[2])
        except ValueError as e:
            raise ConfigError(f"--reference {spec}: {e}") from None
        return None, Cell("reference", "reference", {}, "",
                          [*fixed, "--algo", "centralized", *extra], "reference")
    s = T.read_summary(Path(spec))
    if s is None or not isinstance(s.get("best_accuracy"), (int, float)):
        raise ConfigError(f"--reference {spec}: give an accuracy (0.99), a finished run folder "
                          "or centralized[:OPTIONS]")
    return float(s["best_accuracy"]), None
