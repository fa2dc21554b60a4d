"""bench_secagg.py's --plugin: what its cells need and fednet does not ship.

- Dropouts: a seeded fraction of each round's clients drops out of secure aggregation at one
  stage (their task fails there), FEDNET_SECAGG_DROP=FRACTION:STAGE; what real dropouts do, at
  a known rate and stage (after key sharing).
- `--model bench_mlp`: a two-layer perceptron (input -> FEDNET_BENCH_MLP_HIDDEN, 256 by
  default, ReLU -> classes; 18,186 parameters on synthetic-fedprox's 60 features), a vector
  of a size where the protocol's fixed costs (keys, shares) and the masked input can both be
  seen, where synthetic-fedprox's own model (mclr) has 610 parameters.
"""
from __future__ import annotations

import math
import os

import numpy as np
from torch import nn

from fednet.algorithms import secagg
from fednet.models.nets import register_model


def _mlp(num_classes: int, shape: tuple[int, ...]) -> nn.Module:
    hidden = int(os.environ.get("FEDNET_BENCH_MLP_HIDDEN", "256"))
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(shape), hidden), nn.ReLU(),
                         nn.Linear(hidden, num_classes))


register_model("bench_mlp", _mlp)

_SPEC = os.environ.get("FEDNET_SECAGG_DROP", "")
if _SPEC:
    _FRACTION, _STAGE = float(_SPEC.split(":")[0]), _SPEC.split(":")[1]
    _RUN = secagg.SecAggClient.run

    def run(self, ctx, task):  # type: ignore[no-untyped-def]
        if task.body.get("secagg") == _STAGE:
            draw = np.random.default_rng([ctx.cfg.seed, task.round, ctx.cid, 7]).random()
            if draw < _FRACTION:
                raise RuntimeError(f"client {ctx.cid} dropped out at stage {_STAGE}")
        return _RUN(self, ctx, task)

    secagg.SecAggClient.run = run  # type: ignore[method-assign]
