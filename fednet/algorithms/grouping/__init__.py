"""FedSeq grouping: client approximators, heterogeneity measures and superclient builders
(docs/algorithms.md §4.3-§4.5).

Names are loaded on first use, so that `grouping.names` (the CLI's choices) imports no torch."""
from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "APPROXIMATORS": "names", "GROUPINGS": "names", "MEASURES": "names", "PROBABILITY_ONLY": "names",
    "check_combination": "approximators", "classifier_vector": "approximators",
    "confidence_vector": "approximators", "pca_reduce": "approximators", "measure": "measures",
    "group": "superclients", "representation": "superclients", "superclient_stats": "superclients",
}
__all__ = sorted(_WHERE)  # noqa: PLE0605 - the names loaded lazily (__getattr__)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
