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
import contextlib
import hashlib
import json
import shlex
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden" / "golden.json"
FORMAT = 1

# `fednet local` arguments shared by every algorithm (digits is the default dataset).
# Every setting an algorithm's tuned defaults could change is given (docs/algorithms.md §0.2), so
# the numbers pin the code, not the defaults of the day.
COMMON = ["--dataset", "digits", "--clients", "6", "--rounds", "3", "--epochs", "1", "--seed", "0",
          "--partition", "dirichlet", "--alpha", "0.5", "--latency", "lan", "--lr", "0.15"]
# Per algorithm: what makes its run small and still non-trivial.
FEDSEQ = ["--pretrain-epochs", "1", "--min-samples", "300", "--max-clients", "3"]
EXTRA: dict[str, list[str]] = {
    "fedavg": [],
    "fedprox": ["--mu", "0.01"],
    "scaffold": ["--scaffold-option", "2"],
    "feddyn": ["--dyn-alpha", "0.1"],
    "standalone": [],
    "centralized": [],
    "fedseq": FEDSEQ + ["--superclient-fraction", "1.0"],
    "fedseq_inter": FEDSEQ + ["--superclient-fraction", "0.5", "--period", "3"],
    "factorized": [],
    "factorized_beta": [],
    "pfedpara": [],
    "cfl": ["--param", "warmup=1", "--param", "eps1=10", "--param", "eps2=0.1"],
    "fedfomo": ["--param", "m=3"],
    "perfedavg": ["--param", "beta=0.005"],
    "fedavgm": ["--server-lr", "1.0", "--server-momentum", "0.9"],
    "fedadam": ["--server-lr", "0.01", "--server-tau", "0.001"],
    "fedyogi": ["--server-lr", "0.01", "--server-tau", "0.001"],
    "fedadagrad": ["--server-lr", "0.1", "--server-tau", "0.001"],
    "fedasync": ["--concurrency", "3", "--buffer", "2", "--staleness", "polynomial",
                 "--param", "alpha=0.6", "--param", "a=0.5"],
    "fedbuff": ["--concurrency", "3", "--buffer", "2", "--staleness", "polynomial",
                "--param", "a=0.5", "--server-lr", "1.0"],
}
# Runs pinned beside the algorithms': name -> (algorithm, more arguments). --compress: every
# codec on FedAvg, and top-k's error feedback on a client state of its own (SCAFFOLD's).
VARIANTS: dict[str, tuple[str, list[str]]] = {
    "fedavg+fp16": ("fedavg", ["--compress", "fp16"]),
    "fedavg+int8": ("fedavg", ["--compress", "int8"]),
    "fedavg+qsgd": ("fedavg", ["--compress", "qsgd:16"]),
    "fedavg+topk": ("fedavg", ["--compress", "topk:0.01"]),
    "fedavg+sign": ("fedavg", ["--compress", "sign"]),
    "scaffold+topk": ("scaffold", ["--compress", "topk:0.05"]),
    "fedbuff+hetero": ("fedbuff", ["--latency", "hetero", "--deadline", "0.3"]),
    "fedasync+hinge": ("fedasync", ["--staleness", "hinge", "--param", "b=1", "--latency",
                                    "hetero", "--server-bandwidth", "20Mbit"]),
    "fedbuff+topk": ("fedbuff", ["--compress", "topk:0.05"]),
    "fedavg+down-int8": ("fedavg", ["--compress-down", "int8"]),
    "scaffold+down-fp16": ("scaffold", ["--compress-down", "fp16", "--compress", "topk:0.05"]),
    "fedbuff+down-qsgd": ("fedbuff", ["--compress-down", "qsgd:127", "--latency", "hetero"]),
    "fedseq+handoff-int8": ("fedseq", ["--compress-handoff", "int8", "--compress-down", "fp16"]),
    "fedseq_inter+handoff-qsgd": ("fedseq_inter", ["--compress-handoff", "qsgd:127"]),
    # differential privacy (docs/algorithms.md §10): DP-FedAvg with Poisson and fixed-size
    # sampling, adaptive clipping under a server optimizer, local DP, DP-SGD inside FedProx's
    # clients (the noise is tiny: these pin the mechanisms' arithmetic and streams, not privacy)
    "fedavg+dp-central": ("fedavg", ["--dp", "central", "--dp-noise", "0.1", "--dp-clip", "2",
                                     "--fraction", "0.5"]),
    "fedavg+dp-fixed": ("fedavg", ["--dp", "central", "--dp-noise", "0.1", "--dp-clip", "2",
                                   "--fraction", "0.5", "--dp-sampling", "fixed"]),
    "fedavgm+dp-adaptive": ("fedavgm", ["--dp", "central", "--dp-adaptive", "--dp-noise", "0.1",
                                        "--dp-count-noise", "1", "--dp-clip", "2"]),
    "fedavg+dp-local": ("fedavg", ["--dp", "local", "--dp-noise", "0.02", "--dp-clip", "2"]),
    "fedprox+dp-sgd": ("fedprox", ["--dp-sgd-noise", "1.0", "--dp-sgd-clip", "1.0"]),
}
SUMMARY_KEYS = ("status", "final_accuracy", "sim_time_s", "messages", "bytes")


def keys() -> list[str]:
    """Every pinned run: the algorithms of the CLI, then the VARIANTS."""
    from fednet.config import ALGORITHMS
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


def sha256_arrays(arrays: dict[str, Any]) -> str:
    """sha256 over sorted names: name, dtype, shape and the C-order bytes of each array."""
    h = hashlib.sha256()
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        h.update(f"{name}|{a.dtype.str}|{list(a.shape)}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def _tensors(prefix: str, obj: Any, out: dict[str, np.ndarray]) -> None:
    """The tensors and arrays inside a client's state (dataclass fields, dicts, lists, tuples),
    by path."""
    import dataclasses

    import torch

    if dataclasses.is_dataclass(obj):
        for f in dataclasses.fields(obj):
            _tensors(f"{prefix}/{f.name}", getattr(obj, f.name), out)
    elif isinstance(obj, torch.Tensor):
        out[prefix] = obj.detach().cpu().numpy()
    elif isinstance(obj, np.ndarray):
        out[prefix] = obj
    elif isinstance(obj, dict):
        for k in obj:
            _tensors(f"{prefix}/{k}", obj[k], out)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _tensors(f"{prefix}/{i}", v, out)


def client_arrays(dispatcher) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(every client's model state_dict, every client's tensor state), names prefixed by client.

    Reaches into the in-process runtime (InprocDispatcher.executors[cid].ctx); adapt this one
    function if that layout changes."""
    models: dict[str, np.ndarray] = {}
    state: dict[str, np.ndarray] = {}
    for cid, ex in sorted(dispatcher.executors.items()):
        for k, v in ex.ctx.model.state_dict().items():
            models[f"c{cid}/{k}"] = v.detach().cpu().numpy()
        _tensors(f"c{cid}", ex.ctx.state, state)
        if ex.codec.residual is not None:  # --compress's error feedback
            state[f"c{cid}/compress/residual"] = ex.codec.residual
    return models, state


@contextlib.contextmanager
def capture_dispatcher() -> Iterator[list]:
    """Record the InprocDispatcher that run_local creates (to read the clients afterwards)."""
    import fednet.core.inproc as inproc

    seen: list = []
    original = inproc.InprocDispatcher

    class Recording(original):  # type: ignore[misc, valid-type]
        def __init__(self, session) -> None:
            super().__init__(session)
            seen.append(self)

    inproc.InprocDispatcher = Recording
    try:
        yield seen
    finally:
        inproc.InprocDispatcher = original


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
    from fednet.config import PERSONAL
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
    from fednet.config import ALGORITHMS

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help=f"write {GOLDEN.relative_to(ROOT)}")
    ap.add_argument("--algos", nargs="+", choices=keys(), default=keys())
    ap.add_argument("--twice", action="store_true",
                    help="run each algorithm twice in this process and require identical records")
    ap.add_argument("--json", help="also write the fresh records (and timings) to this file")
    ap.add_argument("--write-env", action="store_true",
                    help="pin this environment's float results beside the main pin (its bytes, "
                         "messages and times must equal the main pin's)")
    ap.add_argument("--add", action="store_true",
                    help="pin only the runs golden.json lacks (new algorithms or VARIANTS), "
                         "leaving every pinned entry as it is: into the main pin and, when this "
                         "environment has an alternates entry, its float results there too")
    ns = ap.parse_args(args)
    if ns.add:
        return _add(ns.twice)
    if set(EXTRA) != set(ALGORITHMS):
        raise SystemExit(f"EXTRA covers {sorted(EXTRA)}, the CLI offers {sorted(ALGORITHMS)}")
    if (ns.write or ns.write_env) and ns.algos != keys():
        raise SystemExit("--write and --write-env regenerate every algorithm; drop --algos")
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
    other field is shown to equal the main pin (same code, other kernels)."""
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


def _add(twice: bool) -> int:
    """--add: run the keys the pin lacks and add them; nothing pinned changes."""
    old = load()
    new = [k for k in keys() if k not in old["algorithms"]]
    if not new:
        print("every run is pinned already; nothing added")
        return 0
    records: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="fednet-golden-") as tmp:
        for algo in new:
            rec = run(algo, Path(tmp) / algo)
            if twice and run(algo, Path(tmp) / f"{algo}-again") != rec:
                print(f"{algo}: NOT deterministic in one process; nothing written")
                return 1
            problems = scenario_problems(algo, rec)
            if problems:
                print(f"{algo}: trivial scenario: {problems}; nothing written")
                return 1
            records[algo] = {"command": command(algo), **rec}
            print(f"{algo:16s} {rec['model_sha256'][:12]}  acc {rec['final_accuracy']:.4f}")
    env = environment()
    alts = old.get("alternates", [])
    for alt in alts:
        if alt["environment"] == env:  # this machine's floats: the same numbers there
            alt["algorithms"].update({a: {k: r[k] for k in FLOAT_KEYS} for a, r in records.items()})
    GOLDEN.write_text(dumps({**old, "algorithms": {**old["algorithms"], **records},
                             "alternates": alts}) + "\n")
    print(f"added {len(records)} runs to {GOLDEN.relative_to(ROOT)} (their floats are this "
          "environment's; pin another environment's with --write-env there)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
