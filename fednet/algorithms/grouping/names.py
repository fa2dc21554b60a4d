"""The names FedSeq's grouping accepts (no torch, no numpy: the CLI's choices come from here)."""
from __future__ import annotations

APPROXIMATORS = ("confidence", "clf_last", "clf_last2", "clf_all")
"""Names accepted by --param approximator=...; clf_* are classifier-weight approximators."""

MEASURES = ("kl", "gini", "cosine", "euclidean", "wasserstein")
"""Names accepted by measure() (and --param measure=...); larger = more heterogeneous = preferred."""

PROBABILITY_ONLY = frozenset({"kl", "gini"})
"""Measures that need probability vectors (confidence approximator only)."""

GROUPINGS = ("random", "kmeans", "greedy")
"""Names accepted by group() (and --param grouping=...)."""
