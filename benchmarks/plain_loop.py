"""A plain single-process PyTorch FedAvg loop: the reference `bench_many.py` times `fednet launch`
against. No fednet runtime: torch.optim.SGD, a Python loop over the selected clients, a weighted
average of state dicts, the global model tested after every round (as fednet does). It uses
fednet's dataset, partition, client data and model definitions only, so both do the same rounds
(naturally federated datasets too: a chosen client's data is built when it is chosen).

    python3 benchmarks/plain_loop.py --clients 1000 --fraction 0.1 --rounds 10 [--dataset digits]

Local training as fednet's defaults (RunConfig): epochs, batch size, lr, momentum, weight decay.
Prints one JSON line: seconds (after imports and data), accuracy, and each round's seconds
(round_s; the first one also pays torch.optim's first-step import of torch._dynamo).
"""
from __future__ import annotations

import json
import math
import time

T0 = time.perf_counter()

import numpy as np  # noqa: E402
import torch  # noqa: E402

from fednet.data.client_data import client_data  # noqa: E402
from fednet.models import build_model  # noqa: E402
from benchlib.plain import fedavg_round, job_args, job_data  # noqa: E402


def main() -> None:
    a = job_args()
    torch.set_num_threads(1)
    cfg, ds, parts, tx, ty = job_data(a)
    t = cfg.train
    model = build_model(a.model, ds.num_classes, ds.input_shape, dataset=a.dataset, seed=a.seed)
    global_state = {k: v.clone() for k, v in model.state_dict().items()}
    rng = np.random.default_rng(a.seed)
    gen = torch.Generator().manual_seed(a.seed)
    per_round = max(1, math.ceil(a.fraction * a.clients))
    t_start = time.perf_counter()
    acc = 0.0
    ends = []  # each round's end, seconds after t_start (its training and its test)
    for _ in range(a.rounds):
        chosen = rng.choice(a.clients, per_round, replace=False)
        clients = ((torch.from_numpy(cd.x), torch.from_numpy(np.ascontiguousarray(cd.y)))
                   for cd in (client_data(ds, cfg.data, a.clients, a.seed, int(cid), parts[cid])
                              for cid in chosen))
        global_state = fedavg_round(model, global_state, clients, t, gen)
        model.eval()
        with torch.no_grad():
            acc = float((model(tx).argmax(1) == ty).float().mean())
        ends.append(time.perf_counter() - t_start)
    done = time.perf_counter()
    print(json.dumps({"loop_s": done - t_start, "process_s": done - T0, "accuracy": acc,
                      "clients_per_round": per_round,
                      "round_s": [b - a for a, b in zip([0.0] + ends, ends)]}))


if __name__ == "__main__":
    main()
