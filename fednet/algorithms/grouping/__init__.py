"""FedSeq grouping: client approximators, heterogeneity measures and superclient builders (docs/algorithms.md §4.3-§4.5)."""
from __future__ import annotations

from fednet.algorithms.grouping.approximators import (
    APPROXIMATORS, check_combination, classifier_vector, confidence_vector, pca_reduce,
)
from fednet.algorithms.grouping.measures import MEASURES, PROBABILITY_ONLY, measure
from fednet.algorithms.grouping.superclients import GROUPINGS, group, representation, superclient_stats

__all__ = [
    "APPROXIMATORS", "GROUPINGS", "MEASURES", "PROBABILITY_ONLY", "check_combination", "classifier_vector",
    "confidence_vector", "group", "measure", "pca_reduce", "representation", "superclient_stats",
]
