"""Many clients and big models (docs/benchmarks/history.md section 15), each part side by side in one run.

    python3 benchmarks/bench_many.py [--part scale big copies] [--reps 3] [--json F]

scale   1,000 clients, fraction 0.1, digits, 10 rounds, default options: the whole
        `fednet launch` command against a plain single-process PyTorch loop doing the same
        rounds (benchmarks/plain_loop.py), alternating loop, launch, loop, launch, ...; the
        registration time (summary ready_s) and what --clients-per-process auto chose; then one
        traced launch (bench_launch.py --trace-child) for where the registration time goes.
big     ResNet-18, 100 clients, synthetic-cifar10-small (round_timing_plugin.py: CIFAR shapes, 8
        images per client), 1 round of 1 local step (--batch-size 8 --epochs 1), with and
        without --max-inflight 8, alternating: the round's time split into transfer (the union
        of the intervals in which a TASK or RESULT was on its way: sent .. whole message
        arrived), decode, aggregation and compute (from the plugin's timestamps in every
        process), the bytes moved against loopback TCP's throughput measured in the same run
        (two processes, plain sockets, 256 KiB sends), the server's peak and per-round RSS.
copies  One ResNet-18 model (44.7 MB, 62 arrays) received over TCP, in fresh processes: the
        receiver's peak RSS growth and time with the decode before this work (frames kept until
        the message is dropped, joined arrays copied into the model) and now (frames dropped as
        they are joined, joined buffers adopted by the model); the sender's allocations
        (tracemalloc) and RSS growth for 20 zero-copy sends of the model.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from benchlib.runner import fednet_module, run, summary  # noqa: E402
from benchlib.timing import LoopbackMeter, split_round, tcp_throughput  # noqa: E402
from benchlib.util import headline_row, loadavg, machine, measured, median, table, write_json  # noqa: E402

MiB = 1 << 20


def timed(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, str]:
    """Wall seconds and output (stdout, then stderr) of a command that must succeed."""
    r = run(argv, env=env, check=True)
    return r.wall_s, r.stdout + r.stderr


# ---- scale -----------------------------------------------------------------------------------
def part_scale(tmp: Path, reps: int, clients: int = 1000) -> dict[str, Any]:
    scale = ["--clients", str(clients), "--fraction", "0.1", "--rounds", "10"]
    rows = []
    for i in range(reps):
        loop_s, text = timed([sys.executable, str(HERE / "plain_loop.py"), *scale[:4], "--rounds",
                              "10"])
        loop = json.loads(text.strip().splitlines()[-1])
        out = tmp / f"scale{i}"
        launch_s, _ = timed(fednet_module("launch", *scale, "-q", "--out", str(out)))
        s = summary(out)
        rows.append({"loop_s": loop_s, "loop_accuracy": loop["accuracy"], "launch_s": launch_s,
                     "ratio": launch_s / loop_s, "ready_s": s["ready_s"],
                     "training_s": s["wall_clock_s"], "accuracy": s["final_accuracy"],
                     "choice": s["clients_per_process"], "client_pss": s.get("client_pss_bytes"),
                     "loadavg": loadavg()})
        shutil.rmtree(out, ignore_errors=True)
        r = rows[-1]
        print(f"  scale {i}: loop {loop_s:.1f}s  launch {launch_s:.1f}s  ratio {r['ratio']:.2f}  "
              f"ready {r['ready_s']:.1f}s", file=sys.stderr, flush=True)
    trace = tmp / "trace.json"
    timed([sys.executable, str(HERE / "bench_launch.py"), "--trace-child", str(trace), "--",
           *scale, "-q", "--out", str(tmp / "traced")])
    ev = json.loads(trace.read_text())
    t0 = ev["run_zmq_start"]
    marks = {k: ev[k] - t0 for k in ("zygote_popen_done", "session_done", "spawn_command_sent",
                                      "wait_warm_done", "first_fork", "last_fork", "all_ready",
                                      "training_done", "pss_done", "zygote_stop_done",
                                      "finish_done") if ev.get(k) is not None}
    for name, pick, of in (("first_hello", min, "hello"), ("last_hello", max, "hello"),
                           ("last_ready", max, "ready")):
        if ev.get(of):  # the traced hooks saw the READY messages (empty: they did not)
            marks[name] = pick(ev[of]) - t0
    cpu = ev.get("cpu_at_ready", {})
    return {"clients": clients, "runs": rows, "trace": marks, "cpu_at_ready": cpu,
            "traced_choice": summary(tmp / "traced")["clients_per_process"]}


# ---- big -------------------------------------------------------------------------------------
def part_big(tmp: Path, reps: int, per_process: str) -> dict[str, Any]:
    rows = []
    for i in range(reps):
        for mi in ("8", "0"):
            tput = tcp_throughput()
            tdir = tmp / f"timing{i}_{mi}"
            tdir.mkdir()
            out = tmp / f"big{i}_{mi}"
            env = dict(os.environ, FEDNET_TIMING_DIR=str(tdir),
                       PYTHONPATH=os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")]))
            argv = fednet_module("launch", "--plugin", str(HERE / "round_timing_plugin.py"),
                                 "--dataset", "synthetic-cifar10-small", "--model", "resnet18",
                                 "--clients", "100", "--rounds", "1", "--epochs", "1",
                                 "--batch-size", "8", "--max-inflight", mi, "-q", "--out", str(out))
            if per_process:
                argv += ["--clients-per-process", per_process]
            meter = LoopbackMeter(tput)
            wall, _ = timed(argv, env)
            meter.stop()
            events = [json.loads(line) for f in tdir.glob("*.jsonl")
                      for line in f.read_text().splitlines()]
            s = summary(out)
            r = split_round(events)
            r.update(max_inflight=int(mi), tcp_bytes_per_s=tput, command_s=wall,
                     ideal_transfer_s=r["bytes_moved"] / tput, transfer_s=meter.busy_s,
                     lo_busy_bytes=meter.bytes,
                     server_peak_rss_bytes=s["server_peak_rss_bytes"],
                     client_pss_bytes=s.get("client_pss_bytes"), ready_s=s["ready_s"],
                     choice=s["clients_per_process"], bytes=s["bytes"], loadavg=loadavg())
            r["transfer_over_ideal"] = r["transfer_s"] / r["ideal_transfer_s"]
            rows.append(r)
            print(f"  big {i} max-inflight {mi}: round {r['round_s']:.1f}s transfer "
                  f"{r['transfer_s']:.1f}s (ideal {r['ideal_transfer_s']:.1f}s) server growth "
                  f"{r['server_rss_growth'] / 2**30:.2f} GiB", file=sys.stderr, flush=True)
            shutil.rmtree(out, ignore_errors=True)
    return {"runs": rows}


# ---- copies ----------------------------------------------------------------------------------
def _vm(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key):
            return int(line.split()[1]) * 1024
    return 0


def _reset_hwm() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS


def copies_child(variant: str) -> None:
    """Receive one ResNet-18 model over TCP into a model ('before' or 'now'); print JSON."""
    import numpy as np
    import zmq

    from fednet.metrics.accounting import Ledger
    from fednet.models import build_model
    from fednet.models.arrays import adopt_arrays, load_arrays, state_arrays
    from fednet.protocol import Message, MsgKind, decode
    from fednet.protocol.frames import is_private
    from fednet.transport.channels import Channel

    model = build_model("resnet18", 10, (3, 32, 32), dataset="cifar10", seed=0)
    arrays = {k: np.array(v, copy=True) for k, v in state_arrays(model).items()}
    nbytes = sum(a.nbytes for a in arrays.values())
    rfd, wfd = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()  # before any zmq context: contexts do not survive a fork
    if pid == 0:  # the sender: zero-copy sends of the same arrays
        import tracemalloc

        ctx = zmq.Context()
        a = ctx.socket(zmq.PAIR)
        os.write(wfd, str(a.bind_to_random_port("tcp://127.0.0.1")).encode() + b"\n")
        snd = Channel(a, Ledger(), "server", router=False)
        os.read(go_r, 1)  # the receiver has measured its baseline
        rss0 = _vm("VmRSS:")
        tracemalloc.start()
        n = 20 if variant == "send" else 1
        for i in range(n):
            snd.send(Message(MsgKind.TASK, "server", "r", 1, i, 0.0,
                             body={"route": [0], "hop": 0, "body": {}, "kind": "train"},
                             arrays=arrays), "client")
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        a.recv()  # the receiver is done
        if variant == "send":
            print(json.dumps({"sender_tracemalloc_peak": peak,
                              "sender_rss_growth": _vm("VmRSS:") - rss0, "sends": n}),
                  flush=True)
        os._exit(0)
    port = int(os.fdopen(rfd).readline())
    ctx = zmq.Context()
    b = ctx.socket(zmq.PAIR)
    b.connect(f"tcp://127.0.0.1:{port}")
    del arrays
    time.sleep(0.5)  # connected
    _reset_hwm()
    base = _vm("VmRSS:")
    os.write(go_w, b"g")
    n = 20 if variant == "send" else 1
    for _ in range(n):
        if not b.poll(60_000):
            raise SystemExit("nothing arrived")
        t = time.perf_counter()
        if variant == "before":
            parts = b.recv_multipart(copy=False)
            msg = decode(parts)  # frames kept while the message lives, then copied in
            load_arrays(model, msg.arrays)
        else:
            got = Channel(b, Ledger(), "client", router=False).recv()
            assert got is not None
            msg = got.msg
            adopt_arrays(model, {k: v for k, v in msg.arrays.items() if is_private(v)})
            load_arrays(model, msg.arrays)
        dt = time.perf_counter() - t
        peak = _vm("VmHWM:") - base  # the frames (arrived in zmq's buffers) included
        held = _vm("VmRSS:") - base  # while the message is still referenced
        del msg
        if variant == "before":
            del parts
    b.send(b"done")
    os.waitpid(pid, 0)
    if variant != "send":
        print(json.dumps({"variant": variant, "model_bytes": nbytes, "peak_growth": peak,
                          "models": peak / nbytes, "held_models": held / nbytes,
                          "seconds": dt}), flush=True)
    ctx.destroy(linger=0)


def part_copies(reps: int) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    send: dict[str, Any] = {}
    for _ in range(reps):
        for v in ("before", "now"):
            _, text = timed([sys.executable, __file__, "--copies-child", v])
            rows.append(json.loads(text.strip().splitlines()[-1]))
    _, text = timed([sys.executable, __file__, "--copies-child", "send"])
    send = json.loads(text.strip().splitlines()[-1])
    return {"receive": rows, "send": send}


def headline(res: dict[str, Any]) -> list[dict[str, Any]]:
    """The dashboard's rows, per part that ran: scale (BENCHMARKS section 15's targets: <= 1.5x
    the plain loop, registered within 6 s), big (the round with compute) and copies."""
    sc, big, cp = (res.get(k) or {} for k in ("scale", "big", "copies"))
    runs, brs = sc.get("runs", []), big.get("runs", [])
    default = [r for r in brs if r["max_inflight"] == 0] or brs
    held = [r["held_models"] for r in cp.get("receive", []) if r["variant"] == "now"]
    what = f"{sc.get('clients', 1000):,} digits clients, fraction 0.1, 10 rounds"
    return measured(
        headline_row("scale", f"{what}: fednet launch / plain PyTorch loop, whole command",
                     median([r["ratio"] for r in runs]) if runs else None, "x", "<= 1.5x",
                     f"median of {len(runs)}: " + ", ".join(f"{r['ratio']:.2f}" for r in runs)),
        headline_row("scale", f"{what}: all clients registered (ready_s)",
                     median([r["ready_s"] for r in runs]) if runs else None, "s", "<= 6 s",
                     f"median of {len(runs)}"),
        headline_row("scale", "ResNet-18, 100 clients, 1 round of 1 local step: the round",
                     median([r["round_s"] for r in default]) if default else None, "s", "",
                     "--max-inflight " + ", ".join(sorted({str(r["max_inflight"])
                                                           for r in default}))
                     + "; transfer / ideal " + ", ".join(f"{r['transfer_over_ideal']:.2f}"
                                                         for r in default)),
        headline_row("transfer", "one ResNet-18 model received: memory held while the task runs",
                     median(held) if held else None, "models", "",
                     f"median of {len(held)} receives; the decode before this work: "
                     + ", ".join(f"{r['held_models']:.2f}" for r in cp.get("receive", [])
                                 if r["variant"] == "before")))


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--copies-child":
        copies_child(sys.argv[2])
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", nargs="+", default=["scale", "big", "copies"])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--scale-clients", type=int, default=1000, help="scale: the population")
    ap.add_argument("--big-reps", type=int, default=1)
    ap.add_argument("--per-process", default="10",
                    help="big: --clients-per-process ('' = auto); 100 ResNet-18 client processes "
                         "need ~17 GiB on a small machine")
    ap.add_argument("--json")
    args = ap.parse_args()
    res: dict[str, Any] = {"machine": machine()}
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        if "copies" in args.part:
            c = res["copies"] = part_copies(args.reps)
            print("copies: one ResNet-18 model received (peak RSS growth, in models)")
            print(table(["variant", "peak growth MiB", "peak, models", "held, models",
                         "decode+load ms"],
                        [[r["variant"], f"{r['peak_growth'] / MiB:.0f}", f"{r['models']:.2f}",
                          f"{r['held_models']:.2f}", f"{r['seconds'] * 1e3:.0f}"]
                         for r in c["receive"]]))
            s = c["send"]
            print(f"sender, {s['sends']} zero-copy sends of the model: tracemalloc peak "
                  f"{s['sender_tracemalloc_peak'] / 1024:.0f} KiB, RSS growth "
                  f"{s['sender_rss_growth'] / MiB:.1f} MiB")
        if "scale" in args.part:
            sc = res["scale"] = part_scale(tmp, args.reps, args.scale_clients)
            print(f"scale: {args.scale_clients:,} clients, fraction 0.1, digits, 10 rounds, default options")
            print(table(["rep", "plain loop s", "fednet launch s", "ratio", "ready s",
                         "training s", "per process", "processes"],
                        [[i, f"{r['loop_s']:.1f}", f"{r['launch_s']:.1f}", f"{r['ratio']:.2f}",
                          f"{r['ready_s']:.1f}", f"{r['training_s']:.1f}",
                          r["choice"]["per_process"], r["choice"]["processes"]]
                         for i, r in enumerate(sc["runs"])]))
            print("traced launch (s after run_zmq's start):",
                  ", ".join(f"{k} {v:.2f}" for k, v in sorted(sc["trace"].items(),
                                                               key=lambda kv: kv[1])))
            print("CPU at ready:", json.dumps(sc["cpu_at_ready"]))
        if "big" in args.part:
            b = res["big"] = part_big(tmp, args.big_reps, args.per_process)
            print("big: ResNet-18, 100 clients, 1 round of 1 local step")
            print(table(["max-inflight", "round s", "transfer s (lo busy)", "ideal s",
                         "transfer/ideal", "GB moved", "decode CPU s (clients/server)",
                         "aggregation CPU s", "compute CPU s", "encode+send CPU s",
                         "all processes' CPU s",
                         "server RSS growth GiB", "server peak GiB", "TCP GB/s"],
                        [[r["max_inflight"], f"{r['round_s']:.1f}", f"{r['transfer_s']:.1f}",
                          f"{r['ideal_transfer_s']:.1f}", f"{r['transfer_over_ideal']:.2f}",
                          f"{r['bytes_moved'] / 1e9:.2f}",
                          f"{r['decode_clients_cpu_s']:.1f}/{r['decode_server_cpu_s']:.1f}",
                          f"{r['aggregation_cpu_s']:.1f}", f"{r['compute_cpu_s']:.1f}",
                          f"{r['encode_send_cpu_s']:.2f}", f"{r['process_cpu_s']:.1f}",
                          f"{r['server_rss_growth'] / 2**30:.2f}",
                          f"{r['server_peak_rss_bytes'] / 2**30:.2f}",
                          f"{r['tcp_bytes_per_s'] / 1e9:.2f}"] for r in b["runs"]]))
    write_json(args.json, res, headline(res))


if __name__ == "__main__":
    main()
