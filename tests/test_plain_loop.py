"""benchmarks/plain_loop.py, the plain PyTorch loop the benchmarks time fednet against, does the
rounds `fednet local` does with the same options: the same cohort each round, each client's
batch order and augmentation, the same initial model, data and test set; so its accuracy after
every round is fednet's (the test set's accuracy: a count over the same examples, here equal to
the bit)."""
from __future__ import annotations

import sys

import pytest

from tests.harness import BENCHMARKS, bench

sys.path.insert(0, str(BENCHMARKS))  # plain_loop.py imports benchlib as its own folder's


def _both(tmp_path, dataset: str, clients: int, fraction: float, rounds: int, epochs: int
          ) -> tuple[list[float], list[float], int]:
    """(the loop's accuracy after each round, fednet local's, the loop's cohort size)."""
    from fednet.api import run

    loop = bench("plain_loop").main(["--dataset", dataset, "--clients", str(clients),
                                     "--fraction", repr(fraction), "--rounds", str(rounds),
                                     "--epochs", str(epochs), "--seed", "0"])
    exp = run(dataset=dataset, clients=clients, fraction=fraction, rounds=rounds, epochs=epochs,
              seed=0, out=str(tmp_path / "fednet"))
    return loop["accuracies"], [r["accuracy"] for r in exp.history], loop["clients_per_round"]


@pytest.mark.parametrize("dataset,clients,fraction,per_round", [
    ("digits", 10, 0.5, 5),                 # half the clients a round (the old loop: ceil)
    ("digits", 7, 0.5, 3),                  # floor(3.5) clients a round, as fednet
    ("synthetic-fedprox", 1000, 0.01, 10),  # naturally federated, a cohort of a population
])
def test_the_loop_trains_fednets_rounds(tmp_path, dataset, clients, fraction, per_round):
    loop, fednet, cohort = _both(tmp_path, dataset, clients, fraction, 2, 1)
    assert cohort == per_round
    assert len(loop) == len(fednet) == 2
    assert loop == pytest.approx(fednet, abs=1e-12)


def test_the_cohort_is_fednets_draw():
    """plain.cohorts is the algorithm's own draw: floor(fraction x clients), sorted, a new one
    each round, as Strategy.select (not numpy's default_rng(seed).choice the loop once used)."""
    import numpy as np

    from benchlib.plain import cohorts
    from fednet import rng
    from fednet.config import RunConfig

    cfg = RunConfig(clients=1000, seed=3).replace(**{"algo.fraction": 0.1})
    draw = cohorts(cfg)
    for rnd in range(3):
        want = sorted(rng.generator(3, "select", rnd).choice(1000, 100, replace=False).tolist())
        assert draw(rnd) == want
    assert draw(0) != draw(1)
    assert draw(0) != sorted(np.random.default_rng(3).choice(1000, 100, replace=False).tolist())


@pytest.mark.slow
def test_the_loop_augments_as_fednet(tmp_path):
    """synthetic-cifar10's default augmentation (FedSeq's crop and flip), drawn from each client's
    generator as a fednet client's."""
    loop, fednet, cohort = _both(tmp_path, "synthetic-cifar10", 40, 0.05, 2, 1)
    assert cohort == 2
    assert loop == pytest.approx(fednet, abs=1e-12)
