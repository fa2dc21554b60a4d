"""What one client holds: its training partition and the test split it evaluates on, with its
private label permutation when the scenario asks for one (ALGORITHMS.md 2.4-2.6)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fednet.data.datasets import Dataset, run_test_split
from fednet.data.domains import client_labels, domain_test_indices, label_permutation
from fednet.data.partition import run_client_indices


@dataclass
class ClientData:
    """Numpy views/copies of one client's data (labels already permuted if required)."""

    x: np.ndarray
    y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray
    permutation: np.ndarray | None


def client_data(ds: Dataset, data_cfg, num_clients: int, seed: int, cid: int) -> ClientData:
    """Client cid's train partition and test split; `domain` clients test on their domain only."""
    idx = run_client_indices(ds, data_cfg, num_clients, seed, cid)
    test, _ = run_test_split(ds, data_cfg.exemplars, seed)
    tx, ty = test.test_x, test.test_y
    if data_cfg.partition == "domain":
        ti = domain_test_indices(ty, cid, num_clients, dataset=ds.name,
                                 class_names=ds.class_names or None)
        tx, ty = tx[ti], ty[ti]
    x, y = ds.train_x[idx], ds.train_y[idx]
    perm = None
    if getattr(data_cfg, "permute", False):
        perm = label_permutation(ds.num_classes, seed, cid)
        y, ty = client_labels(y, perm), client_labels(ty, perm)
    return ClientData(x, y, tx, ty, perm)
