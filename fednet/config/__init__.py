"""Run configuration: the settings, each declared once (declare.py, settings.py), their readers (dicts,
TOML files, dotted-key overrides) and the checks of a whole configuration (checks.py).

Importing this package imports no algorithm: checks.py (which asks the algorithm registry) loads
when validate, eval_mode, optimizer_problem, ALGORITHMS or PERSONAL is first used, so that the
algorithms' parameters can be declared in the same language (declare.py) without a cycle.
"""
from __future__ import annotations

from typing import Any

from fednet.config.settings import (AUGMENTS, EVAL_MODES, LATENCY_PRESETS, OPTIMIZERS,
                                    PARTITIONS, AlgoConfig, DataConfig, DPConfig, LatencyConfig, NetConfig,
                                    RunConfig, TrainConfig, declaration, declarations, flatten,
                                    from_dict, load_toml, merge, to_toml)

__all__ = ["AUGMENTS", "EVAL_MODES", "LATENCY_PRESETS", "OPTIMIZERS", "PARTITIONS", "AlgoConfig",
           "DataConfig", "DPConfig", "LatencyConfig", "NetConfig", "RunConfig", "TrainConfig", "declaration",
           "declarations", "flatten", "from_dict", "load_toml", "merge", "to_toml", "validate", "eval_mode",
           "optimizer_problem", "ALGORITHMS", "PERSONAL"]
_CHECKS = ("validate", "eval_mode", "optimizer_problem", "check_ranges")


def __getattr__(name: str) -> Any:
    """The checks (config/checks.py) and the registry's names, loaded when first used."""
    if name in _CHECKS:
        from fednet.config import checks

        return getattr(checks, name)
    if name in ("ALGORITHMS", "PERSONAL"):
        from fednet.config.checks import algorithms

        return algorithms(personal=name == "PERSONAL")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
