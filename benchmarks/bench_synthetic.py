"""synthetic-cifar10 is learnable, and its partitions matter: the test accuracy of FedAvg with the
FedSeq CNN over a few rounds, IID against one class per client (shards), in one script with the
same options (`fednet local`, seeded, explicit --epochs/--lr/--batch-size so no tuned default
differs between the two), and a nearest-class-mean classifier's accuracy as a reference.

    python3 benchmarks/bench_synthetic.py [--rounds 8] [--clients 20] [--fraction 0.2] [--json F]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _util import headline_row, machine, measured, table, write_json  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def nearest_mean() -> float:
    """Test accuracy of the class means of the training images (a linear reference)."""
    import numpy as np

    from fednet.data import load_dataset

    ds = load_dataset("synthetic-cifar10")
    x, y = ds.train_x.reshape(len(ds.train_y), -1), ds.train_y
    mu = np.stack([x[y == c].mean(0) for c in range(ds.num_classes)])
    xt = ds.test_x.reshape(len(ds.test_y), -1)
    return float((np.argmin(-2 * xt @ mu.T + (mu ** 2).sum(1), 1) == ds.test_y).mean())


def run(partition: str, a: argparse.Namespace, cache: str) -> dict:
    out = Path(tempfile.mkdtemp(prefix=f"bench_synthetic_{partition}_"))
    argv = [sys.executable, "-c", "from fednet.cli import main; main()", "local",
            "--dataset", "synthetic-cifar10", "--partition", partition, "--clients", str(a.clients),
            "--fraction", str(a.fraction), "--rounds", str(a.rounds), "--epochs", "1",
            "--lr", str(a.lr), "--batch-size", "32", "--seed", "0", "--out", str(out), "-q"]
    t0 = time.perf_counter()
    subprocess.run(argv, cwd=ROOT, env=dict(os.environ, FEDNET_CACHE=cache), check=True)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return {"partition": partition, "wall_s": time.perf_counter() - t0,
            "accuracy": [r.get("accuracy") for r in rows]}


def headline(data: dict) -> list[dict]:
    """The dashboard's rows: FedAvg's last accuracy, IID against shards, and the nearest class
    mean's (synthetic-cifar10 is learnable and its partitions matter)."""
    runs = {r["partition"]: r["accuracy"] for r in data.get("runs", [])}
    a = data.get("args", {})
    last = {k: next((x for x in reversed(v) if x is not None), None) for k, v in runs.items()}
    return measured(
        headline_row("accuracy", f"synthetic-cifar10, FedAvg (FedSeq CNN), IID: the last "
                     f"accuracy, rounds: {a.get('rounds')}", last.get("iid"), "", "",
                     f"shards (one class per client) {last.get('shards') or 0:.3f}; "
                     f"{a.get('clients')} clients, fraction {a.get('fraction')}"),
        headline_row("accuracy", "synthetic-cifar10: nearest class mean on the raw pixels",
                     data.get("nearest_mean"), "", "", "a linear reference"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--fraction", type=float, default=0.2)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    info = machine()
    cache = os.environ.get("FEDNET_CACHE") or tempfile.mkdtemp(prefix="bench_synthetic_cache_")
    os.environ["FEDNET_CACHE"] = cache
    ref = nearest_mean()
    runs = [run(p, a, cache) for p in ("iid", "shards")]
    print(f"synthetic-cifar10, FedAvg, FedSeq CNN, {a.clients} clients, fraction {a.fraction}, "
          f"1 epoch, lr {a.lr}, batch 32; nearest class mean: {ref:.3f}")
    print(table(["round"] + [r["partition"] for r in runs],
                [[i] + [r["accuracy"][i] for r in runs] for i in range(a.rounds)]))
    print("wall s: " + ", ".join(f"{r['partition']} {r['wall_s']:.0f}" for r in runs))
    data = {"machine": info, "nearest_mean": ref, "runs": runs, "args": vars(a)}
    write_json(a.json, data, headline(data))


if __name__ == "__main__":
    main()
