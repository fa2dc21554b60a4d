"""Reference aggregates from Flower's own robust rules, for tests/test_robust_flower.py.

    python3 -m venv /tmp/flwr && /tmp/flwr/bin/pip install flwr numpy
    /tmp/flwr/bin/python benchmarks/flower_reference.py --write   # tests/golden/flower_robust.json

Each case is a list of client models (a few arrays each, seeded normal values plus outliers
that play the attackers) and what Flower's `flwr.server.strategy.aggregate` functions return for
them: aggregate_krum (Krum, and Multi-Krum with to_keep), aggregate_bulyan (over Krum),
aggregate_median and aggregate_trimmed_avg. Flower is only imported here, never by fednet; the
JSON keeps the inputs, the outputs (floats written with repr, so exact), the Flower version and
this command. Without --write it prints the largest difference between fednet's rules
(fednet/algorithms/robust.py, run on the same flattened vectors) and Flower's.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "golden" / "flower_robust.json"
SHAPES = [(3, 4), (5,)]
# (name, clients, f, attackers, Multi-Krum's to_keep, trimmed mean's proportiontocut)
CASES = [("small", 7, 1, 1, 4, 0.2), ("medium", 11, 2, 2, 6, 0.2), ("large", 23, 5, 5, 12, 0.25)]


def inputs(seed: int, n: int, bad: int) -> list[list[np.ndarray]]:
    """n client models: honest ones around a common mean, `bad` of them shifted far away."""
    gen = np.random.default_rng(seed)
    center = [gen.normal(size=s) for s in SHAPES]
    out = []
    for i in range(n):
        shift = 8.0 if i < bad else 0.0
        out.append([c + shift + 0.5 * gen.normal(size=c.shape) for c in center])
    return out


def flower(models: list[list[np.ndarray]], f: int, keep: int, cut: float) -> dict[str, list]:
    """Flower's aggregates of `models` (equal num_examples: Flower's Multi-Krum weights by them)."""
    from flwr.server.strategy import aggregate as fa

    res = [(m, 10) for m in models]
    flat = lambda ws: np.concatenate([np.asarray(w).ravel() for w in ws]).tolist()  # noqa: E731
    return {"krum": flat(fa.aggregate_krum(res, f, 0)),
            "multikrum": flat(fa.aggregate_krum(res, f, keep)),
            "bulyan": flat(fa.aggregate_bulyan(list(res), f, fa.aggregate_krum, to_keep=0)),
            "median": flat(fa.aggregate_median(res)),
            "trimmed_mean": flat(fa.aggregate_trimmed_avg(res, cut))}


def fednet_rules(x: np.ndarray, f: int, keep: int, cut: float) -> dict[str, np.ndarray]:
    """fednet's rules on the same vectors (rows: the clients' flattened models)."""
    sys.path.insert(0, str(ROOT))
    from fednet.algorithms import robust as R

    return {"krum": R.krum(x, f)[0], "multikrum": R.multi_krum(x, f, keep)[0],
            "bulyan": R.bulyan(x, f)[0], "median": R.median(x),
            "trimmed_mean": R.trimmed_mean(x, int(cut * len(x)))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help=f"write {FIXTURE.relative_to(ROOT)}")
    ns = ap.parse_args()
    import flwr

    cases = []
    for k, (name, n, f, bad, keep, cut) in enumerate(CASES):
        models = inputs(k, n, bad)
        x = np.stack([np.concatenate([a.ravel() for a in m]) for m in models])
        want = flower(models, f, keep, cut)
        ours = fednet_rules(x, f, keep, cut)
        worst = max(float(np.abs(np.array(want[r]) - ours[r]).max()) for r in want)
        print(f"{name}: n={n} f={f} largest |fednet - flower| = {worst:.3g}")
        cases.append({"name": name, "f": f, "keep": keep, "cut": cut, "shapes": SHAPES,
                      "models": x.tolist(), "flower": want})
    if ns.write:
        doc = {"flwr": flwr.__version__, "numpy": np.__version__,
               "command": "python benchmarks/flower_reference.py --write (in a venv with flwr)",
               "cases": cases}
        FIXTURE.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {FIXTURE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
