"""Differential privacy: the accountant (Google's dp-accounting), the mechanisms' arithmetic
(clipping, Gaussian noise from the run's seeded streams, adaptive clipping) and the planning of a
run (noise calibrated to a target epsilon). docs/algorithms.md §11 states each mechanism's
guarantee. A leaf: numpy only; dp-accounting is imported where it is used, so a run without
--dp never needs it, and one that needs it and lacks it gets one line naming the extra."""
from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from typing import Any

from fednet.errors import ConfigError

EXTRA = "pip install 'fednet[dp]'"
LIBRARIES = {"dp_accounting": "dp-accounting", "opacus": "opacus"}


def missing(module: str) -> bool:
    """True when the library `module` (dp_accounting, opacus) is not installed."""
    return importlib.util.find_spec(module) is None


def require(module: str, feature: str) -> Any:
    """The library `module`, or a ConfigError in one line naming `feature` and the extra."""
    if missing(module):
        raise ConfigError(f"{feature} needs {LIBRARIES.get(module, module)}, which is not "
                          f"installed: {EXTRA}")
    return importlib.import_module(module)


KINDS: dict[str, str] = {}
"""--dp NAME -> where its noise goes (central, local, distributed): filled by every DP
mechanism's registration (algorithms/seam.register_dp), so that this leaf's planning reads a
plugin's mechanism as the kind it is."""
EVENTS: dict[str, Callable[..., Any]] = {}
"""--dp NAME -> its accounting event(z, q) (a plugin's mechanism): the accountant's
("piece", NAME, z, q) events (privacy/accountant.event)."""


def kind(mode: str) -> str:
    """Where the mechanism `mode` adds its noise (a built-in name: itself)."""
    return KINDS.get(mode, mode)
