"""bench_secagg.py's --plugin: what its cells need and fednet does not ship (dropouts at a
stage are fednet's own --secagg-drop STAGE:RATE).

- `--model bench_mlp`: a two-layer perceptron (input -> FEDNET_BENCH_MLP_HIDDEN, 256 by
  default, ReLU -> classes; 18,186 parameters on synthetic-fedprox's 60 features), a vector
  of a size where the protocol's fixed costs (keys, shares) and the masked input can both be
  seen, where synthetic-fedprox's own model (mclr) has 610 parameters.
"""
from __future__ import annotations

import math
import os

from torch import nn

from fednet.models.nets import register_model


def _mlp(num_classes: int, shape: tuple[int, ...]) -> nn.Module:
    hidden = int(os.environ.get("FEDNET_BENCH_MLP_HIDDEN", "256"))
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(shape), hidden), nn.ReLU(),
                         nn.Linear(hidden, num_classes))


register_model("bench_mlp", _mlp)
