"""Run configuration: the settings, each declared once (declare.py, settings.py), and their
readers (dicts, TOML files, dotted-key overrides). A leaf of the package graph: the checks of a
whole configuration against the algorithms (validate, eval_mode) are algorithms/checks.py.
"""
from __future__ import annotations

from fednet.config.adversary import ATTACKS, DEFENSES, AttackConfig, DefenseConfig
from fednet.config.privacy import DPConfig
from fednet.config.settings import (AUGMENTS, EVAL_MODES, LATENCY_PRESETS, OPTIMIZERS, PARTITIONS,
                                    TABLES, AlgoConfig, DataConfig,
                                    LatencyConfig, NetConfig,
                                    RunConfig, TrainConfig, declaration, declarations, flatten,
                                    from_dict, load_toml, merge, to_toml)

__all__ = ["ATTACKS", "DEFENSES", "TABLES", "AttackConfig", "DefenseConfig",
           "AUGMENTS", "EVAL_MODES", "LATENCY_PRESETS", "OPTIMIZERS", "PARTITIONS", "AlgoConfig",
           "DataConfig", "DPConfig", "LatencyConfig", "NetConfig", "RunConfig", "TrainConfig", "declaration",
           "declarations", "flatten", "from_dict", "load_toml", "merge", "to_toml"]
