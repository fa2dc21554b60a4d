"""Fingerprints of what a dashboard row measured (issue 55 item 1).

A fingerprint is a tiny deterministic re-run of a row's seed-0 cell: the same `fednet local`
configuration (`recipe`, fednet.api.run's keyword arguments, the same as the command's options)
cut to its first rounds, and what those rounds gave at full precision (accuracy, loss, bytes,
simulated time, client-epochs of each). Its `path` is the first 16 hex digits of the SHA-256 of
those figures: the *training path* the row was measured at. Two checkouts that train, count bytes
and keep the clock the same way give the same path; a change to any of them moves it.

    take(recipe)      run the recipe now: {"recipe", "command", "rounds", "path"}
    command(recipe)   the recipe as the `fednet local ...` command a reader can type
    fingerprint_of(kw, rounds=2)   the recipe of a cell: its run() keywords, rounds cut

The benchmark scripts store `{"fingerprints": {NAME: take(...)}}` in their --json, and each
headline row names the fingerprints it rests on (`"fingerprint": [NAME, ...]`);
benchmarks/dashboard.py checks them against benchmarks/fingerprints.json (the paths at HEAD) and
tests/test_fingerprints.py re-runs them.
"""
from __future__ import annotations

import hashlib
import json
import shlex
import tempfile
from typing import Any

FIELDS = ("round", "accuracy", "loss", "bytes_total", "sim_s", "client_epochs")
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


def path_of(rounds: list[dict[str, Any]]) -> str:
    """The training path: SHA-256 of the rounds' figures (repr: full precision), 16 hex digits."""
    text = json.dumps([[repr(r.get(k)) for k in FIELDS] for r in rounds])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def take(recipe: dict[str, Any]) -> dict[str, Any]:
    """Run a recipe (fednet.api.run, this process, one torch thread) and fingerprint it."""
    import torch

    from fednet.api import run

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="fednet-fp-") as tmp:
        exp = run(**recipe, out=f"{tmp}/run", quiet=True)
        rows = [{k: r.get(k) for k in FIELDS} for r in exp.history]
        status = exp.summary.get("status")
    return {"recipe": recipe, "command": command(recipe), "status": status, "rounds": rows,
            "path": path_of(rows)}


def takes(recipes: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """take() of each named recipe, printing each path."""
    out = {}
    for name, recipe in recipes.items():
        out[name] = take(recipe)
        print(f"fingerprint {name}: {out[name]['path']} ({out[name]['command']})", flush=True)
    return out
