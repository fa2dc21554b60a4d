"""Label statistics of datasets and client partitions (for logs, summary.json's `partition`,
clients.jsonl and tests)."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def label_histogram(labels: np.ndarray, num_classes: int) -> list[int]:
    """Count of each class 0..num_classes-1 in labels."""
    labels = np.asarray(labels, dtype=np.int64)
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        raise ValueError(f"labels must lie in 0..{num_classes - 1}, got {labels.min()}..{labels.max()}")
    return [int(n) for n in np.bincount(labels, minlength=num_classes)]


def partition_summary(parts: Sequence[np.ndarray], labels: np.ndarray, num_classes: int) -> dict:
    """Client sizes (min/mean/max/std), mean classes per client and mean min/max class balance over all classes."""
    labels = np.asarray(labels)
    sizes = np.array([len(p) for p in parts], dtype=np.int64)
    hists = np.array([label_histogram(labels[p], num_classes) for p in parts], dtype=np.int64)
    if hists.size == 0:
        hists = np.zeros((0, num_classes), dtype=np.int64)
    top = hists.max(axis=1, initial=0)
    low = hists.min(axis=1) if hists.shape[0] and num_classes else np.zeros(len(parts), dtype=np.int64)
    balance = np.where(top > 0, low / np.maximum(top, 1), 0.0)
    used = np.concatenate([np.asarray(p, dtype=np.int64) for p in parts]) if parts else np.empty(0, np.int64)
    return {
        "clients": len(parts),
        "samples": int(sizes.sum()),
        "unique_samples": int(np.unique(used).size),
        "min_size": int(sizes.min()) if sizes.size else 0,
        "mean_size": float(sizes.mean()) if sizes.size else 0.0,
        "max_size": int(sizes.max()) if sizes.size else 0,
        "std_size": float(sizes.std()) if sizes.size else 0.0,
        "mean_classes": float((hists > 0).sum(axis=1).mean()) if sizes.size else 0.0,
        "mean_balance": float(balance.mean()) if sizes.size else 0.0,
        **population(hists),
    }


QUANTILES = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0)


def population(hists: np.ndarray) -> dict:
    """The population in summaries that do not grow with it: the quantiles (QUANTILES) of the
    clients' sizes and of their classes, and the samples of each class over all clients."""
    hists = np.asarray(hists, dtype=np.int64)
    if not hists.shape[0]:
        return {"size_quantiles": {}, "classes_quantiles": {}, "label_counts": []}
    sizes, classes = hists.sum(axis=1), (hists > 0).sum(axis=1)

    def at(x: np.ndarray) -> dict[str, float]:
        return {f"p{round(q * 100)}": float(v)
                for q, v in zip(QUANTILES, np.quantile(x, QUANTILES))}

    return {"size_quantiles": at(sizes), "classes_quantiles": at(classes),
            "label_counts": [int(v) for v in hists.sum(axis=0)]}
