"""The server on the clock: its rates (--server-profile) and the work of a round's aggregation
counted in operations (network/ops.py) from the round's own parameters: the results it
aggregates (n), the model's floating values (d), the defense and its f, the server optimizer,
central DP's noise. Secure aggregation's unmasking is counted by fednet/secagg/cost.py.

Counted as fednet's aggregation does the work (algorithms/aggregate.py, robust.py, fedopt.py):
the streamed mean scales and adds each result (2 n d); the robust rules stack the n updates
(n d) and then: Krum and Multi-Krum a Gram matrix x x^T (2 n^2 d FLOPs of matrix product) and
the n norms (2 n d); Bulyan counts its own (robust_spec.bulyan_work, its DefenseSpec's work); the
median a selection (2 n d); the trimmed mean a sort (n log2 n d); norm bounding and centered
clipping their norms and scaled sums (3 n d a pass). Server optimizers add a few element
operations per value (FedAdam's and FedYogi's 10 d). Central DP draws d Gaussian values.
The asynchronous servers count their own work where it happens (algorithms/asynchronous.py:
FedAsync's mix of each arriving model, fold_ops; FedBuff's step once K updates are in,
buffer_ops)."""
from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fednet.errors import ConfigError
from fednet.network import ops
from fednet.network.ops import Ops
from fednet.config import RunConfig

OPTIMIZER_OPS = {"fedavgm": 3, "fedadam": 10, "fedyogi": 10, "fedadagrad": 6}
"""Element operations per model value of a server optimizer's step (FedOpt's rules)."""


def server_rates(spec: str) -> dict[str, float]:
    """--server-profile: a class of network/ops.SERVERS, or a JSON file of {op}_per_s rates
    (`fednet calibrate --server-out` writes this host's)."""
    if spec in ops.SERVERS:
        return dict(ops.SERVERS[spec])
    p = Path(spec)
    if not p.is_file():
        raise ConfigError(f"--server-profile '{spec}' is neither a server class "
                          f"({', '.join(ops.SERVERS)}) nor a file")
    try:
        got = json.loads(p.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"--server-profile {p}: cannot read it ({e})") from None
    if not isinstance(got, dict):
        raise ConfigError(f"--server-profile {p}: a JSON object of rates ({', '.join(ops.RATES)})")
    bad = sorted(str(k) for k in got if k not in ops.RATES and k != "source")
    if bad:
        raise ConfigError(f"--server-profile {p}: unknown rate(s) {', '.join(bad)}; the rates "
                          f"are {', '.join(ops.RATES)}")
    rates = {k: _rate(v) for k, v in got.items() if k in ops.RATES}
    if any(not math.isfinite(v) or v < 0 for v in rates.values()):
        raise ConfigError(f"--server-profile {p}: every rate is a finite number >= 0")
    return rates


def _rate(v: object) -> float:
    """A JSON value as a rate (nan where it is not a number: refused by the caller)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return math.nan
    return float(v)


def defense_ops(name: str, n: int, d: int, f: int, p: Any = None) -> Ops:
    """The work of the defense `name` on n updates of d values, f assumed Byzantine (a rule
    whose DefenseSpec declares its own `work` is counted by it instead: Bulyan's,
    robust_spec.bulyan_work)."""
    if n <= 0 or d <= 0:
        return {}
    stack = n * d
    if name in ("krum", "multikrum"):
        keep = (getattr(p, "keep", 0) or n - f) if name == "multikrum" else 1
        return {"gemm": 2 * n * n * d, "stream": stack + 2 * n * d + keep * d}
    if name == "median":
        return {"stream": stack + 2 * n * d}
    if name == "trimmed_mean":
        return {"stream": stack + n * math.log2(max(n, 2)) * d + n * d}
    if name == "norm_bound":
        return {"stream": stack + 3 * n * d}
    if name == "centered_clip":
        return {"stream": stack + 3 * n * d * max(1, int(getattr(p, "iters", 1) or 1))}
    return mean_ops(n, d)


def mean_ops(n: int, d: int) -> Ops:
    """The streamed weighted mean of n results (each scaled and added), then divided."""
    return {"stream": 2 * n * d + d} if n > 0 else {}


def aggregation_ops(cfg: RunConfig, n: int, d: int, f: int = 0, p: Any = None,
                    central_dp: bool = False,
                    work: Callable[..., dict[str, float]] | None = None) -> Ops:
    """A synchronous round's aggregation of n results of d values under cfg: the defense (or
    the mean), the server optimizer's step, central DP's noise (`central_dp`: the mechanism
    adds its noise at the server, a plugin's too). `work`: the defense's own count
    (DefenseSpec.work, a plugin's), in place of defense_ops' table."""
    if n <= 0:
        return {}
    name = cfg.defense.name
    out = (dict(work(n, d, f, p)) if work is not None else defense_ops(name, n, d, f, p)) \
        if name != "none" else mean_ops(n, d)
    step = OPTIMIZER_OPS.get(cfg.algo.name, 0)
    if step:
        ops.add(out, {"stream": step * d})
    if central_dp:
        ops.add(out, {"noise": d, "stream": 2 * n * d})  # each update clipped, noise added
    return out
