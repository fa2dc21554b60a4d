"""Fingerprints of what a dashboard row measured (issue 55 item 1).

A fingerprint is a tiny deterministic re-run of a row's seed-0 cell: the same `fednet local`
configuration (`recipe`, fednet.api.run's keyword arguments, the same as the command's options)
cut to its first rounds, and what those rounds gave at full precision (accuracy, loss, bytes,
simulated time, client-epochs of each). Its `path` is the first 16 hex digits of the SHA-256 of
those figures: the *training path* the row was measured at. Two checkouts that train, count bytes
and keep the clock the same way give the same path; a change to any of them moves it.

    take(recipe, fields=FIELDS)   run the recipe now: {"recipe", "command", "rounds", "path"}
                      (and "fields" where they are not FIELDS)
    command(recipe)   the recipe as the `fednet local ...` command a reader can type
    fingerprint_of(kw, rounds=2)   the recipe of a cell: its run() keywords, rounds cut

The benchmark scripts store `{"fingerprints": {NAME: take(...)}}` in their --json, and each
headline row names the fingerprints it rests on (`"fingerprint": [NAME, ...]`);
benchmarks/dashboard.py checks them against benchmarks/fingerprints.json (the paths at HEAD) and
tests/test_fingerprints.py re-runs them.

What a path hashes is what the rows can depend on: FIELDS, every figure of a round, for rows
that report simulated time (the asynchronous and FedSeq rows); CLOCKLESS, the same without
`sim_s`, for rows that report accuracy or bytes of synchronous runs, whose figures the simulated
clock cannot move (compression, robustness, DP, personalization): a change to the clock's model
then moves the rows that show it and leaves the others checked. A fingerprint taken with other
fields than FIELDS records them ("fields").
"""
from __future__ import annotations

import hashlib
import json
import shlex
import tempfile
from typing import Any

FIELDS = ("round", "accuracy", "loss", "bytes_total", "sim_s", "client_epochs")
CLOCKLESS = tuple(f for f in FIELDS if f != "sim_s")
ROUNDS = 2


def fingerprint_of(kwargs: dict[str, Any], rounds: int = ROUNDS) -> dict[str, Any]:
    """A cell's run() keywords as a recipe: rounds cut to `rounds`, out/quiet left out."""
    recipe = {k: v for k, v in kwargs.items() if k not in ("out", "quiet", "overwrite")}
    recipe["rounds"] = rounds
    return dict(sorted(recipe.items()))


def command(recipe: dict[str, Any]) -> str:
    """`fednet local --opt value ...` for a recipe, each keyword as the option it stands for
    (`eval_mode` -> `--eval`; True: a flag; a list: its values; `params`: `--param k=v` each)."""
    from fednet.api import options

    known = options()
    words = ["fednet", "local"]
    for k, v in recipe.items():
        if k == "runtime" or v is None or v is False:
            continue
        opt = next((o for o in known[k].opts if o.startswith("--")), "--" + k.replace("_", "-")) \
            if k in known else "--" + k.replace("_", "-")
        if isinstance(v, dict):
            words += [w for key, x in v.items() for w in (opt, f"{key}={x}")]
        else:
            words += [opt] if v is True else [opt, *map(str, v)] if isinstance(v, list) \
                else [opt, str(v)]
    return shlex.join(words)


def path_of(rounds: list[dict[str, Any]], fields: tuple[str, ...] | list[str] = FIELDS) -> str:
    """The training path: SHA-256 of the rounds' figures (repr: full precision), 16 hex digits."""
    text = json.dumps([[repr(r.get(k)) for k in fields] for r in rounds])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def fields_of(fp: dict[str, Any]) -> tuple[str, ...]:
    """The fields a recorded fingerprint's path hashes (FIELDS unless it says otherwise)."""
    return tuple(fp.get("fields") or FIELDS)


def take(recipe: dict[str, Any], fields: tuple[str, ...] | list[str] = FIELDS) -> dict[str, Any]:
    """Run a recipe (fednet.api.run, this process, one torch thread) and fingerprint it."""
    import torch

    from fednet.api import run

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="fednet-fp-") as tmp:
        exp = run(**recipe, out=f"{tmp}/run", quiet=True)
        rows = [{k: r.get(k) for k in FIELDS} for r in exp.history]
        status = exp.summary.get("status")
    extra = {} if tuple(fields) == FIELDS else {"fields": list(fields)}
    return {"recipe": recipe, "command": command(recipe), "status": status, "rounds": rows,
            "path": path_of(rows, fields), **extra}


def takes(recipes: dict[str, dict[str, Any]], fields: tuple[str, ...] | list[str] = FIELDS
          ) -> dict[str, dict[str, Any]]:
    """take() of each named recipe, printing each path."""
    out = {}
    for name, recipe in recipes.items():
        out[name] = take(recipe, fields)
        print(f"fingerprint {name}: {out[name]['path']} ({out[name]['command']})", flush=True)
    return out


ALTERNATES = "fingerprint_alternates.json"
"""benchmarks/ALTERNATES: for each environment other than the one the rows were measured on,
the path each recorded path gives there ({"alternates": [{"environment", "commit", "paths":
{command: {"recorded": path, "here": path}}}]}). A CPU's kernels (oneDNN's and MKL's choice by
its features, torch's capability level) change the last bits of floats by themselves, and a
fingerprint hashes floats at full precision: a row measured on one machine gives another path on
a machine of another kind with the same code (bytes and client-epochs never differ; losses by
~1e-7, and a run whose floats feed a discrete choice, such as distributed DP's rounding, can
differ more). The translation is recorded with `dashboard.py --fingerprint-alternates` on that
machine, at a commit where the recorded paths hold on theirs (CI passed there); it is keyed by
the recorded path, so a row re-measured since has no translation and must be recorded again."""


def environment() -> dict[str, Any]:
    """What a fingerprint's floats depend on beyond the code (golden.environment: library
    versions, torch's CPU capability, the CPU's kernel flags)."""
    from golden import environment as env

    return env()


def alternates_file() -> Any:
    from pathlib import Path

    return Path(__file__).resolve().parents[1] / ALTERNATES


def translation(env: dict[str, Any] | None = None) -> dict[str, dict[str, str]]:
    """This environment's {command: {"recorded", "here"}} ({} when none is recorded)."""
    path = alternates_file()
    if not path.exists():
        return {}
    env = environment() if env is None else env
    for alt in json.loads(path.read_text()).get("alternates", []):
        if alt["environment"] == env:
            return alt["paths"]
    return {}


def expected_here(command: str, recorded: str, table: dict[str, dict[str, str]]) -> str:
    """The path a recipe recorded at `recorded` gives in this environment: its translation
    when one is recorded for exactly that recorded path, else the recorded path itself."""
    t = table.get(command)
    return t["here"] if t and t["recorded"] == recorded else recorded


def record_alternates(recipes: dict[str, dict[str, Any]], commit: str) -> dict[str, Any]:
    """Run each recipe (command -> recorded fingerprint) here and write this environment's
    translation into ALTERNATES (other environments' entries kept). Returns the entry."""
    env = environment()
    paths = {}
    for command, fp in sorted(recipes.items()):
        now = take(fp["recipe"], fields_of(fp))
        paths[command] = {"recorded": fp["path"], "here": now["path"]}
        print(f"{fp['path']} -> {now['path']} {command}", flush=True)
    path = alternates_file()
    doc = json.loads(path.read_text()) if path.exists() else {"alternates": []}
    doc["alternates"] = [a for a in doc["alternates"] if a["environment"] != env]
    entry = {"environment": env, "commit": commit, "paths": paths}
    doc["alternates"].append(entry)
    path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    return entry
