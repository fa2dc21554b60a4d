"""PNG plots of a run: accuracy vs round, vs simulated time, vs cumulative bytes."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from fednet.metrics.files import atomic_file  # noqa: E402


def _cum_bytes(rows: list[dict[str, Any]]) -> list[float]:
    out, tot = [], 0.0
    for r in rows:
        b = r.get("bytes_round", {})
        tot += b.get("server_to_client", 0) + b.get("client_to_server", 0) + b.get("client_to_client", 0)
        out.append(tot / 2**20)
    return out


def plot_run(out: Path, rows: list[dict[str, Any]], title: str = "") -> list[Path]:
    """Write accuracy_vs_round.png, accuracy_vs_sim_time.png, accuracy_vs_bytes.png."""
    acc = [100 * r["accuracy"] if r.get("accuracy") is not None else float("nan") for r in rows]
    axes = (("round", [r["round"] + 1 for r in rows], "round"),
            ("sim_time", [r["sim_s"] for r in rows], "simulated time (s)"),
            ("bytes", _cum_bytes(rows), "traffic on all links (MiB)"))
    paths = []
    for key, x, label in axes:
        fig, a = plt.subplots(figsize=(5.5, 3.8), constrained_layout=True)
        a.plot(x, acc, marker="o", ms=2.5, lw=1.2)
        a.set_xlabel(label)
        a.set_ylabel("test accuracy (%)")
        a.set_title(title or out.name, fontsize=9)
        a.grid(alpha=0.3)
        path = out / f"accuracy_vs_{key}.png"
        try:
            with atomic_file(path) as fh:  # a failed write keeps the previous plot
                fig.savefig(fh, format="png", dpi=110)
        finally:
            plt.close(fig)
        paths.append(path)
    return paths
