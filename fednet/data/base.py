"""The Dataset record every loader returns, and the built-in dataset names: a leaf, so that the
loaders (torchvision_sets, synthetic, leaf, synthetic_fedprox) and datasets.py, which calls them,
do not import each other."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

DATASETS = ("digits", "cifar10", "cifar100", "svhn", "synthetic-cifar10", "synthetic-cifar100")
"""Names accepted by load_dataset (and --dataset), besides NATURAL."""
NATURAL = ("synthetic-fedprox", "femnist", "shakespeare", "sent140")
"""The naturally federated datasets: each client is one user with its own data (natural.py)."""

TEST_FRACTION = 0.2
"""Share of each class held out as the global test set for datasets without an official split."""


@dataclass
class Dataset:
    """A train/test pair of normalized image arrays plus their shape metadata."""

    name: str
    train_x: np.ndarray
    train_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray
    num_classes: int
    input_shape: tuple[int, ...]
    class_names: tuple[str, ...] = ()
    objective: str = ""  # the task's loss and score (training/objective.py); "" = classification
    natural: Any = None  # a naturally federated dataset's clients (natural.Natural); None: partitioned
