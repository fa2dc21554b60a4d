"""Local differential privacy (docs/algorithms.md §11.3): a client clips its own update and adds
Gaussian noise before the result leaves it, so the server and everyone after it see only the
privatized update. A mixin placed before a client half that sends models (wrap_client).

    result = theta_t + clip(theta_k - theta_t, C) + N(0, (z C)^2 I)

theta_t is the model the task brought (copied before training: the received arrays may become
the model's memory), every floating entry of the state is clipped and noised together, and the
noise comes from the stream (seed, "dp-local", round, client). The training loss is withheld
from the result's body (it is a function of the client's data that no noise covers).
"""
from __future__ import annotations

import functools
from typing import Any

import numpy as np

from fednet import rng
from fednet.algorithms.contract import ClientContext
from fednet.privacy.mechanisms import floating, privatize
from fednet.types import Arrays, Task
from fednet.config import RunConfig


@functools.cache
def wrap_client(cls: type) -> type:
    """`cls` (a client half that sends its model) with local DP first in its MRO."""
    return type(f"Private{cls.__name__}", (LocalDPClient, cls), {"__module__": __name__})


class LocalDPClient:
    """The mixin; see the module's docstring."""

    cfg: RunConfig

    def run(self, ctx: ClientContext, task: Task) -> tuple[Arrays, dict[str, Any]]:
        """The client half's own update, privatized."""
        ref = {n: np.array(task.arrays[n], dtype=np.float64) for n in floating(task.arrays)}
        arrays, body = super().run(ctx, task)  # type: ignore[misc]  # a mixin: the client half after it
        dp = self.cfg.dp
        gen = rng.generator(self.cfg.seed, "dp-local", task.round, ctx.cid)
        arrays, _, _ = privatize(arrays, ref, dp.clip, dp.noise * dp.clip, gen)
        return arrays, {k: v for k, v in body.items() if k != "loss"}
