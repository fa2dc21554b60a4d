"""fednet's SecAgg+ beside Flower's (issue 38 item 5): the same job, one round of FedAvg, timed
side by side in one run, with and without secure aggregation.

    python3 benchmarks/flower_secagg.py [--cohorts 100 1000] [--flower-python /tmp/flwr-venv/bin/python]
        [--flower-actors 1] [--systems flower fednet] [--json F]

The job: a cohort of N clients (all of them in the round), a 60-256-10 perceptron (18,186
parameters), 1 local epoch of SGD, batch 8, lr 0.01, weight decay 4e-4 (fednet's default), each
client holding as many training samples as in fednet's synthetic-fedprox partition (read from
fednet's own Session). fednet: `python -m fednet.cli local --dataset synthetic-fedprox --model
bench_mlp --plugin benchmarks/secagg_plugin.py --secagg off|plus --latency none` (its clients one
after another in one process, one torch thread). Flower: this file run by --flower-python (a venv
with flwr[simulation] and torch: Flower is never imported by fednet's interpreter), a ServerApp
with DefaultWorkflow and FedAvg (plain) or SecAggPlusWorkflow (plus), a ClientApp with
secaggplus_mod, in Flower's simulation engine (Ray) with --flower-actors client actors, on
random float32 data of the same shapes and sizes (the work per client is the same; its values
are not). SecAgg+'s parameters are matched where the two protocols have the same knob:
fednet's neighbours k (fednet.secagg.graph.default_neighbours(N)) and threshold
floor(0.5 k) + 1 -> Flower's num_shares k + 1 (its count includes the share a client keeps:
the same k neighbours) and reconstruction_threshold floor(0.5 k) + 1; 16 bits -> Flower's
quantization_range 2^16; clipping 8.0; modulus 2^32; Flower's max_weight: the cohort's largest
sample count. The mismatches that remain are printed and written with the results.

Per cell: the process's wall seconds (start-up, data, the round, exit), the round's own seconds
(fednet: metrics.jsonl's wall_s, the training loop with its evaluation of the global model;
Flower: its fit workflow, timed in the ServerApp, and each SecAgg+ stage), and bytes. fednet's
are its ledger (summary.json "bytes", metrics.jsonl "bytes_by_stage": framed messages as sent).
Flower's simulation engine hands messages over in memory (through Ray), so there is no wire to
capture; a mod outside secaggplus_mod counts each message both ways, as the objects Flower's
gRPC transport would push (the deflated InflatableObjects of the message, without gRPC/HTTP2
framing and the transport's control calls) and as its records' count_bytes() (what Flower's own
message_size_mod logs).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib.runner import fednet_module, metrics, run, summary  # noqa: E402
from benchlib.util import ROOT, loadavg, machine, table, write_json  # noqa: E402

HERE = Path(__file__).resolve().parent
PLUGIN = str(HERE / "secagg_plugin.py")
DIM, HIDDEN, CLASSES = 60, 256, 10
BITS, CLIP, FRACTION = 16, 8.0, 0.5
STAGES = {"setup": "keys", "share_keys": "shares", "collect_masked_vectors": "input", "unmask": "unmask"}
"""Flower's SecAgg+ stages by the names of fednet's that do the same."""
MISMATCHES = [
    "Flower masks each client's weighted model, quantize(params * n / max_weight) with the weight"
    " n as an extra masked factor; fednet masks n * q(update), the update being the model minus"
    " the one the round began with (both in a 2^32 group, 16-bit quantization, clip 8.0)",
    "Flower's modulus is 2^32 at every cohort (max_weight scales the weights so the sum fits), its"
    " masked vector sent as int64 (8 bytes a value); fednet's is 2^32 when the cohort's samples"
    " x (2^16 - 1) fit, else 2^64 (field_bits: 64 at 1,000 clients here), sent as 4- or 8-byte words",
    "Flower's masks come from numpy's RandomState seeded with 32 bits folded from the key;"
    " fednet's from AES-256-CTR",
    "Flower's neighbours: a ring over a shuffled order (num_shares = k + 1, the client itself"
    " included); fednet's: a Harary graph H(k, n), the same degree k",
    "Flower's reconstruction_threshold counts among k + 1 shares, the client's own included;"
    " fednet's floor(0.5 k) + 1 among its k neighbours'",
    "Flower's clients train on random float32 data of fednet's shapes and per-client sizes, not"
    " on synthetic-fedprox itself; fednet evaluates the global model after the round, Flower"
    " does not (no evaluate_fn, fraction_evaluate 0)",
    "Flower runs its clients in --flower-actors Ray actors beside the ServerApp's thread;"
    " fednet local runs them one after another in its one process",
]


# ---- fednet's side (this interpreter) ------------------------------------------------------------
def cohort_sizes(n: int, seed: int) -> list[int]:
    """Each client's training samples in fednet's partition of synthetic-fedprox."""
    sys.path.insert(0, str(ROOT))
    from fednet.cli import RUN_DEFAULTS, local
    from fednet.cli.options import build_config
    from fednet.core.session import Session
    from fednet.data.partition import part_size

    opts = dict(local.make_context("local", []).params)
    opts.update(dataset="synthetic-fedprox", clients=n, fraction=1.0, rounds=1, epochs=1,
                batch_size=8, lr=0.01, latency="none", seed=seed)
    cfg = build_config(opts, dict(RUN_DEFAULTS, clients=n))
    parts = Session(cfg, quiet=True, write=False).parts
    return [part_size(parts, c) for c in range(n)]


def fednet_cell(tmp: Path, mode: str, n: int, seed: int) -> dict[str, Any]:
    out = tmp / f"fednet-{mode}-{n}"
    args = ["--dataset", "synthetic-fedprox", "--clients", str(n), "--fraction", "1", "--rounds",
            "1", "--epochs", "1", "--batch-size", "8", "--lr", "0.01", "--secagg", mode,
            "--secagg-bits", str(BITS), "--secagg-clip", str(CLIP), "--latency", "none",
            "--model", "bench_mlp", "--plugin", PLUGIN, "--seed", str(seed), "-q", "--out", str(out)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    r = run(fednet_module("local", *args), env=env)
    rec: dict[str, Any] = {"system": "fednet", "mode": mode, "cohort": n, "wall_s": r.wall_s}
    if r.rc != 0:
        return {**rec, "status": f"rc {r.rc}", "notes": r.stderr[-800:]}
    s, row = summary(out), metrics(out)[-1]
    b = s["bytes"]
    return {**rec, "status": s["status"], "round_s": row["wall_s"],
            "bytes": {"server_to_client": b["server_to_client"], "client_to_server": b["client_to_server"]},
            "bytes_by_stage": row.get("bytes_by_stage", {}), "server_cpu_s": row.get("secagg_server_s", {}),
            "clients_cpu_s": row.get("secagg_client_s", {}), "field_bits": row.get("secagg_field_bits"),
            "accuracy": row.get("accuracy"), "_model": str(out / "final_model.npz"),
            "notes": "bytes: fednet's ledger (framed messages as sent); round_s: metrics.jsonl wall_s "
                     "(the round and the global model's evaluation)"}


def flower_cell(tmp: Path, a: argparse.Namespace, mode: str, sizes: list[int], k: int) -> dict[str, Any]:
    n = len(sizes)
    spec = {"mode": mode, "sizes": sizes, "k": k, "threshold": math.floor(FRACTION * k) + 1,
            "actors": a.flower_actors, "seed": a.seed, "log": str(tmp / f"flower-{mode}-{n}.bytes"),
            "result": str(tmp / f"flower-{mode}-{n}.json"), "model": str(tmp / f"flower-{mode}-{n}.npz")}
    (tmp / f"flower-{mode}-{n}.spec").write_text(json.dumps(spec))
    env = {k_: v for k_, v in os.environ.items() if k_ != "PYTHONPATH"}
    r = run([a.flower_python, str(Path(__file__).resolve()), "--flower-child",
             str(tmp / f"flower-{mode}-{n}.spec")], env=env, cwd=tmp)
    rec: dict[str, Any] = {"system": "flower", "mode": mode, "cohort": n, "wall_s": r.wall_s}
    if r.rc != 0 or not Path(spec["result"]).exists():
        return {**rec, "status": f"rc {r.rc}", "notes": (r.stderr or r.stdout)[-1500:]}
    res = json.loads(Path(spec["result"]).read_text())
    stages: dict[str, dict[str, int]] = {}
    for line in Path(spec["log"]).read_text().splitlines():
        m = json.loads(line)
        if m["stage"] == "get_properties":  # the warm-up, before the round
            continue
        st = stages.setdefault(m["stage"], {"server_to_client": 0, "client_to_server": 0,
                                            "content_down": 0, "content_up": 0, "messages": 0})
        st["server_to_client"] += m["down"]
        st["client_to_server"] += m["up"]
        st["content_down"] += m["content_down"]
        st["content_up"] += m["content_up"]
        st["messages"] += 1
    total = {d: sum(v[d] for v in stages.values()) for d in ("server_to_client", "client_to_server")}
    return {**rec, **res, "status": "completed" if res.get("ok") else "failed", "bytes": total,
            "_model": spec["model"],
            "bytes_by_stage": stages,
            "notes": "no wire in Flower's simulation engine: bytes are the deflated objects Flower's "
                     "gRPC transport would push per message (no gRPC/HTTP2 framing, no control calls), "
                     "counted by a ClientApp mod; round_s: the fit workflow, timed in the ServerApp"}


def max_abs_diff(a: str, b: str) -> float | None:
    """The largest difference between two saved models' values (SecAgg+'s aggregate against
    plain FedAvg's: within its quantization, when secure aggregation unmasked the sum)."""
    import numpy as np

    if not (Path(a).exists() and Path(b).exists()):
        return None
    with np.load(a, allow_pickle=False) as x, np.load(b, allow_pickle=False) as y:
        xs = [x[k] for k in sorted(x.files) if x[k].dtype.kind == "f"]
        ys = [y[k] for k in sorted(y.files) if y[k].dtype.kind == "f"]
        return float(max(np.abs(u.astype(np.float64) - v).max() for u, v in zip(xs, ys)))


# ---- Flower's side (run by --flower-python; imports flwr and torch, never fednet) -----------------
def flower_child(spec_path: str) -> None:
    import logging

    import numpy as np
    import torch
    from flwr.client import ClientApp, NumPyClient
    from flwr.client.mod import secaggplus_mod
    from flwr.app import ConfigRecord, Context, Message
    from flwr.common import GetPropertiesIns, ndarrays_to_parameters, parameters_to_ndarrays
    from flwr.common.constant import MessageTypeLegacy
    from flwr.compat.common import recorddict_compat as compat
    from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key
    from flwr.server import LegacyContext, ServerApp, ServerConfig
    from flwr.server.strategy import FedAvg
    from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow
    from flwr.server.workflow.constant import MAIN_PARAMS_RECORD
    from flwr.server.workflow.default_workflows import default_fit_workflow
    from flwr.simulation import run_simulation
    from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects

    spec = json.loads(Path(spec_path).read_text())
    sizes, n, plus = spec["sizes"], len(spec["sizes"]), spec["mode"] == "plus"
    out: dict[str, Any] = {"ok": False, "stage_s": {}}

    def model() -> torch.nn.Module:
        return torch.nn.Sequential(torch.nn.Linear(DIM, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, CLASSES))

    class Client(NumPyClient):
        def __init__(self, cid: int) -> None:
            self.cid = cid

        def fit(self, parameters, config):  # type: ignore[no-untyped-def]
            torch.set_num_threads(1)
            net = model()
            with torch.no_grad():
                for p, v in zip(net.parameters(), parameters):
                    p.copy_(torch.from_numpy(np.asarray(v)))
            m = sizes[self.cid]
            g = np.random.default_rng([spec["seed"], self.cid])
            x = torch.from_numpy(g.standard_normal((m, DIM), dtype=np.float32))
            y = torch.from_numpy(g.integers(0, CLASSES, m))
            opt = torch.optim.SGD(net.parameters(), lr=0.01, weight_decay=4e-4)
            order = torch.randperm(m, generator=torch.Generator().manual_seed(self.cid))
            for i in range(0, m, 8):
                idx = order[i:i + 8]
                opt.zero_grad()
                torch.nn.functional.cross_entropy(net(x[idx]), y[idx]).backward()
                opt.step()
            return [p.detach().numpy().copy() for p in net.parameters()], m, {}

    def client_fn(context: Context):  # type: ignore[no-untyped-def]
        return Client(int(context.node_config["partition-id"])).to_client()

    def wire(msg) -> int:  # type: ignore[no-untyped-def]
        return sum(len(o.deflate()) for o in get_all_nested_objects(msg).values())

    def content(msg) -> int:  # type: ignore[no-untyped-def]
        """Its records' count_bytes(), what message_size_mod logs; an empty list left out (Flower
        1.42's ConfigRecord.count_bytes() raises IndexError on one: SecAgg+'s unmask stage sends
        an empty dead-node list)."""
        if not msg.has_content():
            return 0
        return sum((ConfigRecord({k: v for k, v in r.items() if v != []}) if isinstance(r, ConfigRecord)
                    else r).count_bytes() for r in msg.content.values())

    def count_mod(msg, ctx, call_next):  # type: ignore[no-untyped-def]
        cfg = msg.content.config_records.get(RECORD_KEY_CONFIGS) if msg.has_content() else None
        stage = str(cfg.get(Key.STAGE)) if cfg is not None and Key.STAGE in cfg else \
            str(msg.metadata.message_type)
        stage = STAGES.get(stage, stage)
        down, cdown = wire(msg), content(msg)  # before secaggplus_mod pops the stage from it
        reply = call_next(msg, ctx)
        line = json.dumps({"stage": stage, "down": down, "up": wire(reply), "content_down": cdown,
                           "content_up": content(reply)})
        with open(spec["log"], "a") as f:  # one short line per write: appends do not interleave
            f.write(line + "\n")
        return reply

    client_app = ClientApp(client_fn=client_fn, mods=[count_mod, secaggplus_mod] if plus else [count_mod])

    class TimedSecAggPlus(SecAggPlusWorkflow):
        def _timed(self, name, fn, *args):  # type: ignore[no-untyped-def]
            t = time.perf_counter()
            ok = fn(*args)
            out["stage_s"][name] = time.perf_counter() - t
            return ok

        def setup_stage(self, *args):  # type: ignore[no-untyped-def]
            return self._timed("keys", super().setup_stage, *args)

        def share_keys_stage(self, *args):  # type: ignore[no-untyped-def]
            return self._timed("shares", super().share_keys_stage, *args)

        def collect_masked_vectors_stage(self, *args):  # type: ignore[no-untyped-def]
            return self._timed("input", super().collect_masked_vectors_stage, *args)

        def unmask_stage(self, *args):  # type: ignore[no-untyped-def]
            ok = self._timed("unmask", super().unmask_stage, *args)
            out["ok"] = bool(ok)
            return ok

    fit = (TimedSecAggPlus(num_shares=spec["k"] + 1, reconstruction_threshold=spec["threshold"],
                           max_weight=float(max(sizes)), clipping_range=CLIP,
                           quantization_range=2 ** BITS, modulus_range=2 ** 32) if plus else default_fit_workflow)

    def timed_fit(grid, context):  # type: ignore[no-untyped-def]
        t = time.perf_counter()
        fit(grid, context)
        out["round_s"] = time.perf_counter() - t
        out["ok"] = out["ok"] or not plus

    server_app = ServerApp()

    @server_app.main()
    def main(grid, context):  # type: ignore[no-untyped-def]
        torch.manual_seed(spec["seed"])
        init = ndarrays_to_parameters([p.detach().numpy() for p in model().parameters()])
        strategy = FedAvg(fraction_fit=1.0, fraction_evaluate=0.0, min_fit_clients=n,
                          min_evaluate_clients=0, min_available_clients=n, initial_parameters=init)
        legacy = LegacyContext(context=context, config=ServerConfig(num_rounds=1), strategy=strategy)
        t = time.perf_counter()  # warm-up: Ray starts its actors and loads the ClientApp on the
        while len(grid.get_node_ids()) < n:  # first message each gets (seconds); one query to
            time.sleep(0.1)  # every node first, so that the round is timed warm, as fednet's is
        ping = compat.getpropertiesins_to_recorddict(GetPropertiesIns({}))
        grid.send_and_receive([Message(ping, dst_node_id=nid, message_type=MessageTypeLegacy.GET_PROPERTIES)
                               for nid in grid.get_node_ids()])
        out["warmup_s"] = time.perf_counter() - t
        t = time.perf_counter()
        DefaultWorkflow(fit_workflow=timed_fit)(grid, legacy)
        out["main_s"] = time.perf_counter() - t
        final = compat.arrayrecord_to_parameters(legacy.state.array_records[MAIN_PARAMS_RECORD], True)
        np.savez(spec["model"], *parameters_to_ndarrays(final))  # (npz: no pickle)

    logging.getLogger("flwr").setLevel(os.environ.get("FLOWER_SECAGG_LOG", "WARNING"))  # INFO: its rounds
    t0 = time.perf_counter()
    run_simulation(server_app=server_app, client_app=client_app, num_supernodes=n,
                   backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                                   "init_args": {"num_cpus": spec["actors"], "num_gpus": 0,
                                                 "object_store_memory": 256 * 2 ** 20,
                                                 "include_dashboard": False}})
    import flwr

    out.update(simulation_s=time.perf_counter() - t0, flwr=flwr.__version__, torch=torch.__version__,
               num_shares=spec["k"] + 1, reconstruction_threshold=spec["threshold"])
    Path(spec["result"]).write_text(json.dumps(out))


# ---- the run ---------------------------------------------------------------------------------------
def flower_versions(python: str) -> dict[str, str]:
    r = run([python, "-c", "import json, flwr, torch, ray; print(json.dumps({'flwr': flwr.__version__, "
             "'torch': torch.__version__, 'ray': ray.__version__}))"])
    return r.last_json if r.rc == 0 else {"error": r.stderr[-300:]}


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--flower-child":
        flower_child(sys.argv[2])
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cohorts", type=int, nargs="+", default=[100, 1000])
    ap.add_argument("--flower-python", default="/tmp/flwr-venv/bin/python",
                    help="an interpreter with flwr[simulation] and torch (a separate venv)")
    ap.add_argument("--flower-actors", type=int, default=1,
                    help="Ray actors running Flower's clients (fednet local: one process)")
    ap.add_argument("--systems", nargs="+", default=["flower", "fednet"], choices=["flower", "fednet"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json")
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    import fednet
    from fednet.secagg.graph import default_neighbours

    versions = {"fednet": getattr(fednet, "__version__", "?"), **flower_versions(a.flower_python)} \
        if "flower" in a.systems else {"fednet": getattr(fednet, "__version__", "?")}
    print("versions:", versions)
    cells: list[dict[str, Any]] = []
    params: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp_:
        tmp = Path(tmp_)
        for n in a.cohorts:
            sizes, k = cohort_sizes(n, a.seed), default_neighbours(n)
            params[str(n)] = {"fednet_neighbours": k, "fednet_threshold": math.floor(FRACTION * k) + 1,
                              "flower_num_shares": k + 1, "flower_reconstruction_threshold":
                              math.floor(FRACTION * k) + 1, "flower_max_weight": max(sizes),
                              "samples": sum(sizes)}
            print(f"cohort {n}: fednet default_neighbours({n}) = {k}; {params[str(n)]}", flush=True)
            for mode in ("off", "plus"):
                for system in a.systems:
                    t = time.perf_counter()
                    rec = (flower_cell(tmp, a, mode, sizes, k) if system == "flower"
                           else fednet_cell(tmp, mode, n, a.seed))
                    rec["loadavg_after"] = loadavg()  # the machine is shared: how busy it was
                    off = next((c for c in cells if c["system"] == system and c["cohort"] == n), None)
                    if mode == "plus" and off and "_model" in off and "_model" in rec:
                        rec["max_abs_diff_vs_off"] = max_abs_diff(rec["_model"], off["_model"])
                    cells.append(rec)
                    print(f"  {system:6s} {mode:4s} {n:5d}: {rec['status']}, wall {rec['wall_s']:.1f} s, "
                          f"round {rec.get('round_s', float('nan')):.2f} s ({time.perf_counter() - t:.0f} s)",
                          flush=True)
                    if not str(rec["status"]).startswith("completed"):
                        print("   ", rec.get("notes", ""))
    rows = []
    for c in cells:
        b = c.get("bytes") or {}
        base = next((x for x in cells if x["system"] == c["system"] and x["cohort"] == c["cohort"]
                     and x["mode"] == "off"), None)
        add = c["round_s"] - base["round_s"] if base and "round_s" in c and "round_s" in base else float("nan")
        per = [round(b.get(d, 0) / c["cohort"]) for d in ("client_to_server", "server_to_client")]
        diff = c.get("max_abs_diff_vs_off")
        rows.append([c["system"], c["mode"], c["cohort"], c["status"], round(c["wall_s"], 2),
                     round(c.get("round_s", float("nan")), 2), round(add, 2) if c["mode"] == "plus" else "", *per,
                     f"{diff:.1e}" if diff is not None else ""])
    print(table(["system", "secagg", "cohort", "status", "wall s", "round s", "+round s", "up B/client",
                 "down B/client", "max|plus-off|"], rows))
    stage_rows = [[c["system"], c["cohort"], st, v.get("client_to_server", 0), v.get("server_to_client", 0),
                   round(c.get("stage_s", {}).get(st, float("nan")), 2)]
                  for c in cells if c["mode"] == "plus" for st, v in (c.get("bytes_by_stage") or {}).items()]
    print(table(["system", "cohort", "stage", "up B", "down B", "Flower stage s"], stage_rows))
    print("mismatches:\n- " + "\n- ".join(MISMATCHES))
    for c in cells:
        c.pop("_model", None)
    write_json(a.json, {"machine": machine(), "versions": versions, "args": vars(a), "parameters": params,
                        "mismatches": MISMATCHES, "cells": cells}, [])


if __name__ == "__main__":
    main()
