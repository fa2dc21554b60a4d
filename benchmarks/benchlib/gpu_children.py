"""The processes gpu_check.py starts as `gpu_check.py --child NAME`: the device probe (info), one
bare process's CUDA context (context), and the plain single-process FedAvg loop it times fednet
against (plain). Each prints one JSON line; the parent itself never touches CUDA."""
from __future__ import annotations

import argparse
import json
import time
from typing import Any

MiB = 1 << 20


def child_info(gpu: int) -> None:
    """torch and the device, one JSON line (the parent itself never touches CUDA)."""
    import warnings

    got: dict[str, Any] = {}
    try:
        import torch

        import fednet.cli  # noqa: F401  (the whole command line imports: zmq, msgpack, click)
    except Exception as e:  # noqa: BLE001
        print(json.dumps({"import_error": f"{type(e).__name__}: {e}"}), flush=True)
        return
    got.update(torch=torch.__version__, torch_cuda=torch.version.cuda)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        avail = torch.cuda.is_available()
    got["cuda_available"] = bool(avail)
    got["cuda_warnings"] = [str(w.message)[:300] for w in caught]
    if avail:
        got["device_count"] = torch.cuda.device_count()
        if gpu < got["device_count"]:
            p = torch.cuda.get_device_properties(gpu)
            got.update(name=torch.cuda.get_device_name(gpu), capability=list(
                torch.cuda.get_device_capability(gpu)), total_mib=int(p.total_memory) // MiB,
                cudnn=torch.backends.cudnn.version())
    print(json.dumps(got), flush=True)


CONTEXT_MARKS = ("context", "step")


def child_context(device: str) -> None:
    """One bare process: its CUDA context, then one ResNet-18 step (marks on stdout)."""
    import torch

    from fednet.models import build_model

    d = torch.device(device)
    torch.cuda.set_device(d)
    torch.zeros(1, device=d)
    torch.cuda.synchronize(d)
    print("context", flush=True)
    time.sleep(2.5)
    m = build_model("resnet18", 10, (3, 32, 32), dataset="cifar10", seed=0).to(d)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    torch.nn.functional.cross_entropy(m(torch.randn(64, 3, 32, 32, device=d)),
                                      torch.zeros(64, dtype=torch.long, device=d)).backward()
    opt.step()
    torch.cuda.synchronize(d)
    print("step", flush=True)
    time.sleep(2.5)
    print(json.dumps({"allocated_mib": torch.cuda.max_memory_allocated(d) / MiB,
                      "reserved_mib": torch.cuda.memory_reserved(d) / MiB}), flush=True)


def child_plain(a: argparse.Namespace) -> None:
    """A plain single-process FedAvg loop (benchmarks/plain_loop.py's, on a device): the same
    dataset, partition, model, local-training settings and each client's batch order as `fednet
    launch --augment none` (every client every round); prints one JSON line with the per-round
    times."""
    import numpy as np
    import torch

    from benchlib.plain import fedavg_round

    from fednet.config import from_dict
    from fednet.data import load_dataset, run_partition, run_test_split
    from fednet.models import build_model
    from fednet.training.local import evaluate

    torch.set_num_threads(1)
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    if cuda:
        torch.cuda.set_device(dev)
    cfg = from_dict({"clients": a.clients, "seed": a.seed, "data": {"dataset": a.dataset},
                     "train": {"epochs": a.epochs, "batch_size": a.batch_size}})
    t = cfg.train
    ds = load_dataset(a.dataset)
    parts = run_partition(ds, cfg.data, a.clients, a.seed)
    test, _ = run_test_split(ds, cfg.data.exemplars, a.seed)
    tx, ty = torch.from_numpy(test.test_x).to(dev), torch.from_numpy(test.test_y).to(dev)
    xs, ys = torch.from_numpy(ds.train_x).to(dev), torch.from_numpy(ds.train_y).to(dev)
    idxs = [torch.from_numpy(np.asarray(p, dtype=np.int64)).to(dev) for p in parts]
    model = build_model(a.model, ds.num_classes, ds.input_shape, dataset=a.dataset,
                        seed=a.seed).to(dev)
    global_state = {k: v.detach().clone() for k, v in model.state_dict().items()}

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(dev)

    rounds, acc = [], 0.0
    for rnd in range(a.rounds):
        sync()
        r0 = time.perf_counter()
        global_state = fedavg_round(model, global_state, ((cid, xs[idx], ys[idx]) for cid, idx
                                                          in enumerate(idxs)), t, a.seed, rnd)
        sync()
        r1 = time.perf_counter()
        with torch.no_grad():
            acc, _ = evaluate(model, tx, ty)
        sync()
        r2 = time.perf_counter()
        rounds.append({"round_s": r2 - r0, "train_s": r1 - r0, "test_s": r2 - r1})
    out: dict[str, Any] = {"rounds": rounds, "accuracy": float(acc), "device": str(dev),
                           "clients": a.clients}
    if cuda:
        out.update(max_allocated_mib=torch.cuda.max_memory_allocated(dev) / MiB,
                   max_reserved_mib=torch.cuda.max_memory_reserved(dev) / MiB)
    if a.cpu_eval_sample > 0:  # the server's test pass: on the CPU, one thread
        cpu_model = build_model(a.model, ds.num_classes, ds.input_shape, dataset=a.dataset,
                                seed=a.seed)
        cpu_model.load_state_dict({k: v.cpu() for k, v in global_state.items()})
        n = min(a.cpu_eval_sample, len(test.test_y))
        c0 = time.perf_counter()  # as the server: evaluate(), no no_grad
        evaluate(cpu_model, torch.from_numpy(test.test_x[:n]), torch.from_numpy(test.test_y[:n]))
        dt = time.perf_counter() - c0
        out.update(server_cpu_test_s=dt * len(test.test_y) / n, server_cpu_test_sample=n)
    print(json.dumps(out), flush=True)
