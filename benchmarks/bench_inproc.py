"""fednet local's round against a plain PyTorch loop's, in one process each (issue 43 item 3).

    python3 benchmarks/bench_inproc.py [--clients 100] [--rounds 10] [--epochs 1 5] [--reps 3]
        [--dataset digits] [--also NAME=PATH ...] [--json F]

For each --epochs value, side by side in one interleaved run (loop, local, loop, local, ...:
--reps of each): benchmarks/plain_loop.py and `fednet local`, both FedAvg over every client every
round (--fraction 1) on the same data, model and training settings, each in a fresh process
that imports this checkout's fednet (PYTHONPATH). A run's steady round is the median of its
rounds after the first (the first pays one-time costs: the loop's torch.optim imports
torch._dynamo at its first step, fednet builds each client's executor); the loop's rounds are
its own timings (training and the test of the global model), fednet's the differences of
metrics.jsonl's wall_s (the same, plus aggregation, accounting and the row). Reported per
system: the median of its runs' steady rounds and fednet's over the loop's; `--also NAME=PATH`
adds another fednet checkout to the same interleaving (e.g. the commit before a change:
`git archive C | tar -x -C PATH`).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from benchlib.runner import metrics, run  # noqa: E402
from benchlib.util import git_state, headline_row, machine, measured, median, table, write_json  # noqa: E402


def _env(root: Path) -> dict[str, str]:
    """The environment that makes a child import fednet from `root`."""
    return {**os.environ, "PYTHONPATH": str(root)}


def loop_run(a: argparse.Namespace, epochs: int) -> dict[str, Any]:
    """One plain-loop process: its steady round and its accuracy."""
    r = run([sys.executable, str(HERE / "plain_loop.py"), "--dataset", a.dataset, "--clients",
             str(a.clients), "--fraction", "1", "--rounds", str(a.rounds), "--epochs",
             str(epochs), "--seed", "0"], env=_env(ROOT), check=True)
    got = r.last_json
    return {"rounds_s": got["round_s"], "round_s": median(got["round_s"][1:] or got["round_s"]),
            "accuracy": got["accuracy"], "seconds": r.wall_s}


def local_run(a: argparse.Namespace, epochs: int, root: Path, out: Path) -> dict[str, Any]:
    """One `fednet local` process of the checkout at `root`: its steady round and accuracy."""
    r = run([sys.executable, "-m", "fednet.cli", "local", "--dataset", a.dataset, "--clients",
             str(a.clients), "--fraction", "1", "--rounds", str(a.rounds), "--epochs",
             str(epochs), "--seed", "0", "-q", "--out", str(out)], env=_env(root), cwd=root,
            check=True)
    walls = [row["wall_s"] for row in metrics(out)]
    rounds = [b - c for c, b in zip([0.0] + walls, walls)]
    return {"rounds_s": rounds, "round_s": median(rounds[1:] or rounds),
            "accuracy": metrics(out)[-1]["accuracy"], "seconds": r.wall_s}


def measure(a: argparse.Namespace, epochs: int, tmp: Path) -> dict[str, Any]:
    """--reps runs of each system for one --epochs value, interleaved."""
    systems = {"loop": None, "local": ROOT, **{n: Path(p).resolve() for n, p in a.also}}
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in systems}
    for i in range(a.reps):
        for name, root in systems.items():
            r = (loop_run(a, epochs) if root is None
                 else local_run(a, epochs, root, tmp / f"{name}{epochs}_{i}"))
            runs[name].append(r)
            print(f"  epochs {epochs} rep {i} {name}: steady round {r['round_s']:.3f} s",
                  file=sys.stderr, flush=True)
    loop = median([r["round_s"] for r in runs["loop"]])
    out: dict[str, Any] = {"epochs": epochs, "runs": runs, "round_s": {}, "vs_loop": {}}
    for name in systems:
        out["round_s"][name] = median([r["round_s"] for r in runs[name]])
        out["vs_loop"][name] = out["round_s"][name] / loop
    return out


def headline(data: dict[str, Any]) -> list[dict[str, Any]]:
    a = data["args"]
    rows = []
    for m in data["results"]:
        loop, local = m["round_s"]["loop"], m["round_s"]["local"]
        per = ", ".join(f"{x['round_s'] / y['round_s']:.2f}"
                        for x, y in zip(m["runs"]["local"], m["runs"]["loop"]))
        also = "".join(f"; {n} {m['round_s'][n]:.3f} s, {m['vs_loop'][n]:.2f}x"
                       for n in m["round_s"] if n not in ("loop", "local"))
        rows.append(headline_row(
            "scale", f"fednet local steady round / a plain PyTorch loop's, {a['dataset']} "
            f"{a['clients']} clients, {a['rounds']} rounds, {m['epochs']} epoch(s)",
            m["vs_loop"]["local"], "x", "<= 1.0x",
            f"{local:.3f} s against {loop:.3f} s, medians of {a['reps']} interleaved runs each "
            f"(pairs {per}){also}"))
    return measured(*rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--epochs", type=int, nargs="+", default=[1, 5])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dataset", default="digits")
    ap.add_argument("--also", nargs="*", default=[], type=lambda s: tuple(s.split("=", 1)),
                    metavar="NAME=PATH", help="another fednet checkout, timed beside this one")
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args()
    if any(len(x) != 2 for x in a.also):
        ap.error("--also takes NAME=PATH")
    with tempfile.TemporaryDirectory() as tmp:
        results = [measure(a, e, Path(tmp)) for e in a.epochs]
    names = list(results[0]["round_s"]) if results else []
    print(table(["epochs", *[f"{n} round s" for n in names], *[f"{n} x loop" for n in names[1:]]],
                [[m["epochs"], *[m["round_s"][n] for n in names],
                  *[m["vs_loop"][n] for n in names[1:]]] for m in results]))
    data = {"machine": machine(), "commit": git_state(),
            "args": {**vars(a), "also": [list(x) for x in a.also]}, "results": results}
    write_json(a.json, data, headline(data))


if __name__ == "__main__":
    main()
