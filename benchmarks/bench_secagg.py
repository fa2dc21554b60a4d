"""What secure aggregation costs (issue 38): bytes per client and per stage, added simulated
time, server and client CPU seconds, for SecAgg+ and SecAgg against plain FedAvg.

    python3 benchmarks/bench_secagg.py [--population 100000] [--cohorts 100 1000 5000]
        [--drops 0 0.1 0.3] [--full-clients 1024] [--cifar] [--json F]

Every cell is one `fednet local` run (its own process) of one round of FedAvg on FedProx's
Synthetic(1,1) (`synthetic-fedprox`; a 60-256-10 perceptron, 18,186 parameters, from
benchmarks/secagg_plugin.py, or --model mclr: 610) under --latency wan, a cohort of C clients
out of the population (--fraction C/P). Dropouts are a seeded fraction of the cohort failing at
the input stage, after key sharing (--secagg-drop input:RATE), with SecAgg+'s neighbours chosen for
that rate (--secagg-dropout, at least its default 0.1). Per cell: the client's uplink
and downlink bytes (each stage's too), the simulated time the round took, the server's CPU
seconds per stage and the clients' (their sum over the cohort), the survivors and whether the
round was unmasked. The expansion is computed as Bonawitz et al. define it, a client's uplink
over the bits of its input in the clear (16 per value), beside the same messages' sizes
predicted from their parts (the papers' formula with fednet's own element sizes). --cifar adds
a ResNet-18 round on CIFAR-shaped data (synthetic-cifar10), 10 clients.

Fingerprints (issue 55 item 1, benchlib/fingerprint.py, CLOCKLESS: bytes are deterministic):
smaller cells of the bytes rows' settings, their one round (the rows' own cells cost 20 s, SecAgg+
at 1,000 with 10% dropouts, and 213 s, SecAgg at 1,024, at fb32bb6): `plus-D-C`, SecAgg+ at C =
FP_COHORT a round of the population with the rows' dropout rate D; `full-N`, SecAgg at N =
FP_FULL clients. The plugin is named from the repository root (`benchmarks/secagg_plugin.py`),
where they are run.

Round timing (issue 58's target "SecAgg+ round <= 1.5x plain FedAvg's at 100 and 1,000 clients a
round, under both runtimes"):

    python3 benchmarks/bench_secagg.py rounds [--cohorts 100 1000] [--runtimes local launch]
        [--rounds 5] [--baseline DIR] [--json benchmarks/results/secagg_round.json]

The same job with and without SecAgg+, side by side in one run: digits (its default model,
digits_cnn: 15,466 parameters), every client in every round (--fraction 1), 1 local epoch, under
`fednet local` and `fednet launch` (each a process of its own; off and plus one after the other
per cell). A round's wall-clock is metrics.jsonl's wall_s step (the clients' work, the stages'
messages, the server's, and the global model's evaluation); a cell's steady round is the fastest
round after the first (on a shared machine the others' load only ever slows a round down; the
median is kept beside it). The ratio is SecAgg+'s steady round over plain FedAvg's. Under
`fednet local` (one process) each round's CPU seconds are taken too (the process's, around
the round: configure, tasks and replies, aggregate, evaluate), and its row is their ratio, the
fastest steady round of each, wall-clock's in the note: a busy 2-core machine moves wall-clock
ratios several-fold from one minute to the next, CPU seconds far less. `fednet launch`'s row
is wall-clock. The ratio's `fednet local` cells time the round alone; the profile is a second
run of this code's `fednet local` cells with a timer (wall-clock and CPU) around each part of
the protocol (X25519 agreements, AES-CTR masks,
AES-GCM, Shamir sharing and rebuilding, each client stage, the server's stages and unmasking)
and around what both runs have (the client's task, training, the in-process handover, the
round), in seconds a round (inclusive: a stage's time holds the agreements it makes), SecAgg+'s
less plain FedAvg's; for both runtimes the protocol's CPU seconds per stage that the runs
report (metrics.jsonl's secagg_server_s, secagg_client_s: the cohort's sum). Where the rest
goes (rest_cpu_s, and the local row's note): SecAgg+'s extra CPU seconds a round split into the
primitives, the protocol stages' own Python, training's difference and the stage machinery
(rest_profile). --baseline DIR: the same cells of another
checkout (a worktree of an earlier commit) run right after this one's, each pair under the same
load; its ratios are kept beside (baseline_ratios) and named in the rows' notes.

Compressed inputs (issue 58 item 4: --compress int8|qsgd under secure aggregation):

    python3 benchmarks/bench_secagg.py codecs [--seeds 0 1 2 3 4] [--clients 10] [--rounds 10]
        [--clip 0.3] [--json benchmarks/results/secagg_codecs.json]

Digits (digits_cnn, 15,466 parameters), every client every round, 1 local epoch: int8 in the
clear (--compress int8), SecAgg+ dense (its 32- or 64-bit field) and SecAgg+ int8 (--compress
int8: the common grid, the masked vector in wbits bits a value, packed), both SecAgg+ cells at
--secagg-clip CLIP. Per cell: the uplink bytes a client sends a round (all stages; the input
stage apart), the wire bits, and the final accuracy on each seed; the input stage's bytes are
checked against ceil((d + 1) wbits / 8) plus the message's header.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Sequence

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib.runner import fednet_module, metrics, run, summary  # noqa: E402
from benchlib.util import headline_row, machine, measured, table, write_json  # noqa: E402

HERE = Path(__file__).resolve().parent
PLUGIN = str(HERE / "secagg_plugin.py")
KEY, SEALED, SHARE = 32, 104, 36 + 8  # fednet's sizes: a public key, a sealed share, a share+id
FP_DROP, FP_COHORT, FP_FULL = 0.1, 100, 64  # the fingerprints' cells (2.2 s and 1.3 s here)


def cell(out: Path, mode: str, cohort: int, population: int, drop: float, extra: list[str]
         ) -> dict[str, Any]:
    args = ["--dataset", "synthetic-fedprox", "--clients", str(population), "--rounds", "1",
            "--epochs", "1", "--batch-size", "8", "--lr", "0.01", "--fraction",
            str(cohort / population), "--secagg", mode, "--latency", "wan", "--plugin", PLUGIN,
            "-q", "--out", str(out), *extra]
    if drop:  # SecAgg+'s neighbours chosen for the rate (its default, 10%, at and below it)
        args += ["--secagg-drop", f"input:{drop}", "--secagg-dropout", str(max(drop, 0.1))]
    r = run(fednet_module("local", *args))
    if r.rc != 0:
        return {"mode": mode, "cohort": cohort, "drop": drop, "status": f"rc {r.rc}",
                "error": r.stderr[-800:]}
    s, row = summary(out), metrics(out)[0]
    b = s["bytes"]
    rec = {"mode": mode, "cohort": cohort, "drop": drop, "status": s["status"],
           "up_per_client": b["client_to_server"] / cohort,
           "down_per_client": b["server_to_client"] / cohort,
           "sim_s": s["sim_time_s"], "wall_s": r.wall_s,
           "failed": row.get("secagg_failed", ""), "clients": row.get("secagg_clients"),
           "field_bits": row.get("secagg_field_bits"), "stages": row.get("bytes_by_stage", {}),
           "server_s": row.get("secagg_server_s", {}), "client_s": row.get("secagg_client_s", {})}
    with np.load(out / "final_model.npz") as z:
        rec["d"] = sum(z[k].size for k in z.files if z[k].dtype.kind == "f")
    rec["server_total_s"] = sum(rec["server_s"].values())
    rec["client_mean_s"] = sum(rec["client_s"].values()) / cohort if rec["client_s"] else 0.0
    return rec


def cell_kwargs(mode: str, cohort: int, population: int, drop: float, model: str
                ) -> dict[str, Any]:
    """cell()'s run as fednet.api.run keywords, the plugin named from the repository root."""
    kw: dict[str, Any] = {
        "dataset": "synthetic-fedprox", "clients": population, "rounds": 1, "epochs": 1,
        "batch_size": 8, "lr": 0.01, "fraction": cohort / population, "secagg": mode,
        "latency": "wan", "plugin": [str(Path(PLUGIN).relative_to(HERE.parent))], "model": model}
    if drop:
        kw.update(secagg_drop=f"input:{drop}", secagg_dropout=max(drop, 0.1))
    return kw


def fingerprint_recipes(a: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """The bytes rows' fingerprints: SecAgg+ at FP_COHORT a round (at most the population) with
    FP_DROP dropouts where --drops has it, SecAgg at FP_FULL clients (at most --full-clients)."""
    from benchlib.fingerprint import fingerprint_of

    out = {}
    if FP_DROP in a.drops:
        c = min(FP_COHORT, a.population)
        out[f"plus-{FP_DROP:g}-{c}"] = fingerprint_of(
            cell_kwargs("plus", c, a.population, FP_DROP, a.model), rounds=1)
    if a.full_clients:
        n = min(FP_FULL, a.full_clients)
        out[f"full-{n}"] = fingerprint_of(cell_kwargs("full", n, n, 0.0, a.model), rounds=1)
    return out


def fingerprints(a: argparse.Namespace) -> dict[str, Any]:
    """take() of each recipe, run from the repository root (where its plugin path points)."""
    from benchlib.fingerprint import CLOCKLESS, takes

    with contextlib.chdir(HERE.parent):
        return takes(fingerprint_recipes(a), CLOCKLESS)


def predicted_up(n_nbrs: int, d: int, fbits: int, survivors: int) -> float:
    """A client's uplink from its parts (Bonawitz et al.'s accounting with fednet's sizes): two
    public keys, a sealed share per neighbour, the masked input (the d update values and the
    training loss), a share per neighbour back."""
    return 2 * KEY + n_nbrs * SEALED + (d + 1) * fbits / 8 + survivors * SHARE


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--population", type=int, default=100_000)
    ap.add_argument("--cohorts", type=int, nargs="+", default=[100, 1000, 5000])
    ap.add_argument("--drops", type=float, nargs="+", default=[0.0, 0.1, 0.3])
    ap.add_argument("--full-clients", type=int, default=1024, help="0: no full-SecAgg cell")
    ap.add_argument("--model", default="bench_mlp",
                    help="bench_mlp (18,186 parameters, secagg_plugin.py) or mclr (610)")
    ap.add_argument("--cifar", action="store_true")
    ap.add_argument("--json")
    a = ap.parse_args()
    cells: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        def go(mode: str, cohort: int, pop: int, drop: float = 0.0, extra: Sequence[str] = (),
               model: str = a.model):
            rec = cell(Path(tmp) / f"{mode}-{cohort}-{pop}-{drop}-{model}", mode, cohort, pop,
                       drop, [*extra, "--model", model])
            rec["model"] = model
            cells.append(rec)
            print(f"{mode:5s} cohort {cohort:5d} drop {drop:.1f}: "
                  + (f"up {rec['up_per_client']:.0f} B/client, sim {rec['sim_s']:.2f} s, "
                     f"server {rec['server_total_s']:.2f} s, {rec['clients']} {rec['failed']}"
                     if "up_per_client" in rec else rec["status"]), flush=True)
        for c in a.cohorts:
            go("off", c, a.population)
            for drop in a.drops if c == _mid(a) else [0.0]:
                go("plus", c, a.population, drop)
        if a.full_clients:
            go("full", a.full_clients, a.full_clients)
            go("off", a.full_clients, a.full_clients)
        if a.cifar:
            for mode in ("off", "plus"):
                go(mode, 10, 10, extra=["--dataset", "synthetic-cifar10", "--batch-size", "32"],
                   model="resnet18")
    data = {"machine": machine(), "args": vars(a), "cells": cells,
            "analysis": analysis(cells, a), "fingerprints": fingerprints(a)}
    print(table(["mode", "cohort", "drop", "up B/client", "sim s", "server s", "unmasked"],
                [[c["mode"], c["cohort"], c["drop"], round(c.get("up_per_client", 0)),
                  round(c.get("sim_s", 0), 3), round(c.get("server_total_s", 0), 2),
                  not c.get("failed")] for c in cells]))
    print(data["analysis"])
    write_json(a.json, data, headline)


# ---- round timing ------------------------------------------------------------------------------
TIMED: dict[str, list[str]] = {
    # part -> the functions timed (inclusive wall seconds: a part's time holds what it calls)
    "agree (X25519 exchange + HKDF, or the other end's key)": ["fednet.secagg.crypto:agree",
                                                               "fednet.secagg.crypto:agree_many"],
    "private key build": ["fednet.secagg.crypto:private"],
    "masks (AES-CTR, added in place)": ["fednet.secagg.crypto:add_mask",
                                        "fednet.secagg.crypto:mask",
                                        "fednet.secagg.crypto:mask_view"],
    "aes-gcm seal/open": ["fednet.secagg.crypto:seal", "fednet.secagg.crypto:unseal"],
    "shamir share": ["fednet.secagg.shamir:share_rows", "fednet.secagg.shamir:share_rows_many"],
    "shamir rebuild": ["fednet.secagg.shamir:reconstruct_many",
                       "fednet.secagg.shamir:reconstruct"],
    "client keys": ["fednet.secagg.client:keys"],
    "client shares (sharing, agreeing, sealing)": ["fednet.secagg.client:shares"],
    "client input: open shares": ["fednet.secagg.client:open_shares"],
    "client input: quantize": ["fednet.algorithms.secagg_client:quantize"],
    "client input: mask (agreeing, expanding)": ["fednet.secagg.client:masked"],
    "client unmask": ["fednet.secagg.client:unmask"],
    "server stages (routing, sums, requests)": [
        f"fednet.secagg.server:Aggregation.{f}" for f in (
            "take_keys", "share_requests", "take_shares", "input_requests", "take_input",
            "complain", "unmask_requests", "take_unmask")],
    "server unmask (rebuild secrets, remove masks)": ["fednet.secagg.server:Aggregation.result"],
    "client task (all of it, local)": ["fednet.core.executor:Executor.on_task"],
    "client half (SecAggClient.run; plain: FedAvgClient.run)": [
        "fednet.algorithms.secagg_client:SecAggClient.run"],
    "training (FedAvgClient.run)": ["fednet.algorithms.fedavg:FedAvgClient.run"],
    "message handover (local)": ["fednet.core.inproc:InprocDispatcher._send"],
    "round's tasks and replies (local: run_round)": [
        "fednet.core.inproc:InprocDispatcher.run_round"],
    "round (all of it: configure, tasks, aggregate, evaluate)": [
        "fednet.core.rounds:RoundDriver.round"],
}


def timed_main(argv: Sequence[str]) -> None:
    """`bench_secagg.py _timed OUT.json [--round-only] fednet-args...`: fednet's CLI in this
    process with a wall-clock timer around each of TIMED's functions (perf_counter, not a
    profiler: the functions run at their own speed, plus ~2 us a call for the timer itself:
    ~100,000 calls a SecAgg+ round at 1,000 clients); OUT.json: seconds and calls per part.
    --round-only: the round's timer alone (one call a round: its CPU seconds undisturbed)."""
    import importlib
    import time

    out, args = argv[0], list(argv[1:])
    only_round = args[:1] == ["--round-only"]
    args = args[1:] if only_round else args
    acc: dict[str, list[float]] = {}
    per_round: list[float] = []  # each round's CPU seconds (RoundDriver.round's)

    def wrap(part: str, fn: Any) -> Any:
        def timed(*a: Any, **k: Any) -> Any:
            t, c = time.perf_counter(), time.process_time()
            try:
                return fn(*a, **k)
            finally:
                cell = acc.setdefault(part, [0.0, 0, 0.0])
                cell[0] += time.perf_counter() - t
                cell[1] += 1
                cell[2] += time.process_time() - c
                if part.startswith("round (all of it"):
                    per_round.append(time.process_time() - c)
        return timed
    for part, names in TIMED.items():
        if only_round and not part.startswith("round (all of it"):
            continue
        for name in names:
            mod_name, _, attr = name.partition(":")
            try:
                owner: Any = importlib.import_module(mod_name)
            except ImportError:
                continue
            *path, leaf = attr.split(".")
            for p in path:
                owner = getattr(owner, p, None)
            if owner is not None and hasattr(owner, leaf):
                setattr(owner, leaf, wrap(part, getattr(owner, leaf)))
    from fednet.cli import main as cli_main

    sys.argv = ["fednet", *args]
    try:
        cli_main()
    except SystemExit as e:
        if e.code:
            raise
    finally:
        Path(out).write_text(json.dumps({
            "parts": {p: {"s": round(v[0], 4), "calls": int(v[1]), "cpu_s": round(v[2], 4)}
                      for p, v in acc.items()},
            "round_cpu_s": [round(x, 4) for x in per_round]}))


def round_cell(out: Path, runtime: str, mode: str, cohort: int, rounds: int,
               extra: Sequence[str] = (), profile: bool = False, code: str = "",
               round_only: bool = False) -> dict[str, Any]:
    """One run of `rounds` rounds: each round's wall seconds, its steady round (the fastest
    after the first), the protocol's CPU seconds per stage (metrics: the server's, the clients'
    sum); `profile`: with _timed's timers (all of TIMED's, or the round's alone: round_only)."""
    args = ["--dataset", "digits", "--clients", str(cohort), "--fraction", "1", "--rounds",
            str(rounds), "--epochs", "1", "--secagg", mode, "-q", "--out", str(out), *extra]
    cmd = fednet_module(runtime, *args)
    if profile:  # (fednet's CLI in bench_secagg.py's _timed: the timers of TIMED)
        cmd = [sys.executable, str(Path(__file__).resolve()), "_timed", str(out) + ".timed.json",
               *(["--round-only"] if round_only else []), runtime, *args]
    env = None if not code else {**os.environ, "PYTHONPATH": code}  # (--baseline's checkout)
    r = run(cmd, env=env)
    rec: dict[str, Any] = {"runtime": runtime, "mode": mode, "cohort": cohort, "rounds": rounds,
                           "process_wall_s": r.wall_s, "code": "baseline" if code else "this"}
    if r.rc != 0:
        return {**rec, "status": f"rc {r.rc}", "error": r.stderr[-800:]}
    rows = [m for m in metrics(out) if "wall_s" in m and "round" in m]
    walls = [m["wall_s"] for m in rows]
    rec["round_wall_s"] = [round(b - a, 4) for a, b in zip([0.0] + walls, walls)]
    steady = rec["round_wall_s"][1:] or rec["round_wall_s"]
    rec["steady_s"], rec["median_s"] = float(min(steady)), float(np.median(steady))
    rec["sim_s"] = [m.get("sim_s") for m in rows]
    for key in ("secagg_server_s", "secagg_client_s", "secagg_sim_s"):
        per = [m.get(key) or {} for m in rows[1:] or rows]
        rec[key] = {k: round(float(np.mean([p.get(k, 0.0) for p in per])), 4)
                    for k in sorted({k for p in per for k in p})}
    if profile:
        timed = json.loads(Path(str(out) + ".timed.json").read_text())
        parts = timed["parts"]
        rec["profile_s"] = {p: round(v["s"] / rounds, 4) for p, v in parts.items()}
        rec["profile_cpu_s"] = {p: round(v["cpu_s"] / rounds, 4) for p, v in parts.items()}
        rec["round_cpu_s"] = timed["round_cpu_s"]
        steady_cpu = timed["round_cpu_s"][1:] or timed["round_cpu_s"]
        rec["cpu_round_s"] = float(min(steady_cpu)) if steady_cpu else None
    with np.load(out / "final_model.npz") as z:
        import hashlib

        h = hashlib.sha256()
        for k in sorted(z.files):
            h.update(k.encode() + z[k].tobytes())
        rec["model_sha256"] = h.hexdigest()[:16]
    return rec


def rounds_main(argv: Sequence[str]) -> None:
    ap = argparse.ArgumentParser(prog="bench_secagg.py rounds",
                                 description="SecAgg+'s round over plain FedAvg's (issue 58)")
    ap.add_argument("--cohorts", type=int, nargs="+", default=[100, 1000])
    ap.add_argument("--runtimes", nargs="+", default=["local", "launch"],
                    choices=["local", "launch"])
    ap.add_argument("--rounds", type=int, default=5, help="the first is not a steady one")
    ap.add_argument("--baseline", metavar="DIR", help="another checkout (a clean worktree of "
                    "an earlier commit), its cells run beside this one's (PYTHONPATH=DIR), "
                    "each right after this one's")
    ap.add_argument("--json")
    a = ap.parse_args(list(argv))
    if a.baseline:
        a.baseline_commit = _commit_of(a.baseline)
    cells: list[dict[str, Any]] = []
    profiles: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for cohort in a.cohorts:
            for runtime in a.runtimes:
                for code in ["", a.baseline] if a.baseline else [""]:
                    for mode in ("off", "plus"):
                        where = Path(tmp) / f"{runtime}-{mode}-{cohort}-{bool(code)}"
                        local = runtime == "local"
                        rec = round_cell(where, runtime, mode, cohort, a.rounds, code=code or "",
                                         profile=local, round_only=local)
                        if local and not code and "steady_s" in rec:  # the parts' timers: a
                            # run of their own (~2 us a timed call would weigh on the ratio)
                            prof = round_cell(Path(str(where) + "-parts"), runtime, mode,
                                              cohort, a.rounds, profile=True)
                            for key in ("profile_s", "profile_cpu_s"):
                                rec[key] = prof.get(key, {})
                            rec["parts_run_round_cpu_s"] = prof.get("round_cpu_s")
                        cells.append(rec)
                        print(f"{rec['code']:8s} {runtime:6s} {mode:4s} {cohort:5d}: rounds "
                              f"{rec.get('round_wall_s')} steady "
                              f"{rec.get('steady_s', float('nan')):.3f} s, CPU a round "
                              f"{rec.get('cpu_round_s') or float('nan'):.3f} s "
                              f"{rec.get('status', '')}",
                              flush=True)
    for cohort in a.cohorts:  # the profile: this code's fednet local cells
        got = {m: _round_find(cells, "local", m, cohort) for m in ("off", "plus")}
        if all(g and "profile_s" in g for g in got.values()):
            off, plus = got["off"]["profile_s"], got["plus"]["profile_s"]  # type: ignore[index]
            profiles[str(cohort)] = {
                "rounds": a.rounds, "off_s": off, "plus_s": plus,
                "extra_s": {k: round(plus.get(k, 0.0) - off.get(k, 0.0), 4)
                            for k in TIMED if k in plus or k in off}}
            print(f"profile {cohort} (s a round, plus less off):\n  " + "\n  ".join(
                f"{k}: {v:.3f}" for k, v in profiles[str(cohort)]["extra_s"].items()),
                flush=True)
    ratios: dict[str, float] = {}
    baseline: dict[str, float] = {}
    cpu: dict[str, float] = {}
    cpu_baseline: dict[str, float] = {}
    for cohort in a.cohorts:
        for runtime in a.runtimes:
            for code, into, into_cpu in (("this", ratios, cpu),
                                         ("baseline", baseline, cpu_baseline)):
                off, plus = (_round_find(cells, runtime, m, cohort, code) for m in ("off", "plus"))
                if off and plus:
                    into[f"{runtime}_{cohort}"] = plus["steady_s"] / off["steady_s"]
                    if off.get("cpu_round_s") and plus.get("cpu_round_s"):
                        into_cpu[f"{runtime}_{cohort}"] = plus["cpu_round_s"] / off["cpu_round_s"]
    rest = {str(c): r for c in a.cohorts if (r := rest_profile(cells, c))}
    for c, r in rest.items():
        print(f"where the rest goes at {c} (CPU s a round, SecAgg+ less plain): " + ", ".join(
            f"{k} {v:.3f}" for k, v in r.items()), flush=True)
    data = {"machine": machine(), "args": vars(a), "cells": cells, "ratios": ratios,
            "baseline_ratios": baseline, "cpu_ratios": cpu, "baseline_cpu_ratios": cpu_baseline,
            "profiles": profiles, "rest_cpu_s": rest}
    print("wall: " + ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items()))
    print("CPU:  " + ", ".join(f"{k} {v:.2f}x" for k, v in cpu.items()))
    if baseline:
        print("baseline (" + str(a.baseline_commit) + ") wall: " + ", ".join(
            f"{k} {v:.2f}x" for k, v in baseline.items()) + "; CPU: " + ", ".join(
            f"{k} {v:.2f}x" for k, v in cpu_baseline.items()))
    lines = []
    for k, v in ratios.items():
        runtime, cohort = k.split("_")[0], int(k.split("_")[1])
        off, plus = (_round_find(cells, runtime, m, cohort) or {} for m in ("off", "plus"))
        lines.append([runtime, cohort, off.get("steady_s"), plus.get("steady_s"), v])
    print(table(["runtime", "cohort", "off s (fastest steady)", "plus s", "plus/off"], lines))
    write_json(a.json, data, headline)


REST = {  # where SecAgg+'s extra CPU goes: part -> TIMED's parts (inclusive) it is made of
    "X25519 agreements (exchange + HKDF)": ["agree (X25519 exchange + HKDF, or the other end's key)"],
    "AES-CTR masks (expanded, added)": ["masks (AES-CTR, added in place)"],
    "AES-GCM seal/open": ["aes-gcm seal/open"],
    "Shamir share/rebuild": ["shamir share", "shamir rebuild"],
    "key pairs": ["client keys"],
    "quantize": ["client input: quantize"],
}
PROTOCOL = ["client keys", "client shares (sharing, agreeing, sealing)",
            "client input: open shares", "client input: quantize",
            "client input: mask (agreeing, expanding)", "client unmask",
            "server stages (routing, sums, requests)",
            "server unmask (rebuild secrets, remove masks)"]


def rest_profile(cells: list[dict[str, Any]], cohort: int) -> dict[str, float]:
    """Where SecAgg+'s extra CPU seconds a round go (this code's fednet local cells: their
    part timers' CPU seconds a round, SecAgg+ less plain): REST's primitives, the protocol
    stages' own Python (PROTOCOL's parts less the primitives they call), training's difference,
    and the rest of the round (the three more stages' tasks, messages and executor, and what
    both runs have); the parts add up to the whole round's difference ("total")."""
    got = {m: _round_find(cells, "local", m, cohort) for m in ("off", "plus")}
    if not all(g and "profile_cpu_s" in g for g in got.values()):
        return {}
    off, plus = got["off"]["profile_cpu_s"], got["plus"]["profile_cpu_s"]  # type: ignore[index]
    out = {k: sum(plus.get(p, 0.0) for p in parts) for k, parts in REST.items()}
    prims = sum(v for k, v in out.items() if k != "key pairs")  # (keys: a stage of PROTOCOL)
    out["protocol stages' own Python"] = sum(plus.get(p, 0.0) for p in PROTOCOL) - prims \
        - out["key pairs"]
    train = "training (FedAvgClient.run)"
    out["training (SecAgg+ less plain)"] = plus.get(train, 0.0) - off.get(train, 0.0)
    whole = "round (all of it: configure, tasks, aggregate, evaluate)"
    total = plus.get(whole, 0.0) - off.get(whole, 0.0)
    out["stage machinery and the rest"] = total - sum(out.values())
    out["total"] = total
    return {k: round(v, 4) for k, v in out.items()}


def _round_find(cells: list[dict[str, Any]], runtime: str, mode: str, cohort: int,
                code: str = "this") -> dict[str, Any] | None:
    return next((c for c in cells if c["runtime"] == runtime and c["mode"] == mode
                 and c["cohort"] == cohort and "steady_s" in c
                 and c.get("code", "this") == code), None)


def _commit_of(checkout: str) -> str:
    """The commit a checkout is at, with '+changes' when it has uncommitted ones in fednet/."""
    import subprocess

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", checkout, *args], capture_output=True,
                              text=True).stdout.strip()
    return git("rev-parse", "--short", "HEAD") + ("+changes" if git(
        "status", "--porcelain", "--", "fednet") else "")


def round_headline(data: dict[str, Any]) -> list[dict[str, Any]]:
    """A row per runtime: SecAgg+'s steady round over plain FedAvg's, the worse of the cohorts
    (fednet local: CPU seconds, wall-clock in the note; launch: wall-clock), each cohort's in
    the note with --baseline's."""
    rows = []
    base = data.get("args", {}).get("baseline_commit", "")
    for runtime in ("local", "launch"):
        wall = _of_runtime(data.get("ratios", {}), runtime)
        cpu = _of_runtime(data.get("cpu_ratios", {}), runtime)
        by_cpu = bool(cpu) and set(cpu) == set(wall)
        main, was = (cpu, _of_runtime(data.get("baseline_cpu_ratios", {}), runtime)) if by_cpu \
            else (wall, _of_runtime(data.get("baseline_ratios", {}), runtime))
        if main:
            rows.append(headline_row(
                "secure aggregation", f"SecAgg+ round over plain FedAvg's, fednet {runtime}, "
                + ("CPU seconds" if by_cpu else "wall-clock") + " (digits, "
                f"{' and '.join(f'{c:,}' for c in sorted(main))} clients a round: the worse)",
                round(max(main.values()), 2), "x", "<= 1.5",
                "; ".join(f"{c:,}: {v:.2f}x" + (f" (was {was[c]:.2f}x at {base})" if c in was
                                                 else "")
                          + (f", wall {wall[c]:.2f}x" if by_cpu and c in wall else "")
                          for c, v in sorted(main.items()))
                + (_rest_note(data, max(main, key=lambda c: main[c])) if runtime == "local"
                   else "")))
    return measured(*rows)


def _rest_note(data: dict[str, Any], cohort: int) -> str:
    """'; at C, +T s CPU a round: the largest parts' of rest_cpu_s (where the rest goes)."""
    rest = dict(data.get("rest_cpu_s", {}).get(str(cohort), {}))
    total = rest.pop("total", None)
    if not rest or not total:
        return ""
    top = sorted(rest.items(), key=lambda kv: -kv[1])[:4]
    return (f"; at {cohort:,}, SecAgg+ adds {total:.2f} s CPU a round: "
            + ", ".join(f"{k} {v:.2f}" for k, v in top))


def _of_runtime(ratios: dict[str, float], runtime: str) -> dict[int, float]:
    """{cohort: ratio} of one runtime's keys (RUNTIME_COHORT)."""
    return {int(k.split("_")[1]): v for k, v in ratios.items() if k.split("_")[0] == runtime}


def _mid(a: argparse.Namespace) -> int:
    """The cohort the dropout rates are measured at (the middle one: 1,000 by default)."""
    return sorted(a.cohorts)[len(a.cohorts) // 2]


def _find(cells: list[dict[str, Any]], mode: str, cohort: int, drop: float = 0.0
          ) -> dict[str, Any] | None:
    return next((c for c in cells if c["mode"] == mode and c["cohort"] == cohort
                 and c["drop"] == drop and "up_per_client" in c
                 and c.get("model") != "resnet18"), None)


def analysis(cells: list[dict[str, Any]], a: argparse.Namespace) -> dict[str, Any]:
    """The issue's questions: uplink over the same vector in the clear, server time's growth,
    full SecAgg's expansion against the formula."""
    out: dict[str, Any] = {}
    mid, big = _mid(a), max(a.cohorts)
    out["cohorts"] = [mid, big]
    for drop in a.drops:
        plus, off = _find(cells, "plus", mid, drop), _find(cells, "off", mid)
        if plus and off:  # uplink per surviving client: over its masked vector (the same
            survivors = max(1, plus["clients"][3])  # quantized vector in the clear) and over
            up = sum(v["client_to_server"] for v in plus["stages"].values()) / survivors
            vec = plus["stages"]["input"]["client_to_server"] / survivors  # plain FedAvg's
            out[f"plus_up_over_clear_drop_{drop}"] = up / vec
            out[f"plus_up_over_fedavg_drop_{drop}"] = up / off["up_per_client"]
    p1, p5 = _find(cells, "plus", mid), _find(cells, "plus", big)
    if p1 and p5 and big > mid:
        out["server_s_ratio"] = p5["server_total_s"] / p1["server_total_s"]
        out["n_log_n_ratio"] = big * math.log(big) / (mid * math.log(mid))
    cifar = {c["mode"]: c for c in cells if c.get("model") == "resnet18" and "up_per_client" in c}
    if "off" in cifar and "plus" in cifar:  # a CIFAR-sized model: ResNet-18's 11.2M parameters
        p, o = cifar["plus"], cifar["off"]
        out["cifar_resnet18"] = {"up_over_fedavg": p["up_per_client"] / o["up_per_client"],
                                 "sim_added_s": p["sim_s"] - o["sim_s"],
                                 "client_secagg_s": p["client_mean_s"],
                                 "server_secagg_s": p["server_total_s"], "d": p["d"]}
    full, off = _find(cells, "full", a.full_clients), _find(cells, "off", a.full_clients)
    if full and off:
        n, d, f = a.full_clients, full["d"], full["field_bits"]
        header = off["up_per_client"] - d * 4  # one reply's framing and scalars, measured
        pred = predicted_up(n - 1, d, f, n - 1) + 4 * header
        out["full_up_per_client"] = full["up_per_client"]
        out["full_up_predicted"] = pred
        out["full_measured_over_predicted"] = full["up_per_client"] / pred
        out["full_expansion_over_16bit"] = full["up_per_client"] / (d * 2)
        out["bonawitz_published"] = {"2^10 users, 2^20 dims, 16-bit": 1.73,
                                     "2^14 users, 2^24 dims, 16-bit": 1.98}
        big = predicted_up(1023, 1 << 20, 32, 1023) / ((1 << 20) * 2)
        out["fednet_expansion_at_2^10_users_2^20_dims"] = big
    return out


def headline(data: dict[str, Any]) -> list[dict[str, Any]]:
    if "ratios" in data:  # the round-timing mode's file (secagg_round.json)
        return round_headline(data)
    if data.get("mode") == "codecs":  # the compressed inputs' file (secagg_codecs.json)
        return codecs_headline(data)
    an, fps = data.get("analysis", {}), sorted(data.get("fingerprints") or {})
    return measured(
        _fingerprinted([n for n in fps if n.startswith("plus-")], headline_row(
            "secure aggregation", "SecAgg+ 1,000 clients, 10% dropouts: uplink per surviving "
            "client over its quantized vector in the clear", an.get("plus_up_over_clear_drop_0.1"),
            "x", "<= 1.2", _fp_note(fps, "plus-"))),
        headline_row("secure aggregation", "SecAgg+ server CPU, 5,000 over 1,000 clients a round",
                     an.get("server_s_ratio"), "x",
                     f"<= {an.get('n_log_n_ratio', 6.17):.2f} (n log n)"),
        _fingerprinted([n for n in fps if n.startswith("full-")], headline_row(
            "secure aggregation", "SecAgg at 1,024 clients: client uplink measured over the "
            "formula's", an.get("full_measured_over_predicted"), "x", "within 10%",
            _fp_note(fps, "full-"))))


def _fp_note(names: list[str], prefix: str) -> str:
    """What a row's fingerprint is, where it is a smaller cell than the row's."""
    name = next((n for n in names if n.startswith(prefix)), "")
    if prefix == "plus-" and name:
        return f"fingerprint: the same settings at {name.rsplit('-', 1)[1]} a round"
    return f"fingerprint: the same at {name.rsplit('-', 1)[1]} clients" if name else ""


def _fingerprinted(names: list[str], row: dict[str, Any] | None) -> dict[str, Any] | None:
    """The row naming the fingerprints it rests on (when it has any)."""
    return {**row, "fingerprint": names} if row and names else row


CODEC_CELLS = {"clear-int8": ["--compress", "int8"], "plus-dense": ["--secagg", "plus"],
               "plus-int8": ["--secagg", "plus", "--compress", "int8"]}
"""The codecs mode's cells: name -> fednet's options (the SecAgg+ ones also get --secagg-clip)."""


def codec_cell(out: Path, name: str, seed: int, a: argparse.Namespace) -> dict[str, Any]:
    """One `fednet local` run of the codecs mode: its bytes per client and round, wire bits and
    final accuracy."""
    extra = CODEC_CELLS[name] + (["--secagg-clip", str(a.clip)] if "--secagg" in
                                 CODEC_CELLS[name] else [])
    args = ["--dataset", "digits", "--clients", str(a.clients), "--rounds", str(a.rounds),
            "--epochs", "1", "--seed", str(seed), "-q", "--out", str(out), *extra]
    r = run(fednet_module("local", *args))
    if r.rc != 0:
        return {"cell": name, "seed": seed, "status": f"rc {r.rc}", "error": r.stderr[-800:]}
    s, rows = summary(out), metrics(out)
    per = a.clients * a.rounds
    inp = sum(x.get("bytes_by_stage", {}).get("input", {}).get("client_to_server", 0)
              for x in rows)
    rec = {"cell": name, "seed": seed, "status": s["status"], "accuracy": s["final_accuracy"],
           "up_per_client_round": s["bytes"]["client_to_server"] / per,
           "input_up_per_client_round": inp / per if inp else None,
           "wire_bits": rows[0].get("secagg_wire_bits"),
           "field_bits": rows[0].get("secagg_field_bits"), "wall_s": r.wall_s}
    with np.load(out / "final_model.npz") as z:
        rec["d"] = sum(z[k].size for k in z.files if z[k].dtype.kind == "f")
    if rec["wire_bits"]:  # the masked vector's tensor bytes: d values and the loss, packed
        rec["input_tensor_bytes"] = math.ceil((rec["d"] + 1) * rec["wire_bits"] / 8)
    return rec


def codecs_main(argv: Sequence[str]) -> None:
    ap = argparse.ArgumentParser(description="SecAgg+ with --compress int8 against SecAgg+ "
                                 "dense and int8 in the clear (bytes, accuracy)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--clip", type=float, default=0.3, help="--secagg-clip of the SecAgg+ cells")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    cells = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in a.seeds:
            for name in CODEC_CELLS:
                rec = codec_cell(Path(tmp) / f"{name}-{seed}", name, seed, a)
                print(json.dumps({k: v for k, v in rec.items() if k != "error"}), flush=True)
                cells.append(rec)
    summ: dict[str, Any] = {}
    for name in CODEC_CELLS:
        ok = [c for c in cells if c["cell"] == name and c["status"] == "completed"]
        if not ok:
            continue
        ups = {c["up_per_client_round"] for c in ok}
        summ[name] = {"seeds": len(ok), "up_per_client_round": sorted(ups),
                      "input_up_per_client_round": ok[0]["input_up_per_client_round"],
                      "wire_bits": ok[0]["wire_bits"], "field_bits": ok[0]["field_bits"],
                      "accuracy_mean": float(np.mean([c["accuracy"] for c in ok])),
                      "accuracy_min": min(c["accuracy"] for c in ok),
                      "accuracy_max": max(c["accuracy"] for c in ok)}
    data = {"mode": "codecs", "args": vars(a), "machine": machine(), "cells": cells,
            "summary": summ}
    print(table(["cell", "uplink B/client/round", "input stage", "wire bits", "accuracy",
                 "min..max"],
                [[n, f"{v['up_per_client_round'][0]:,.0f}", f"{v['input_up_per_client_round'] or 0:,.0f}",
                  v["wire_bits"] or "-", f"{v['accuracy_mean']:.4f}",
                  f"{v['accuracy_min']:.4f}..{v['accuracy_max']:.4f}"] for n, v in summ.items()]))
    write_json(a.json, data, headline)


def codecs_headline(data: dict[str, Any]) -> list[dict[str, Any]]:
    """One row: SecAgg+ int8's uplink over int8's in the clear (the dense cell in its note; the
    accuracy on each seed stays in the file: it has no fingerprint)."""
    sm = data.get("summary", {})
    p, c, d = sm.get("plus-int8"), sm.get("clear-int8"), sm.get("plus-dense")
    if not p or not c:
        return []
    ratio = p["up_per_client_round"][0] / c["up_per_client_round"][0]
    note = (f"digits, {data['args']['clients']} clients, {data['args']['rounds']} rounds, "
            f"--secagg-clip {data['args']['clip']:g}: {p['wire_bits']} bits a masked value; "
            f"SecAgg+ int8 {p['up_per_client_round'][0]:,.0f} B a client a round, in the clear "
            f"{c['up_per_client_round'][0]:,.0f}"
            + (f", SecAgg+ dense {d['up_per_client_round'][0]:,.0f}" if d else "")
            + " (the seeds' final models: the JSON's summary)")
    return measured(headline_row("secure aggregation", "SecAgg+ int8 uplink over int8 in the clear",
                                 round(ratio, 3), "x", note=note))


if __name__ == "__main__":
    if sys.argv[1:2] == ["codecs"]:
        codecs_main(sys.argv[2:])
    elif sys.argv[1:2] == ["rounds"]:
        rounds_main(sys.argv[2:])
    elif sys.argv[1:2] == ["_timed"]:
        timed_main(sys.argv[2:])
    else:
        main()
