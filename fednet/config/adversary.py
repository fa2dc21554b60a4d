"""The run settings of Byzantine clients and robust aggregation (--attack, --malicious,
--defense): two sections of RunConfig (config/settings.py), declared like every setting. What
each attack and defense takes is declared in algorithms/robust_spec.py (docs/algorithms.md §10).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fednet.config.declare import setting

# --attack and --defense: the built-in names (algorithms/robust_spec.py registers each one with
# its parameters and facts, algorithms/seam.py holds the table a plugin adds to; the names are
# checked there, so a plugin's are choices too)
ATTACKS = ("none", "labelflip", "signflip", "noise", "backdoor", "alie", "ipm", "minmax", "minsum")
DEFENSES = ("none", "krum", "multikrum", "bulyan", "median", "trimmed_mean", "norm_bound", "centered_clip")


@dataclass(frozen=True)
class AttackConfig:
    """Byzantine clients: which attack, who runs it (drawn from the seed), and its parameters."""

    name: str = setting("none", "Byzantine clients: the attack the malicious clients run (docs/algorithms.md section "
                        "10; parameters by --param)", option="--attack")
    malicious: str = setting("0.2", "With --attack: the malicious clients, a fraction of the population (drawn from "
                             "the seed) or ids:LIST (ids:3,17 or ids:0-9; ids:3+17 in a sweep grid)",
                             option="--malicious", metavar="FRACTION|ids:LIST")
    params: dict[str, Any] = field(default_factory=dict)  # typed by the attack's declarations


@dataclass(frozen=True)
class DefenseConfig:
    """Robust aggregation in place of the FedAvg family's mean, and its parameters."""

    name: str = setting("none", "Robust aggregation in place of the mean of fedavg, fedprox and the FedOpt family "
                        "(fedavgm, fedadam, fedyogi, fedadagrad; docs/algorithms.md section 10; parameters by "
                        "--param)", option="--defense")
    params: dict[str, Any] = field(default_factory=dict)  # typed by the defense's declarations
