"""Datasets, client partitions and their statistics (numpy only; no wire or process knowledge)."""
from __future__ import annotations

from fednet.data.datasets import DATASETS, Dataset, clear_cache, load_dataset, stratified_split
from fednet.data.partition import SCHEMES, client_indices, partition
from fednet.data.stats import label_histogram, partition_summary

__all__ = [
    "DATASETS",
    "Dataset",
    "SCHEMES",
    "clear_cache",
    "client_indices",
    "label_histogram",
    "load_dataset",
    "partition",
    "partition_summary",
    "stratified_split",
]
