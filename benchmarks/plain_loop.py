"""A plain single-process PyTorch FedAvg loop: the reference the benchmarks time fednet against
(bench_many.py, bench_inproc.py, bench_population.py, bench_batched_runs.py). No fednet runtime:
torch.optim.SGD, a Python loop over the round's clients, a weighted average of state dicts, the
global model tested after every round (as fednet does). It does the rounds `fednet local` does
with the same options (FedAvg, fednet's defaults), to float rounding: fednet's own functions say
which clients take part each round (the algorithm's cohort draw) and what each one trains on
(dataset, partition, client data, each client's seeded batch order and augmentation, the initial
model, the test set): benchlib/plain.py; tests/test_plain_loop.py checks the accuracy curves
against fednet local's.

    python3 benchmarks/plain_loop.py --clients 1000 --fraction 0.1 --rounds 10 [--dataset digits]

Local training as fednet's defaults (RunConfig): epochs, batch size, lr, momentum, weight decay,
augmentation. Prints one JSON line: seconds (after imports and data), the final accuracy, each
round's (accuracies) and each round's seconds (round_s; the first one also pays torch.optim's
first-step import of torch._dynamo).
"""
from __future__ import annotations

import json
import time

T0 = time.perf_counter()

import numpy as np  # noqa: E402
import torch  # noqa: E402

from fednet.algorithms import model_name  # noqa: E402
from fednet.data.client_data import client_data  # noqa: E402
from fednet.models import build_model  # noqa: E402
from benchlib.plain import augment_of, cohorts, fedavg_round, job_args, job_data  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    """Run the job of `argv` (the command line's by default); print and return its JSON line."""
    a = job_args(__doc__, argv)
    torch.set_num_threads(1)
    cfg, ds, parts, tx, ty = job_data(a)
    t = cfg.train
    model = build_model(model_name(cfg), ds.num_classes, ds.input_shape, dataset=a.dataset,
                        seed=a.seed)
    global_state = {k: v.clone() for k, v in model.state_dict().items()}
    cohort, augment = cohorts(cfg), augment_of(cfg)
    t_start = time.perf_counter()
    accs: list[float] = []
    ends = []  # each round's end, seconds after t_start (its training and its test)
    per_round = 0
    for rnd in range(a.rounds):
        chosen = cohort(rnd)
        per_round = len(chosen)
        clients = ((cid, torch.from_numpy(cd.x), torch.from_numpy(np.ascontiguousarray(cd.y)))
                   for cid, cd in ((cid, client_data(ds, cfg.data, a.clients, a.seed, cid,
                                                     parts[cid])) for cid in chosen))
        global_state = fedavg_round(model, global_state, clients, t, a.seed, rnd, augment)
        model.eval()
        with torch.no_grad():
            accs.append(int((model(tx).argmax(1) == ty).sum()) / max(len(ty), 1))
        ends.append(time.perf_counter() - t_start)
    done = time.perf_counter()
    out = {"loop_s": done - t_start, "process_s": done - T0,
           "accuracy": accs[-1] if accs else 0.0, "accuracies": accs,
           "clients_per_round": per_round, "round_s": [b - a for a, b in zip([0.0] + ends, ends)]}
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
