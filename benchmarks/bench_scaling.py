"""Scaling: wall-clock, start-up and memory of `fednet launch` against `fednet local` as the number
of clients grows (10, 50, 100, 200, 500), measured side by side in one run.

    python3 benchmarks/bench_scaling.py [--clients 10 50 100 200 500] [--rounds 3] [--epochs 1]
                                        [--algo fedavg] [--per-process 1] [--plot benchmarks/scaling.png] [--json F]

Each size runs `fednet launch` then `fednet local` with the same seed and configuration (digits,
IID, `--epochs` local epochs); the table gives the training wall-clock of both and their ratio
(also without round 0, whose first task costs every fresh client process extra page faults),
the whole commands' wall-clock, the time until every client registered, the clients' total PSS
after training, and checks that both runtimes ended with the same accuracy.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import runner  # noqa: E402
from benchlib.util import headline_row, measured, write_json  # noqa: E402


def run(cmd: str, n: int, args: argparse.Namespace, out: Path) -> dict:
    """One fednet command; its summary plus the whole command's seconds."""
    argv = runner.fednet_module(cmd, "--clients", str(n), "--rounds", str(args.rounds), "--epochs",
                                str(args.epochs), "--algo", args.algo, "--seed", "0", "-q", "--out",
                                str(out), "--register-timeout", "120")
    if cmd == "launch" and args.per_process > 1:
        argv += ["--clients-per-process", str(args.per_process)]
    done = runner.run(argv, check=True)
    s = runner.summary(out)
    s["command_s"] = done.wall_s
    rows = runner.metrics(out)
    s["after_round0_s"] = rows[-1]["wall_s"] - rows[0]["wall_s"] if len(rows) > 1 else float("nan")
    return s


def headline(data: dict) -> list[dict]:
    """The dashboard's rows at the most clients: launch / local training wall-clock, registration
    and client memory (BENCHMARKS section 8's targets at 500 clients: <= 1.2x, <= 10 s, <= 12 GB;
    the ratio's also at 100)."""
    res, a = data.get("results", []), data.get("args", {})
    if not res:
        return []
    r = max(res, key=lambda r: r["clients"])
    n = r["clients"]
    what = (f"{a.get('algo')}, {n} clients, {a.get('per_process')} per process, "
            f"{a.get('epochs')} epoch(s)")
    return measured(
        headline_row("scale", f"{what}: launch / local training wall-clock", r["ratio"], "x",
                     "<= 1.2x" if n in (100, 500) else "",
                     f"after round 0: {r['ratio_after_round0']:.2f}x; whole commands "
                     f"{r['launch_cmd_s']:.1f} / {r['local_cmd_s']:.1f} s; same accuracy: "
                     f"{'yes' if r['same_accuracy'] else 'NO'}"),
        headline_row("scale", f"{what}: all clients registered", r["ready_s"], "s",
                     "<= 10 s" if n == 500 else "", "ready_s of fednet launch"),
        headline_row("scale", f"{what}: client PSS after training", r["pss_gib"] * 2**30 / 1e9,
                     "GB", "<= 12 GB" if n == 500 else "", f"{r['pss_gib']:.2f} GiB"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, nargs="+", default=[10, 50, 100, 200, 500])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--per-process", type=int, default=1, help="launch --clients-per-process")
    ap.add_argument("--algo", default="fedavg")
    ap.add_argument("--plot", default="")
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.clients:
            la = run("launch", n, args, Path(tmp) / f"launch{n}")
            lo = run("local", n, args, Path(tmp) / f"local{n}")
            rows.append({"clients": n, "launch_s": la["wall_clock_s"], "local_s": lo["wall_clock_s"],
                         "ratio": la["wall_clock_s"] / lo["wall_clock_s"], "ready_s": la["ready_s"],
                         "ratio_after_round0": la["after_round0_s"] / lo["after_round0_s"],
                         "pss_gib": la.get("client_pss_bytes", 0) / 2**30,
                         "launch_cmd_s": la["command_s"], "local_cmd_s": lo["command_s"],
                         "same_accuracy": la["final_accuracy"] == lo["final_accuracy"]})
            r = rows[-1]
            print(f"{n:>4} clients  launch {r['launch_s']:6.1f}s  local {r['local_s']:6.1f}s  "
                  f"ratio {r['ratio']:.2f} (after round 0: {r['ratio_after_round0']:.2f})  "
                  f"ready {r['ready_s']:5.1f}s  PSS {r['pss_gib']:.2f} GiB  "
                  f"commands {r['launch_cmd_s']:.1f}/{r['local_cmd_s']:.1f}s  "
                  f"same accuracy {r['same_accuracy']}", flush=True)
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        xs = [r["clients"] for r in rows]
        fig, ax = plt.subplots(1, 2, figsize=(10, 3.8), constrained_layout=True)
        ax[0].plot(xs, [r["launch_s"] for r in rows], "o-", label="launch (training)")
        ax[0].plot(xs, [r["local_s"] for r in rows], "s-", label="local (training)")
        ax[0].plot(xs, [r["ready_s"] for r in rows], "^--", label="launch: clients ready")
        ax[0].plot(xs, [r["launch_cmd_s"] for r in rows], "v:", label="launch: whole command")
        ax[0].plot(xs, [r["local_cmd_s"] for r in rows], "d:", label="local: whole command")
        ax[0].set_xlabel("clients")
        ax[0].set_ylabel("seconds")
        ax[0].legend()
        ax[1].plot(xs, [r["pss_gib"] for r in rows], "o-")
        ax[1].set_xlabel("clients")
        ax[1].set_ylabel("client processes, total PSS (GiB)")
        for a in ax:
            a.grid(alpha=0.3)
        fig.suptitle(f"fednet {args.algo}, digits, {args.rounds} rounds, {args.epochs} epoch(s)")
        fig.savefig(args.plot, dpi=110)
    data = {"args": vars(args), "results": rows}  # "results": the list this file used to hold
    write_json(args.json, data, headline(data))


if __name__ == "__main__":
    main()
