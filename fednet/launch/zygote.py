"""The warm fork server: imports torch and the client once, warms up, then forks clients.

Run as `python -m fednet.launch.zygote` with OMP_NUM_THREADS=1. It never opens a socket nor
touches CUDA. Commands arrive as JSON lines on stdin; events leave as JSON lines on stdout:
  in:  {"cmd": "spawn_many", "groups": [[0, 1], [2, 3]], "devices": ["cpu", "cpu"],
        "curves": [pair or null, ...], "common": {"connect": "tcp://...", "threads": 1, ...}}
       (one process per group; "ranges": [[0, 2], [2, 4]] instead of "groups" names each
       group's ids as [first, last + 1]: a million ids in a few bytes)
       {"cmd": "stop"}                       (or EOF: the launcher is gone)
  out: {"event": "warm", "pid": P, "seconds": S}
       {"event": "hugepages", "bytes": B, "seconds": S}   (once, before a large spawn_many)
       {"event": "spawned", "cids": [3, 5], "pid": P}      (one per process: its ids, or
       {"event": "exit", "cids": [3, 5], "pid": P, "code": C}  "range": [lo, hi] for lo..hi-1;
                                                              C < 0: killed by signal -C)
The processes of one spawn_many wait for a go signal (EOF on a pipe the zygote closes once it has
forked them all) before they import or connect anything, so they do not take the CPU from the
zygote while it still forks their siblings.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import select
import signal
import sys
import time
import traceback
from collections.abc import Sequence
from typing import Any

from fednet.platform import hugepages
from fednet.platform.malloc import one_arena
from fednet.platform.proc import seed_routing_ids, set_pdeathsig


def warm_up(dataset: str, data_root: str, unknown_run: bool = False, batch_size: int = 8
            ) -> None:
    """Import and run once everything a client's first training step would load lazily, and
    know the FLOP counts of its batches (prepare_counts).

    (fednet's optimizers call torch's functional kernels, which keep torch._dynamo out; the
    step still warms autograd and kernels.)
    With unknown_run (`fednet clients`: the run's dataset and model arrive later, at WELCOME)
    torchvision is imported too, when installed, so that no client pays its ~1.2 s import for a
    CIFAR/SVHN dataset or a ResNet-18, and torch's FLOP counter is started whatever the disk
    cache holds (the run's model is not known yet).
    """
    import torch

    if unknown_run:
        try:
            import torchvision.datasets  # noqa: F401
            import torchvision.models  # noqa: F401
        except ImportError:
            pass

    torch.set_num_threads(1)
    from fednet.client import app, host  # noqa: F401  (imports zmq, the executor, algorithms)
    from fednet.data import load_dataset
    from fednet.models import build_model
    from fednet.training.local import train

    try:
        ds = load_dataset(dataset, data_root or None)
        model = build_model("auto", ds.num_classes, ds.input_shape, dataset=ds.name)
    except Exception:  # noqa: BLE001 - the server's own load reports the real error; warm on digits
        ds = load_dataset("digits")  # (or a plugin's dataset without a default model)
        model = build_model("auto", ds.num_classes, ds.input_shape)
    x, y = torch.from_numpy(ds.train_x[:8]), torch.from_numpy(ds.train_y[:8])
    if len(y) == 0:  # clients' data only (synthetic-fedprox has no pooled arrays): a step on
        # zeros, else nothing trains
        x, y = torch.zeros((8, *ds.input_shape)), torch.zeros(8, dtype=torch.int64)
    train(model, x, y, epochs=1, batch_size=8, lr=0.01, momentum=0.9,
          generator=torch.Generator().manual_seed(0))
    prepare_counts(model, tuple(ds.input_shape), batch_size, always=unknown_run)


def prepare_counts(model: Any, example: tuple[int, ...], batch_size: int,
                   always: bool = False) -> None:
    """Know, before forking, the simulated clock's FLOP counts (training/flops) of the training
    batches a client's loop makes with --batch-size, so that no client counts: each size read
    from the disk cache (flops.CACHE_ENV) where an earlier process of this host counted it,
    else counted here: the full batch always, the other sizes (1 to batch_size - 1: an epoch's
    last batch) while they take at most PREPARE_S in all (a small model's take milliseconds,
    a ResNet-18's ~0.4 s each on the meta device). Counting starts torch's FlopCounterMode,
    whose first use imports torch._dynamo and sympy (~0.75 s, as much as torch itself); where a
    size is left unknown, or with `always` (the run's model is not known yet), those imports
    are made here, once, inherited by every client, so that a client's own count is quick; a
    run whose counts are all on disk imports neither."""
    from fednet.training import flops

    full = max(1, int(batch_size))
    spent, unknown = 0.0, False
    for size in [full, *range(1, full)]:
        if flops.known(model, example, [size]):
            continue
        if size != full and spent >= PREPARE_S:
            unknown = True
            break
        t0 = time.monotonic()
        flops.batch_work(model, (size, *example))
        spent += 0 if size == full else time.monotonic() - t0
    if always or unknown:
        import torch._dynamo  # noqa: F401  (what the counter's first use imports)


PREPARE_S = 0.5
"""prepare_counts' time for the sizes other than the full batch (the rest are counted by the
clients that meet them: torch's counter already started, ~milliseconds each for small models)."""


def load_plugins(modules: list[str]) -> None:
    """Import the run's --plugin modules and every installed plugin (entry points: algorithms,
    models, datasets) before the warm-up, so forked clients inherit them at no cost."""
    from fednet import plugins
    from fednet.core import plugin_check

    plugins.load_modules(modules)
    plugins.preload()
    plugin_check.arm_report_token()  # a missing plugin is reported by one client, not by each


def _keep_model(template: dict[str, Any] | None, batch_size: int, batched: bool = False) -> None:
    """Build the run's seeded model once, so that every client copies it instead of running the
    initialisation (e.g. {"name": "resnet18", "num_classes": 10, "input_shape": [3, 32, 32],
    "dataset": "cifar10", "seed": 0}), and know its batches' FLOP counts (prepare_counts: the
    warm-up's model is the dataset's default, which --model may replace); with `batched`
    (--batch-clients) import what the batched engine's first gradient imports (torch._dynamo,
    where it differentiates with torch.func): once here rather than in every client. A template
    that cannot be built is only reported."""
    if not template:
        return
    try:
        from fednet.models import build_model, keep_template

        name, classes = str(template["name"]), int(template["num_classes"])
        shape = tuple(int(x) for x in template["input_shape"])
        dataset, seed = template.get("dataset"), int(template["seed"])
        keep_template(name, classes, shape, dataset=dataset, seed=seed)
        model = build_model(name, classes, shape, dataset=dataset, seed=seed)
        prepare_counts(model, shape, batch_size)
        if batched:
            from fednet.training.batched import differentiates

            if differentiates(model):
                import torch._dynamo  # noqa: F401
    except Exception as e:  # noqa: BLE001 - clients then build the model themselves
        print(f"zygote: could not keep the model template: {type(e).__name__}: {e}",
              file=sys.stderr)


def _emit(event: dict[str, Any]) -> None:
    try:
        sys.stdout.write(json.dumps(event) + "\n")
        sys.stdout.flush()
    except (BrokenPipeError, ValueError):  # the launcher is gone: nobody reads events any more
        pass


def _wait_go(go: tuple[int, int]) -> None:
    """Block until the zygote has forked the whole batch: it closes the pipe's write end then
    (and so does its exit). A child that started its imports and registration at once would
    take the CPU from the zygote that still forks its siblings (docs/benchmarks/history.md section 15)."""
    os.close(go[1])
    try:
        while os.read(go[0], 1):
            pass
    except OSError:
        pass
    os.close(go[0])


def _child(spec: dict[str, Any], zygote: int, go: tuple[int, int] | None = None) -> int:
    """Runs in the forked child: becomes the clients spec['cids'] (usually one)."""
    set_pdeathsig(signal.SIGTERM)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    if os.getppid() != zygote:  # the zygote died before PDEATHSIG was armed
        return 1
    if go is not None:
        _wait_go(go)
    seed_routing_ids()  # else every child draws its sockets' routing ids as the zygote would
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(2, 1)  # stdout is the launcher's event pipe: keep client output off it
    from fednet.client.main import run_client
    from fednet.config.liveness import Liveness
    from fednet.log import setup_logging

    cids = spec["cids"]  # a range stays one: a process of 625,000 ids builds no list of them
    cids = cids if isinstance(cids, range) else [int(c) for c in cids]
    name = f"client {cids[0]}" if len(cids) == 1 else f"clients {cids[0]}-{cids[-1]}"
    setup_logging(name, spec.get("log_level", "WARNING"))
    return run_client(cids, spec["connect"], spec.get("device", "cpu"),
                      spec.get("advertise", "127.0.0.1"), int(spec.get("threads", 1)),
                      float(spec.get("register_timeout", 60.0)), spec.get("secure", ""),
                      bytes.fromhex(spec["run_key"]) if spec.get("run_key") else None,
                      spec.get("key_name", ""),
                      tuple(c.encode() for c in spec["curve"]) if spec.get("curve") else None,
                      liveness=Liveness.from_dict(spec.get("liveness")))


def group_specs(cmd: dict[str, Any]) -> list[dict[str, Any]]:
    """One process spec per group of a spawn_many command: the common part, then what is the
    group's own (its ids, its device and, under `fednet launch --secure`, its CURVE pair)."""
    groups = cmd.get("groups") or [range(lo, hi) for lo, hi in cmd["ranges"]]
    curves = cmd.get("curves") or [None] * len(groups)
    return [dict(cmd["common"], cids=cids, device=dev, curve=curve)
            for cids, dev, curve in zip(groups, cmd["devices"], curves)]


def ids_field(cids: Any) -> dict[str, Any]:
    """How an event names a process's ids: "range" [lo, hi] for a range, else "cids"."""
    if isinstance(cids, range) and cids.step == 1:
        return {"range": [cids.start, cids.stop]}
    return {"cids": [int(c) for c in cids]}


def serve(children: dict[int, Sequence[int]], batch_size: int = 8) -> None:
    """Read commands, fork clients, report exits; return on stop or EOF (batch_size: the
    run's --batch-size, _keep_model's)."""
    buf = b""
    collapsed = False
    stdin = sys.stdin.fileno()
    while True:
        _reap(children)
        r, _, _ = select.select([stdin], [], [], 0.05)
        if not r:
            continue
        chunk = os.read(stdin, 1 << 16)
        if not chunk:
            return
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            cmd = json.loads(line)
            if cmd.get("cmd") == "stop":
                return
            if cmd.get("cmd") == "spawn_many":
                _keep_model(cmd.get("template"), batch_size, bool(cmd.get("batched")))
                if not collapsed and len(cmd.get("groups") or cmd["ranges"]) >= hugepages.WORTH_IT:
                    collapsed = True  # once: later forks are cheap too
                    t0 = time.monotonic()
                    huge = hugepages.collapse()
                    _emit({"event": "hugepages", "bytes": huge, "seconds": time.monotonic() - t0})
                go = os.pipe()  # the batch's go signal: closed once every process is forked
                try:
                    for spec in group_specs(cmd):
                        _fork(spec, children, go)
                        _reap(children)
                finally:
                    os.close(go[0])
                    os.close(go[1])


def _fork(spec: dict[str, Any], children: dict[int, Sequence[int]],
          go: tuple[int, int] | None = None) -> None:
    sys.stdout.flush()
    me = os.getpid()
    # SIGTERM stays blocked across fork: the child must never run the zygote's handler (which
    # would stop the child's copy of the siblings); _child unblocks it once it is SIG_DFL.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    pid = os.fork()
    if pid != 0:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    if pid == 0:
        code = 1
        try:
            code = _child(spec, me, go)
        except BaseException as e:  # noqa: BLE001 - report anything, exit cleanly
            print(f"clients {spec.get('cids')}: {type(e).__name__}: {e}", file=sys.stderr)
        finally:
            os._exit(code)
    cids = spec["cids"]
    children[pid] = cids if isinstance(cids, range) else [int(c) for c in cids]
    _emit({"event": "spawned", **ids_field(children[pid]), "pid": pid})  # one line per process


def _reap(children: dict[int, Sequence[int]]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        code = os.waitstatus_to_exitcode(status)
        _emit({"event": "exit", **ids_field(children.pop(pid, [-1])), "pid": pid, "code": code})


def stop_children(children: dict[int, Sequence[int]], grace_s: float = 5.0) -> None:
    """SIGTERM every child, wait up to grace_s, then SIGKILL what is left."""
    for pid in list(children):
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace_s
    while children and time.monotonic() < deadline:
        _reap(children)
        time.sleep(0.02)
    for pid in list(children):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    while children:
        _reap(children)
        time.sleep(0.01)


def main() -> None:
    """Entry point of the zygote process."""
    ap = argparse.ArgumentParser(description="fednet zygote (started by fednet launch)")
    ap.add_argument("--dataset", default="digits")
    ap.add_argument("--data-root", default="")
    ap.add_argument("--parent", type=int, default=0, help="the launcher's pid")
    ap.add_argument("--unknown-run", action="store_true",
                    help="the run is not known yet (fednet clients): warm torchvision as well")
    ap.add_argument("--batch-size", type=int, default=8,
                    help="the run's --batch-size: its batches' FLOP counts are known before forking")
    ap.add_argument("--plugin", action="append", default=[],
                    help="a plugin module of the run (repeatable), imported before the warm-up")
    a = ap.parse_args()
    one_arena()  # inherited by every forked client (platform/malloc.py)
    set_pdeathsig(signal.SIGTERM)
    if a.parent and os.getppid() != a.parent:  # the launcher died before PDEATHSIG was armed
        os._exit(1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    children: dict[int, Sequence[int]] = {}
    def on_term(*_: Any) -> None:
        stop_children(children, 2.0)
        os._exit(0)
    signal.signal(signal.SIGTERM, on_term)
    t0 = time.monotonic()
    load_plugins(a.plugin)
    warm_up(a.dataset, a.data_root, a.unknown_run, a.batch_size)
    gc.collect()
    gc.freeze()  # children's collections then skip the inherited objects (no copy-on-write)
    _emit({"event": "warm", "pid": os.getpid(), "seconds": time.monotonic() - t0})
    code = 0
    try:
        serve(children, a.batch_size)
    except BaseException:  # noqa: BLE001 - report it, then still stop every child
        traceback.print_exc()
        code = 1
    finally:
        stop_children(children)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (BrokenPipeError, ValueError):  # the launcher is gone
                pass
        os._exit(code)  # skip interpreter teardown (torch's takes ~0.3 s); nothing is left to flush


if __name__ == "__main__":
    main()
