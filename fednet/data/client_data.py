"""What one client holds: index views of its training partition and of the test split it
evaluates on, with its private label permutation when the scenario asks for one
(docs/algorithms.md §2.4-§2.6). The images stay in the run's shared arrays (never copied per
client); only row indices and labels are the client's own."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fednet.data import natural
from fednet.data.datasets import Dataset, run_test_rows
from fednet.data.domains import client_labels, domain_test_indices, label_permutation
from fednet.data.partition import run_client_indices
from fednet.errors import ConfigError


@dataclass
class ClientData:
    """One client's rows of the shared images, and its labels (already permuted if required)."""

    images: np.ndarray        # the run's training images (shared, not copied)
    rows: np.ndarray          # this client's rows of `images`
    y: np.ndarray
    test_images: np.ndarray   # the run's test images (shared, not copied)
    test_rows: np.ndarray     # the rows this client evaluates on
    test_y: np.ndarray
    permutation: np.ndarray | None

    @property
    def x(self) -> np.ndarray:
        """The client's training images gathered into a new array (a copy: for inspection)."""
        return self.images[self.rows]

    @property
    def test_x(self) -> np.ndarray:
        """The client's test images gathered into a new array (a copy: for inspection)."""
        return self.test_images[self.test_rows]


def client_data(ds: Dataset, data_cfg, num_clients: int, seed: int, cid: int,
                indices: np.ndarray | None = None) -> ClientData:
    """Client cid's train partition and test split; `domain` clients test on their domain only.

    `indices` (the server's partition, sent at registration) spares a client process from
    computing the whole partition itself and makes the server's copy the one every host uses.
    Without a domain partition or permuted labels every client of a process shares one test
    index and one label array (run_test_rows). A naturally federated dataset's client holds
    its own user's data and tests on that user's held-out samples (natural.py).
    """
    if getattr(ds, "natural", None) is not None:
        images, idx, y, test_images, trows, ty = natural.client_arrays(
            ds, data_cfg, num_clients, seed, cid, indices)
        perm = None
        if getattr(data_cfg, "permute", False):
            perm = label_permutation(ds.num_classes, seed, cid)
            y, ty = client_labels(y, perm), client_labels(ty, perm)
        return ClientData(images, idx, y, test_images, trows, ty, perm)
    natural.check(ds, data_cfg, num_clients)  # --partition natural of another dataset
    if indices is None:
        idx = run_client_indices(ds, data_cfg, num_clients, seed, cid)
    else:
        idx = checked_indices(indices, len(ds.train_y))
    trows, ty = run_test_rows(ds, data_cfg.exemplars, seed)
    if data_cfg.partition == "domain":
        ti = domain_test_indices(ty, cid, num_clients, dataset=ds.name,
                                 class_names=ds.class_names or None)
        trows, ty = trows[ti], ty[ti]
    y = ds.train_y[idx]
    perm = None
    if getattr(data_cfg, "permute", False):
        perm = label_permutation(ds.num_classes, seed, cid)
        y, ty = client_labels(y, perm), client_labels(ty, perm)
    return ClientData(ds.train_x, idx, y, ds.test_x, trows, ty, perm)


def checked_indices(indices: np.ndarray, n: int) -> np.ndarray:
    """Indices received from the server: 1-D integers inside the training set, or ConfigError."""
    idx = np.asarray(indices)
    if idx.ndim != 1 or idx.dtype.kind not in "iu":
        raise ConfigError(f"partition indices must be a 1-D integer array (got {idx.dtype}, "
                         f"{idx.ndim}-D)")
    if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= n):
        raise ConfigError(f"partition indices outside the training set of {n} samples: the "
                         "server and this client load different datasets (check --data-root)")
    return idx.astype(np.int64, copy=False)
