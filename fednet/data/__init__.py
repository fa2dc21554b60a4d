"""Datasets, client partitions, label permutations, augmentation and statistics (no wire or process knowledge)."""
from __future__ import annotations

from fednet.data.datasets import (DATASETS, Dataset, clear_cache, load_dataset, run_test_split,
                                   split_exemplars, stratified_split)
from fednet.data.domains import client_labels, domain_classes, domain_test_indices, label_permutation
from fednet.data.partition import (PERMUTABLE, SCHEMES, client_indices, partition, run_client_indices,
                                   run_partition)
from fednet.data.stats import label_histogram, partition_summary
from fednet.data.torchvision_sets import NORMALIZATION

__all__ = [
    "DATASETS",
    "Dataset",
    "NORMALIZATION",
    "PERMUTABLE",
    "SCHEMES",
    "clear_cache",
    "client_indices",
    "client_labels",
    "domain_classes",
    "domain_test_indices",
    "label_histogram",
    "label_permutation",
    "load_dataset",
    "partition",
    "partition_summary",
    "run_client_indices",
    "run_test_split",
    "run_partition",
    "split_exemplars",
    "stratified_split",
]
