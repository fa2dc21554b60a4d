"""What a checkpoint costs with a big model: seconds and bytes of each `checkpoint.save` against
the round it follows, for ResNet-18 (11.2 M parameters, 44.7 MB a copy) on CIFAR-shaped data.
A run writes one when interrupted (Ctrl-C, SIGTERM) and, with --checkpoint-every N, every N
rounds (issue 24 item 1). BENCHMARKS.md names the command and commit of each figure.

    python3 benchmarks/bench_checkpoint.py [--algos fedavg,scaffold] [--rounds 3] [--json F]

Each algorithm runs in-process (fednet.api.run, `fednet local`) with --checkpoint-every 1;
checkpoint.save is timed around each call; the round's wall-clock comes from metrics.jsonl.
SCAFFOLD adds a control variate per client (client state files gathered into the checkpoint).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _util import headline_row, machine, measured, table, write_json  # noqa: E402


def _size(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def measure(algo: str, args: argparse.Namespace, root: Path) -> dict:
    from fednet import api
    from fednet.core import checkpoint

    calls: list[float] = []
    real = checkpoint.save

    def timed(*a, **kw):
        t0 = time.perf_counter()
        real(*a, **kw)
        calls.append(time.perf_counter() - t0)

    checkpoint.save = timed
    try:
        out = root / algo
        exp = api.run(algo=algo, dataset="synthetic-cifar10", model="resnet18",
                      clients=args.clients, fraction=args.fraction, rounds=args.rounds, epochs=1,
                      batch_size=32, lr=0.05, checkpoint_every=1, out=str(out), seed=0)
    finally:
        checkpoint.save = real
    walls = [r["wall_s"] for r in exp.history]
    rounds = [b - a for a, b in zip([0.0] + walls, walls)][1:]  # round 0 also holds the setup
    ck = out / "checkpoint"
    return {"algo": algo, "checkpoints": len(calls), "save_s_median": statistics.median(calls),
            "save_s": calls, "round_s_median": statistics.median(rounds),
            "checkpoint_bytes": _size(ck), "state_npz_bytes": (ck / "state.npz").stat().st_size,
            "final_accuracy": exp.summary.get("final_accuracy")}


def headline(data: dict) -> list[dict]:
    """The dashboard's rows: per algorithm, one checkpoint.save (median) with ResNet-18."""
    return measured(*(headline_row(
        "checkpoint", f"{r['algo']}: one checkpoint.save, ResNet-18", r["save_s_median"], "s",
        "", f"{r['checkpoint_bytes'] / 2**20:.1f} MiB on disk; "
        f"{100 * r['save_s_median'] / r['round_s_median']:.1f}% of a round "
        f"({r['round_s_median']:.1f} s, median of {r['checkpoints']})")
        for r in data.get("results", [])[:4]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--algos", default="fedavg,scaffold")
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--fraction", type=float, default=0.04)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    res = []
    with tempfile.TemporaryDirectory() as tmp:
        for algo in args.algos.split(","):
            res.append(measure(algo, args, Path(tmp)))
            r = res[-1]
            print(f"{algo}: {r['checkpoints']} checkpoints, {r['save_s_median']:.2f} s each, "
                  f"{r['checkpoint_bytes'] / 2**20:.1f} MiB; a round {r['round_s_median']:.1f} s",
                  flush=True)
    rows = [[r["algo"], r["checkpoints"], r["save_s_median"], r["checkpoint_bytes"] / 2**20,
             r["round_s_median"], r["save_s_median"] / r["round_s_median"]] for r in res]
    print(table(["algorithm", "checkpoints", "save (s, median)", "size (MiB)",
                 "round (s, median)", "save / round"], rows))
    data = {"machine": machine(), "args": vars(args), "results": res}
    write_json(args.json or None, data, headline(data))


if __name__ == "__main__":
    main()
