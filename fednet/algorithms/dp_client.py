"""Local differential privacy (docs/algorithms.md §11.3): a client clips its own update and adds
Gaussian noise before the result leaves it, so the server and everyone after it see only the
privatized update. A wrapper around a client half that sends models (LocalDPClient).

    result = theta_t + clip(theta_k - theta_t, C) + N(0, (z C)^2 I)

theta_t is the model the task brought (copied before training: the received arrays may become
the model's memory), every floating entry of the state is clipped and noised together, and the
noise comes from the stream (seed, "dp-local", round, client). The training loss is withheld
from the result's body (it is a function of the client's data that no noise covers).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from fednet import opcount, rng
from fednet.algorithms.contract import ClientContext, ClientUpdate
from fednet.privacy.mechanisms import floating, privatize
from fednet.types import Arrays, Task


class LocalDPClient:
    """A client half that sends its model, wrapped: its update privatized before it leaves (see
    the module's docstring). A wrapper, not a class made at run time: it forwards, by name, the
    members the executor and the batched engine read of a client half."""

    def __init__(self, inner: ClientUpdate) -> None:
        self.inner, self.cfg = inner, inner.cfg
        self.State, self.keeps_model = inner.State, inner.keeps_model
        self.sends_updates, self.trains_on_pooled = inner.sends_updates, inner.trains_on_pooled
        self.adopts_received = bool(getattr(inner, "adopts_received", False))
        self.local = getattr(inner, "local", None)  # the local rule (--batch-clients reads it)

    def stateful(self) -> bool:
        return self.inner.stateful()

    def new_state(self) -> Any:
        return self.inner.new_state()

    def run(self, ctx: ClientContext, task: Task) -> tuple[Arrays, dict[str, Any]]:
        """The client half's own update, privatized."""
        ref = {n: np.array(task.arrays[n], dtype=np.float64) for n in floating(task.arrays)}
        arrays, body = self.inner.run(ctx, task)
        dp = self.cfg.dp
        gen = rng.generator(self.cfg.seed, "dp-local", task.round, ctx.cid)
        arrays, _, _ = privatize(arrays, ref, dp.clip, dp.noise * dp.clip, gen)
        # its noise on the clock: one Gaussian draw a noised value (the task's meter, at the
        # client's noise_per_s; opcount's "noise", as DP-SGD's step charges it)
        opcount.charge({"noise": float(sum(ref[n].size for n in ref))})
        return arrays, {k: v for k, v in body.items() if k != "loss"}
