"""A plugin for bench_many.py (never imported by fednet itself): `--plugin
benchmarks/round_timing_plugin.py` with $FEDNET_TIMING_DIR set.

1. Timestamps, in the server and in every client process (the zygote imports the plugin before
   it forks): each message sent (before encoding) and received (when decoding starts, i.e. the
   moment the whole message had arrived), how long decoding took, each task's compute on the
   client (Executor.on_task: model load, local steps, result arrays), the server's aggregation
   (FedAvg.absorb folds and aggregate_round) and the round itself. One JSON line per event in
   $FEDNET_TIMING_DIR/<pid>.jsonl; CLOCK_MONOTONIC is shared by all processes of the machine.
2. `synthetic-cifar10-small`: the first 800 training and 1,000 test images of synthetic-cifar10
   (CIFAR's shapes): 100 IID clients hold 8 images each, so `--batch-size 8 --epochs 1` is one
   local step per client (a step of 500 images would take ~20 s per client on one CPU core).
"""
from __future__ import annotations

import json
import os
import resource
import time
from typing import Any

OUT = os.environ.get("FEDNET_TIMING_DIR", "")
_buf: list[str] = []


def _log(**ev: Any) -> None:
    if not OUT:
        return
    ev["pid"] = os.getpid()
    ev["pcpu"] = time.process_time()  # this process's CPU so far, zmq's I/O threads included
    ev["pflt"] = resource.getrusage(resource.RUSAGE_SELF).ru_minflt  # and its page faults
    with open(os.path.join(OUT, f"{os.getpid()}.jsonl"), "a") as f:
        f.write(json.dumps(ev) + "\n")


def _patch() -> None:
    from fednet.algorithms import fedavg
    from fednet.core import executor
    from fednet.protocol.frames import frame_bytes
    from fednet.server import app
    from fednet.transport import channels

    send0, decode0 = channels.Channel.send, channels.decode

    def send(self: Any, msg: Any, dst: str, *a: Any, **k: Any) -> Any:
        t, c = time.monotonic(), time.thread_time()
        out = send0(self, msg, dst, *a, **k)
        _log(ev="send", kind=msg.kind.name, task=msg.task_id, t=t, dt=time.monotonic() - t,
             cpu=time.thread_time() - c, nbytes=out[0], me=self.me)
        return out

    def decode(frames: Any, *a: Any, **k: Any) -> Any:
        t, c, r0 = time.monotonic(), time.thread_time(), resource.getrusage(resource.RUSAGE_THREAD)
        h, p = frame_bytes(frames)
        msg = decode0(frames, *a, **k)
        r1 = resource.getrusage(resource.RUSAGE_THREAD)
        _log(ev="recv", kind=msg.kind.name, task=msg.task_id, t=t, dt=time.monotonic() - t,
             cpu=time.thread_time() - c, nbytes=h + p, sys=r1.ru_stime - r0.ru_stime,
             faults=r1.ru_minflt - r0.ru_minflt)
        return msg

    channels.Channel.send, channels.decode = send, decode

    on_task0 = executor.Executor.on_task

    def on_task(self: Any, msg: Any, nbytes: int) -> Any:
        t, c = time.monotonic(), time.thread_time()
        out = on_task0(self, msg, nbytes)
        _log(ev="compute", task=msg.task_id, t=t, dt=time.monotonic() - t,
             cpu=time.thread_time() - c)
        return out

    executor.Executor.on_task = on_task

    def timed(cls: Any, name: str, what: str) -> None:
        orig = getattr(cls, name)

        def w(*a: Any, **k: Any) -> Any:
            t, c, rss0 = time.monotonic(), time.thread_time(), _rss()
            out = orig(*a, **k)
            _log(ev=what, t=t, dt=time.monotonic() - t, cpu=time.thread_time() - c, rss0=rss0,
                 rss=_rss())
            return out
        setattr(cls, name, w)

    timed(fedavg.FedAvg, "absorb", "aggregate")
    timed(fedavg.FedAvg, "aggregate_round", "aggregate")
    timed(app.ZmqServer, "run_round", "round")


def _rss() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _small(data_root: Any, download: bool, split_seed: int) -> Any:
    import numpy as np

    from fednet.data import load_dataset
    from fednet.data.datasets import Dataset

    ds = load_dataset("synthetic-cifar10", data_root, download)
    return Dataset(name="synthetic-cifar10-small", train_x=np.ascontiguousarray(ds.train_x[:800]),
                   train_y=np.ascontiguousarray(ds.train_y[:800]),
                   test_x=np.ascontiguousarray(ds.test_x[:1000]),
                   test_y=np.ascontiguousarray(ds.test_y[:1000]), num_classes=10,
                   input_shape=(3, 32, 32), class_names=ds.class_names, objective=ds.objective)


def _register() -> None:
    from fednet.data.datasets import DATASETS, PLUGIN_DATASETS, register_dataset

    if "synthetic-cifar10-small" not in DATASETS and \
            "synthetic-cifar10-small" not in PLUGIN_DATASETS:
        register_dataset("synthetic-cifar10-small", _small, model="resnet18")


_register()
if OUT:
    _patch()
