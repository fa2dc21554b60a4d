"""The client's half of secure aggregation (--secagg full|plus; the server's half and the
protocol's overview: algorithms/secagg.py): keys, shares and unmask answered by the protocol
(fednet/secagg/client.py), the input stage trained by the inner client half and sent quantized
and masked (under --dp distributed: clipped, rounded and noised, privacy/distributed.py)."""
from __future__ import annotations

import functools
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from fednet import opcount, rng
from fednet.algorithms.contract import ClientContext, ClientUpdate
from fednet.errors import Dropout
from fednet.privacy import distributed, plan
from fednet.secagg import client as C, cost
from fednet.secagg.field import pack, quantize
from fednet.secagg.server import STAGES, parse_drops
from fednet.types import Arrays, Task

if TYPE_CHECKING:
    from fednet.config import RunConfig

PREFIX = "secagg/"  # the protocol's arrays in a training task, beside the model's
BAD_FROM = "secagg_bad_from"  # an input reply's senders whose sealed shares did not open


def _floats(arrays: Arrays) -> list[str]:
    """The names of the floating arrays, in the order their values are concatenated."""
    return sorted(n for n, a in arrays.items() if a.dtype.kind == "f")


def counted_prefix(cfg: RunConfig) -> str:
    """The algorithm's Spec.secagg_counted (its results' arrays summed with every client
    weighing 1, after the model's values in the masked vector), or ''."""
    from fednet.algorithms import registry

    return registry.get(cfg.algo.name).secagg_counted


class SecAggClient:
    """A client's stages around the inner client half: keys, shares and unmask answered by the
    protocol (fednet/secagg/client.py), the input stage trained by the inner half and sent
    masked."""

    adopts_received = False  # the input task carries the protocol's arrays beside the model

    def __init__(self, inner: ClientUpdate) -> None:
        self.inner = inner
        # what the executor reads of a client half, the inner's (named: no delegation by
        # __getattr__, so a member the wrapper lacks is an AttributeError, not a guess)
        self.State, self.keeps_model = inner.State, inner.keeps_model
        self.sends_updates, self.trains_on_pooled = inner.sends_updates, inner.trains_on_pooled

    def stateful(self) -> bool:
        """The inner's: its per-client state and model live on under secure aggregation."""
        return self.inner.stateful()

    def new_state(self) -> Any:
        return self.inner.new_state()

    def run(self, ctx: ClientContext, task: Task) -> tuple[Arrays, dict[str, Any]]:
        t0 = time.process_time()
        stage, cid, rnd, seed = task.stage, ctx.cid, task.round, ctx.cfg.seed
        _drop(ctx.cfg.net.secagg_drop, stage, seed, rnd, cid)
        if stage == "keys":
            arrays = C.keys(cid, rnd, rng.generator(seed, "secagg-keys", rnd, cid))
            body: dict[str, Any] = {}
        elif stage == "shares":
            a = task.arrays
            arrays = C.shares(C.session(cid, rnd), a["nbrs"], a["c_pks"], a["s_pks"],
                              int(task.body["t"]), rng.generator(seed, "secagg-shares", rnd, cid))
            body = {}
        elif stage == "input" and task.body.get("again"):  # the same update, masked anew
            y = C.remasked(C.session(cid, rnd), task.arrays[PREFIX + "partners"])
            arrays = {"y": _packed(y, task.body)}
            body = {"samples": 0}
        elif stage == "input":
            arrays, body = self._input(ctx, task)
        elif stage == "unmask":
            arrays = C.unmask(C.session(cid, rnd), task.arrays["survivors"],
                              task.arrays["dropped"])
            body = {}
        else:
            raise ValueError(f"a secure-aggregation task of unknown stage {stage!r}")
        return arrays, {**body, "cpu_s": time.process_time() - t0,
                        **({} if stage == "input" else {"samples": 0})}

    def _input(self, ctx: ClientContext, task: Task) -> tuple[Arrays, dict[str, Any]]:
        """Open the shares, train, and send the weighted quantized update masked."""
        b, a, cid, rnd = task.body, task.arrays, ctx.cid, task.round
        s = C.session(cid, rnd)
        bad = C.open_shares(s, a[PREFIX + "from"], a[PREFIX + "sealed"])
        model = {k: v for k, v in a.items() if not k.startswith(PREFIX)}
        arrays, body = self.inner.run(ctx, Task(task.task_id, rnd, task.route, model, task.body,
                                                task.kind, task.hop, task.sim_time))
        names = [n for n in _floats(model) if n in arrays]  # (not what the task adds: SCAFFOLD's c)
        ref = np.concatenate([model[n].ravel() for n in names]).astype(np.float64)
        new = np.concatenate([np.asarray(arrays[n]).ravel() for n in names]).astype(np.float64)
        opcount.charge(cost.flattened(new.size))  # (on the clock: secagg/cost.py)
        if ctx.cfg.dp.mode == "distributed":  # its share of the noise; no loss, weight 1
            body.pop("loss", None)
            opcount.charge(cost.ddp_encoded(new.size))  # (its draws: distributed.py's)
            q = distributed.encode(new - ref, ctx.cfg.dp.clip, ctx.cfg.dp.noise,
                                   plan.ddg_threshold(ctx.cfg),
                                   rng.generator(ctx.cfg.seed, "dp-distributed", rnd, cid))
            return self._masked(s, q, a, bad, body)
        fbits = int(b["fbits"])
        clip = float(b["clip"])
        # the training loss travels as one more value of the masked vector (clipped to
        # [0, clip]): the server learns only the survivors' weighted mean, as of the update
        loss = float(np.nan_to_num(float(body.pop("loss", 0.0)), nan=clip, posinf=clip))
        vec = np.concatenate([new - ref, [min(max(loss, 0.0), clip)]])
        g = rng.generator(ctx.cfg.seed, "secagg-round", rnd, cid)
        levels = int(b.get("levels", 0))  # --compress's common grid (compress/field.py), or 0
        weight = ctx.num_examples
        if levels:  # FedAvg's weight in the value (n / the cohort's largest n <= 1), not a
            # multiplier: every client's grid integer stays within L, the sum within k L
            vec, weight = np.clip(vec, -clip, clip) * (ctx.num_examples / int(b["top"])), 1
            opcount.charge(cost.weighted(vec.size))
        q = quantize(vec, clip, int(b["bits"]), weight, fbits, g, levels)
        apart = _counted(arrays, counted_prefix(ctx.cfg))
        if apart.size:  # SCAFFOLD's control change: its own values, weight 1 (the same stream)
            q = np.concatenate([q, quantize(apart, clip, int(b["bits"]), 1, fbits, g, levels)])
        return self._masked(s, q, a, bad, body, b)

    @staticmethod
    def _masked(s: Any, q: np.ndarray, a: Arrays, bad: list[int], body: dict[str, Any],
                asked: dict[str, Any] | None = None) -> tuple[Arrays, dict[str, Any]]:
        """The input stage's reply: q masked (and kept, should the server ask it again), packed
        when the task `asked` for wbits bits a value."""
        if bad:  # the senders whose shares did not open here: the server leaves them out
            body[BAD_FROM] = bad
        s.q, s.partners = q, frozenset(int(v) for v in a[PREFIX + "partners"])
        return {"y": _packed(C.masked(s, q, a[PREFIX + "partners"]), asked or {})}, body


def _packed(y: np.ndarray, asked: dict[str, Any]) -> np.ndarray:
    """The masked vector as it travels: under --compress's common grid reduced modulo
    2^wbits and packed (secagg/field.pack), else as it is."""
    wbits = int(asked.get("wbits", 0))
    return pack(y, wbits) if wbits else y


def _counted(arrays: Arrays, prefix: str) -> np.ndarray:
    """The values of the result's arrays named with `prefix` (Spec.secagg_counted), by name."""
    names = sorted(n for n in arrays if prefix and n.startswith(prefix))
    return np.concatenate([np.asarray(arrays[n], np.float64).ravel() for n in names]
                          ) if names else np.zeros(0)


@functools.lru_cache(maxsize=8)
def _drops(text: str) -> dict[str, float]:
    return parse_drops(text)


def _drop(text: str, stage: str, seed: int, rnd: int, cid: int) -> None:
    """--secagg-drop: raise Dropout when client cid drops out of round rnd at `stage` (one
    draw per stage from the run's seed, the same under both runtimes)."""
    rate = _drops(text).get(stage, 0.0) if text else 0.0
    if rate <= 0:
        return
    u = rng.generator(seed, "secagg-drop", rnd, cid).random(len(STAGES))[STAGES.index(stage)]
    if u < rate:
        raise Dropout(f"dropped out at stage {stage} (--secagg-drop {text})")
