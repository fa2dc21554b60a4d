"""Golden numbers: one small in-process run per algorithm, pinned in tests/golden/golden.json.

    python3 benchmarks/golden.py                 # rerun every algorithm, diff against the JSON
    python3 benchmarks/golden.py --write         # (re)generate tests/golden/golden.json
    python3 benchmarks/golden.py --algos cfl fedfomo [--twice]

Each run is `fednet local` with the arguments in COMMON + EXTRA[algo] (parsed by the CLI's own
option parser and build_config, so the configuration is exactly what the command line gives),
written to a temporary results folder. What is pinned per algorithm (see tests/golden/README.md):
the sha256 of final_model.npz's arrays, the sha256 of what the clients keep (their model and
their tensor state), summary.json's "bytes" (and the setup stage's), "messages", "sim_time_s",
"final_accuracy", "status", and a few facts that show the scenario does what it is meant to
(FedSeq's superclients, FedSeqInter's slot schedule, CFL's clusters, FedFOMO's mixing).

Regenerate only when a change of the numbers is intended, and say why in the commit message.
tests/test_golden.py loads this file (by path) and compares a fresh run with the JSON exactly.
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib.golden_record import capture_dispatcher, client_arrays, sha256_arrays  # noqa: E402
from benchlib.golden_runs import COMMON, EXTRA, VARIANTS  # noqa: E402,F401 (tests read them here)

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden" / "golden.json"
FORMAT = 1

SUMMARY_KEYS = ("status", "final_accuracy", "sim_time_s", "messages", "bytes")


def keys() -> list[str]:
    """Every pinned run: the algorithms of the CLI, then the VARIANTS."""
    from fednet.algorithms.checks import algorithms as _algorithms
    ALGORITHMS = _algorithms()
    return [*ALGORITHMS, *VARIANTS]


def base(key: str) -> str:
    """The algorithm of a pinned run."""
    return VARIANTS[key][0] if key in VARIANTS else key


def argv(algo: str) -> list[str]:
    """The `fednet local` arguments of the algorithm's (or variant's) golden run (without --out)."""
    name, more = VARIANTS.get(algo, (algo, []))
    return ["--algo", name, *COMMON, *EXTRA[name], *more]


def command(algo: str) -> str:
    """The golden run as a command line (add --out DIR)."""
    return shlex.join(["fednet", "local", *argv(algo)])


def config(algo: str, out: str):
    """The RunConfig that `fednet local <argv> --out OUT -q` builds."""
    from fednet.cli import RUN_DEFAULTS, local
    from fednet.cli.options import build_config

    ctx = local.make_context("local", [*argv(algo), "--out", out, "-q"])
    return build_config(ctx.params, dict(RUN_DEFAULTS, clients=10))  # as cli.local does


def _scenario(algo: str, summary: dict[str, Any], rows: list[dict[str, Any]], session) -> dict:
    """Facts that show the run exercises what the algorithm is about."""
    out: dict[str, Any] = {}
    if algo in ("fedseq", "fedseq_inter"):
        out["superclients"] = summary["setup"]["groups"]
    if algo == "fedseq_inter":  # the slots' superclients, round by round (one period here)
        out["slot_schedule"] = [list(r) for r in session.algo.schedule]
    if algo == "cfl":
        out["clusters"] = [int(r["clusters"]) for r in rows]
        out["final_clusters"] = [list(map(int, c)) for c in session.algo.state.clusters]
    if algo == "fedfomo":
        out["mixed_mean"] = [r.get("mixed_mean") for r in rows]
    if "attack" in summary:  # --attack: who attacked; the backdoor's success per round
        out["malicious"] = summary["attack"]["malicious"]
        if summary["attack"]["name"] == "backdoor":
            out["attack_success"] = [r.get("attack_success") for r in rows]
    if "defense" in summary:  # --defense: its f per round, refused rounds, attackers it kept
        out["robust"] = [[r.get("robust_f"), r.get("robust_refused", 0), r.get("malicious_kept")] for r in rows]
    if "dp" in summary:  # differential privacy: epsilon after every round, the clip norms
        out["epsilon"] = [r.get("epsilon", r.get("dp_sgd_epsilon")) for r in rows]
        out["dp_clip"] = [r["dp_clip"] for r in rows if "dp_clip" in r]
    return out


def scenario_problems(algo: str, rec: dict[str, Any]) -> list[str]:
    """Why the pinned run would not exercise what the algorithm is about (empty: it does)."""
    sc, out = rec["scenario"], []
    if algo in VARIANTS and "--compress" in VARIANTS[algo][1]:
        if rec["bytes"]["client_to_server"] >= 0.6 * rec["bytes"]["server_to_client"]:
            out.append("the uplink is not compressed")
        if VARIANTS[algo][1][-1].startswith(("topk", "sign")) and \
                "compress/residual" not in rec["client_state_names"]:
            out.append("no error-feedback residual in the clients' state")
    if algo in VARIANTS and "--attack" in VARIANTS[algo][1] and not sc.get("malicious"):
        out.append("no malicious client")
    out += [f"the defense refused a round: {sc['robust']}"] if any(r[1] for r in sc.get("robust", [])) else []
    if algo in VARIANTS and any(a.startswith("--dp") for a in VARIANTS[algo][1]):
        eps = sc.get("epsilon") or []
        if not eps or not all(isinstance(e, float) and 0 < e for e in eps) or eps != sorted(eps):
            out.append(f"no growing epsilon in the rows: {eps}")
        if "--dp-adaptive" in VARIANTS[algo][1] and len(set(sc.get("dp_clip", []))) < 2:
            out.append(f"the adaptive clip norm never moved: {sc.get('dp_clip')}")
    algo = base(algo)
    if rec["status"] != "completed":
        out.append(f"status {rec['status']}")
    if algo in ("fedseq", "fedseq_inter"):
        if sum(len(g) >= 2 for g in sc["superclients"]) < 2:
            out.append(f"fewer than two superclients of >= 2 clients: {sc['superclients']}")
        if rec["bytes"]["client_to_client"] <= 0:
            out.append("no peer-to-peer hand-off")
    if algo == "fedseq_inter":
        sched = sc["slot_schedule"]
        if len(sched) < 2 or not any(len({r[i] for r in sched}) >= 2 for i in range(len(sched[0]))):
            out.append(f"no slot passes its model to another superclient: {sched}")
    if algo == "cfl" and max(sc["clusters"]) < 2:
        out.append(f"no cluster split: {sc['clusters']}")
    if algo == "fedfomo" and not sum(x or 0 for x in sc["mixed_mean"]) > 0:
        out.append(f"no client mixed a peer's model: {sc['mixed_mean']}")
    return out


def wire_bytes(rec: dict[str, Any]) -> int:
    """All bytes on the wire: server->client + client->server + client->client + control."""
    b = rec["bytes"]
    return b["server_to_client"] + b["client_to_server"] + b["client_to_client"] + b["control"]


def run(algo: str, out_dir: Path) -> dict[str, Any]:
    """One golden run into out_dir (which must not hold files); the record to pin."""
    from fednet.algorithms.checks import algorithms as _algorithms
    PERSONAL = _algorithms(personal=True)
    from fednet.core.inproc import run_local

    cfg = config(algo, str(out_dir))
    sessions: list = []
    with capture_dispatcher() as seen:
        summary = run_local(cfg, quiet=True, prepare=sessions.append)
    with np.load(out_dir / "final_model.npz", allow_pickle=False) as z:
        model = {k: z[k] for k in z.files}
    rows = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()
            if line.strip()]
    models, state = client_arrays(seen[0])
    rec: dict[str, Any] = {
        "model_sha256": sha256_arrays(model),
        "model_arrays": len(model),
        "model_elements": int(sum(a.size for a in model.values())),
        # the personal models: what a personalized algorithm's clients keep between rounds
        "client_models_sha256": sha256_arrays(models) if base(algo) in PERSONAL else None,
        # tensors the clients keep in their algorithm state (SCAFFOLD's c_k, FedDyn's g, ...)
        "client_state_sha256": sha256_arrays(state) if state else None,
        "client_state_names": sorted({k.split("/", 1)[1] for k in state}),
    }
    rec.update({k: summary[k] for k in SUMMARY_KEYS})
    rec["setup_bytes"] = summary.get("setup", {}).get("bytes")
    rec["scenario"] = _scenario(base(algo), summary, rows, sessions[0])
    return rec


KERNEL_FLAGS = ("amx_tile", "amx_bf16", "amx_int8", "avx512_bf16", "avx512_fp16", "avx512_vnni",
                "avx_vnni")
"""CPU features that decide which kernels oneDNN and MKL pick beyond torch's capability level
(a machine with AMX gives other last bits than one without, at the same AVX512 level)."""
FLOAT_KEYS = ("model_sha256", "client_models_sha256", "client_state_sha256", "final_accuracy")
"""What the CPU's kernels change by themselves; bytes, messages and simulated time never do."""


def _kernel_flags() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""
    line = next((x for x in text.splitlines() if x.startswith("flags")), "")
    have = set(line.partition(":")[2].split())
    return " ".join(f for f in KERNEL_FLAGS if f in have)


def environment() -> dict[str, Any]:
    """What the numbers depend on beyond the code: library versions and the CPU's kernels."""
    import platform

    import torch

    return {"torch": str(torch.__version__), "numpy": str(np.__version__),
            "python": platform.python_version(), "machine": platform.machine(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "cpu_kernels": _kernel_flags()}


def load() -> dict[str, Any]:
    """The pinned JSON."""
    return json.loads(GOLDEN.read_text())


def pinned_for(doc: dict[str, Any], env: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """(algorithm -> pinned record, which pin) for this environment: the main pin, with the
    float results (FLOAT_KEYS) of an `alternates` entry pinned on exactly this environment
    when there is one (`--write-env`); bytes, messages and times are the main pin's always."""
    for alt in doc.get("alternates", []):
        if alt["environment"] == env:
            merged = {a: {**rec, **alt["algorithms"].get(a, {})}
                      for a, rec in doc["algorithms"].items()}
            return merged, "the pin of this environment (alternates)"
    return doc["algorithms"], "the main pin"


def dumps(obj: Any, indent: str = "") -> str:
    """JSON with one key per line and every list of plain values on one line."""
    if isinstance(obj, dict) and obj:
        inner = indent + " "
        items = [f"{inner}{json.dumps(k)}: {dumps(v, inner)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + indent + "}"
    if isinstance(obj, list) and any(isinstance(x, dict) for x in obj):
        inner = indent + " "
        return "[\n" + ",\n".join(inner + dumps(x, inner) for x in obj) + "\n" + indent + "]"
    return json.dumps(obj)


def diff(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    """Lines 'key: old -> new' for every leaf that differs (exact comparison)."""
    lines = []
    for k in sorted(set(old) | set(new)):
        a, b = old.get(k, "<missing>"), new.get(k, "<missing>")
        if isinstance(a, dict) and isinstance(b, dict):
            lines += diff(a, b, f"{prefix}{k}.")
        elif a != b or type(a) is not type(b):
            lines.append(f"{prefix}{k}: {a!r} -> {b!r}")
    return lines


def main(args: list[str] | None = None) -> int:
    from fednet.algorithms.checks import algorithms as _algorithms
    ALGORITHMS = _algorithms()

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help=f"write {GOLDEN.relative_to(ROOT)}")
    ap.add_argument("--algos", nargs="+", choices=keys(), default=keys())
    ap.add_argument("--twice", action="store_true",
                    help="run each algorithm twice in this process and require identical records")
    ap.add_argument("--json", help="also write the fresh records (and timings) to this file")
    ap.add_argument("--write-env", action="store_true",
                    help="pin this environment's float results beside the main pin (its bytes, "
                         "messages and times must equal the main pin's)")
    ap.add_argument("--write-times", action="store_true",
                    help="rewrite the main pin's simulated times and commands from these runs, on "
                         "any environment (simulated time never depends on the kernels); refused "
                         "unless everything else equals this environment's pin")
    ns = ap.parse_args(args)
    if set(EXTRA) != set(ALGORITHMS):
        raise SystemExit(f"EXTRA covers {sorted(EXTRA)}, the CLI offers {sorted(ALGORITHMS)}")
    if ns.write and GOLDEN.exists() and load()["environment"] != environment():
        raise SystemExit("--write pins the main environment's numbers, and this is another one "
                         "(its float results differ by themselves): use --write-env")
    if (ns.write or ns.write_env or ns.write_times) and ns.algos != keys():
        raise SystemExit("--write, --write-env and --write-times regenerate every algorithm; "
                         "drop --algos")
    records: dict[str, Any] = {}
    timings: dict[str, float] = {}
    bad = 0
    with tempfile.TemporaryDirectory(prefix="fednet-golden-") as tmp:
        for algo in ns.algos:
            t0 = time.perf_counter()
            rec = run(algo, Path(tmp) / algo)
            timings[algo] = time.perf_counter() - t0
            if ns.twice:
                again = run(algo, Path(tmp) / f"{algo}-again")
                if again != rec:
                    bad += 1
                    print(f"{algo}: NOT deterministic in one process:", *diff(rec, again),
                          sep="\n  ")
            records[algo] = {"command": command(algo), **rec}
            for p in scenario_problems(algo, rec):
                bad += 1
                print(f"{algo}: trivial scenario: {p}")
            print(f"{algo:16s} {timings[algo]:6.2f} s  {rec['model_sha256'][:12]}  "
                  f"bytes {wire_bytes(rec):>9d}  sim {rec['sim_time_s']!r} s  "
                  f"acc {rec['final_accuracy']:.4f}", flush=True)
    doc = {"format": FORMAT, "environment": environment(), "algorithms": records}
    if ns.json:
        Path(ns.json).write_text(dumps({**doc, "timings_s": timings}) + "\n")
    if ns.write and bad:
        print(f"{GOLDEN.relative_to(ROOT)} not written: fix the problems above first")
        return 1
    if ns.write:
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(dumps(doc) + "\n")
        print(f"wrote {GOLDEN.relative_to(ROOT)} ({len(records)} algorithms, "
              f"{sum(timings.values()):.1f} s)")
        return 0
    if not GOLDEN.exists():
        print(f"{GOLDEN.relative_to(ROOT)} does not exist yet; run with --write")
        return 1
    old = load()
    if ns.write_env:
        return _write_env(old, doc, bad)
    if ns.write_times:
        return _write_times(old, doc, bad)
    pins, which = pinned_for(old, doc["environment"])
    print(f"comparing with {which}")
    lines = diff({"format": old.get("format")}, {"format": FORMAT})
    for algo in ns.algos:
        lines += diff(pins.get(algo, {}), records[algo], f"{algo}.")
    notes = diff(old.get("environment", {}), doc["environment"], "environment.")
    print("\n".join(lines) if lines else "no difference from the pinned numbers")
    if notes:
        print("note: pinned on another environment (bit-exact numbers may differ there):",
              *notes, sep="\n  ")
    return 1 if lines or bad else 0


def _write_env(old: dict[str, Any], doc: dict[str, Any], bad: int) -> int:
    """--write-env: this environment's float results as an `alternates` entry, once every
    other field is shown to equal the main pin (same code, other kernels). A run the main pin
    does not have yet (a new algorithm or variant) is added to it with its float results
    unpinned there (null: the main environment's are not known here) and pinned here."""
    main = dict(old["algorithms"])
    for algo, rec in doc["algorithms"].items():
        if algo not in main:
            main[algo] = {**rec, **{k: None for k in FLOAT_KEYS}}
    old = {**old, "algorithms": main}
    lines = [line for algo, rec in doc["algorithms"].items()
             for line in diff({k: v for k, v in old["algorithms"][algo].items()
                               if k not in FLOAT_KEYS},
                              {k: v for k, v in rec.items() if k not in FLOAT_KEYS}, f"{algo}.")]
    if lines or bad:
        print("not written: beyond the float results these runs differ from the main pin (the "
              "code changed, not the kernels):", *lines, sep="\n  ")
        return 1
    alts = [a for a in old.get("alternates", []) if a["environment"] != doc["environment"]]
    alts.append({"environment": doc["environment"],
                 "algorithms": {a: {k: r[k] for k in FLOAT_KEYS} for a, r in
                                doc["algorithms"].items()}})
    GOLDEN.write_text(dumps({**old, "alternates": alts}) + "\n")
    print(f"wrote this environment's float results into {GOLDEN.relative_to(ROOT)} "
          f"({len(alts)} alternate environments)")
    return 0


TIMED = ("sim_time_s", "command")
"""What --write-times rewrites in the main pin."""


def _write_times(old: dict[str, Any], doc: dict[str, Any], bad: int) -> int:
    """--write-times: the main pin's simulated times (and commands) from these runs, once every
    other field equals this environment's pin (its float results included: a change of the
    model is a change of the numbers, pinned with --write on the main environment)."""
    pins, which = pinned_for(old, doc["environment"])
    lines = []
    for algo, rec in doc["algorithms"].items():
        want = {k: v for k, v in pins.get(algo, {}).items() if k not in TIMED and v is not None}
        got = {k: v for k, v in rec.items() if k not in TIMED and k in want}
        lines += diff(want, got, f"{algo}.") + ([f"{algo}: not pinned"] if algo not in pins else [])
    if lines or bad:
        print(f"not written: beyond the times and commands these runs differ from {which}:",
              *lines, sep="\n  ")
        return 1
    main = {a: {**r, **{k: doc["algorithms"][a][k] for k in TIMED}}
            for a, r in old["algorithms"].items()}
    GOLDEN.write_text(dumps({**old, "algorithms": main}) + "\n")
    print(f"wrote the simulated times and commands of {len(main)} runs into "
          f"{GOLDEN.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
