"""A malicious client inside its executor (core/executor.py): its poisoned data, and the update
it sends in place of its honest one. Spec: docs/algorithms.md §10.1; the math: attacks.py.

Who is malicious is drawn from the run's seed (robust_spec.malicious_ids), so every process
knows it from the configuration alone; the attacker runs the same executor and the same local
update as an honest client. Label flipping and the backdoor poison the client's own training
data when its executor is built; the other attacks replace the update after training.

Colluding attacks (ALIE, IPM, min-max, min-sum) need the honest updates of the colluders. The
colluders are one adversary: each attacker holds the colluders' training data (rebuilt from the
run's partition, as any process can) and computes their honest updates from the round's model
itself, its own being its real local update. Nothing is read from the server or from another
process, and local = launch. The honest updates a process computes for the round's model are
cached (keyed by round, a digest of the model and the colluder), so the attackers of one
process (all of them under `fednet local`) train each colluder once per round.
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import hashlib
import math
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
import torch

from fednet import rng
from fednet.algorithms import attacks as A
from fednet.algorithms.aggregate import flat
from fednet.algorithms import robust_spec as R
from fednet.algorithms.contract import ClientContext
from fednet.types import Arrays, Task
from fednet.config import RunConfig

_HONEST: dict[tuple, Arrays] = {}  # (round, model digest, colluder) -> its honest update


def digest(arrays: Arrays) -> str:
    """A digest of a model's arrays (names, dtypes, shapes, bytes)."""
    h = hashlib.blake2b(digest_size=16)
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        h.update(f"{name}|{a.dtype.str}|{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def floats(arrays: Arrays) -> list[str]:
    """The floating entries in name order: the coordinates of an update."""
    return sorted(n for n, a in arrays.items() if np.asarray(a).dtype.kind == "f")


def unflat(vec: np.ndarray, like: Arrays, names: list[str]) -> Arrays:
    """`like` with its floating entries taken from vec (cast to their dtypes)."""
    out, at = dict(like), 0
    for n in names:
        a = np.asarray(like[n])
        out[n] = vec[at:at + a.size].reshape(a.shape).astype(a.dtype)
        at += a.size
    return out


@functools.cache
def trigger_value(dataset: str, data_root: str) -> float:
    """The trigger's pixel value: the brightest value of the dataset's training images."""
    from fednet.data import load_dataset

    return float(np.max(load_dataset(dataset, data_root or None, False).train_x))


def trigger_side(p: Any, input_shape: tuple[int, ...]) -> int:
    return int(p.trigger_size) or max(2, int(input_shape[-1]) // 8)


def stamp(x: torch.Tensor, side: int, value: float) -> torch.Tensor:
    """Images with the square trigger in their bottom-right corner (a copy)."""
    out = x.clone()
    out[..., -side:, -side:] = value
    return out


class Attacker:
    """One malicious client's attack (built only for the clients robust_spec draws)."""

    def __init__(self, cfg: RunConfig, cid: int) -> None:
        self.cfg, self.cid, self.name = cfg, cid, cfg.attack.name
        self.p = R.attack_params(cfg)
        self.ids = R.malicious_ids(cfg)

    # ---- data poisoning, when the executor is built ------------------------------------------
    def poison(self, ctx: ClientContext, num_classes: int, input_shape: tuple[int, ...]) -> None:
        """Label flipping: y -> C - 1 - y. Backdoor: a share of the rows stamped with the
        trigger and relabelled to the target. The number of rows never changes."""
        if self.name == "labelflip":
            ctx.y = (num_classes - 1) - ctx.y
        elif self.name == "backdoor":
            x = ctx.x.materialize() if hasattr(ctx.x, "materialize") else ctx.x.clone()
            n = len(x)
            k = min(n, max(1, math.ceil(self.p.poison * n)))
            rows = np.sort(rng.generator(self.cfg.seed, "backdoor", -1, self.cid)
                           .choice(n, k, replace=False))
            idx = torch.from_numpy(rows)
            d = self.cfg.data
            x[idx] = stamp(x[idx], trigger_side(self.p, input_shape),
                           trigger_value(d.dataset, d.data_root))
            y = ctx.y.clone()
            y[idx] = int(self.p.target)
            ctx.x, ctx.y = x, y

    # ---- the update sent ----------------------------------------------------------------------
    def forge(self, ex: Any, task: Task, honest: Arrays, received: Arrays) -> Arrays:
        """The arrays to send instead of `honest` (trained from `received`)."""
        if self.name == "labelflip":
            return honest
        names = floats(received)
        base = flat(received, names)
        delta = flat(honest, names) - base
        mal = self._update(ex, task, delta, received, names)
        return unflat(base + mal, honest, names)

    def _update(self, ex: Any, task: Task, delta: np.ndarray, received: Arrays,
                names: list[str]) -> np.ndarray:
        p = self.p
        spec = R.attack_spec(self.name)
        if spec.forge is not None:  # a registered forgery (a plugin's): the delta, its params
            gen = rng.generator(self.cfg.seed, f"attack-{self.name}", task.round, self.cid)
            return np.asarray(spec.forged(delta, p, gen), dtype=np.float64).reshape(delta.shape)
        if self.name == "signflip":
            return A.sign_flip(delta, p.flip)
        if self.name == "noise":
            gen = rng.generator(self.cfg.seed, "attack-noise", task.round, self.cid)
            return A.gaussian(delta.size, p.sigma, gen)
        if self.name == "backdoor":
            return A.boosted(delta, p.boost or self.auto_boost())
        h = self.colluders(ex, task, delta, received, names)
        if self.name == "alie":
            n, m = A.alie_round(R.round_size(self.cfg), len(self.ids) / self.cfg.clients)
            return A.alie(h, p.z or R.alie_z(n, m))
        if self.name == "ipm":
            return A.ipm(h, p.epsilon)
        return A.min_max(h, self.name, p.deviation, p.gamma_init)

    def auto_boost(self) -> float:
        """Model replacement's γ = n / (η a): n clients per round, a attackers expected among
        them, η the server's learning rate (1 for FedAvg)."""
        n = R.round_size(self.cfg)
        a = max(1, round(n * len(self.ids) / self.cfg.clients))
        eta = float(self.cfg.algo.params.get("server_lr", 1.0))
        return n / (eta * a)

    # ---- the colluders' honest updates ---------------------------------------------------------
    def known(self) -> list[int]:
        """The colluders whose honest updates this attacker uses: itself first, then the
        other malicious clients by id, `known` in all (0: the attackers expected in a round,
        round(n x share), at least 2; with every client in every round, all of them)."""
        order = [self.cid] + [c for c in self.ids if c != self.cid]
        n = R.round_size(self.cfg)
        k = self.p.known or max(2, round(n * len(self.ids) / self.cfg.clients))
        return order[:k]

    def colluders(self, ex: Any, task: Task, delta: np.ndarray, received: Arrays,
                  names: list[str]) -> np.ndarray:
        """H: the known colluders' honest updates (k, d), this attacker's own first."""
        key = (task.round, digest(received))
        for k in [k for k in _HONEST if k[:2] != key]:  # a new round's model: forget the old
            del _HONEST[k]
        rows = [delta]
        base = flat(received, names)
        for j in self.known()[1:]:
            got = _HONEST.get((*key, j))
            if got is None:
                got = _HONEST[(*key, j)] = honest_update(ex, j, task, received)
            rows.append(flat(got, names) - base)
        return np.stack(rows)


def honest_update(ex: Any, j: int, task: Task, received: Arrays) -> Arrays:
    """Colluder j's honest local update from `received`, computed in this process from j's own
    partition of the run (the same data, seeded batches and rule as j's own executor)."""
    from fednet.data.client_data import client_data
    from fednet.data.views import Rows

    cfg = ex.cfg
    cd = client_data(ex.dataset, cfg.data, cfg.clients, cfg.seed, j)
    dev = ex.device
    ctx = dataclasses.replace(ex.ctx, cid=j, model=copy.deepcopy(ex.ctx.model),
                              x=Rows.of(cd.images, cd.rows, dev),
                              y=torch.from_numpy(np.ascontiguousarray(cd.y)).to(dev),
                              state=ex.update.new_state())
    own = Task(task.task_id, task.round, [j], {k: np.array(a, copy=True)
                                               for k, a in received.items()}, dict(task.body))
    arrays, _ = ex.update.run(ctx, own)
    return {k: np.array(a, copy=True) for k, a in arrays.items()}


def attacker_for(cfg: RunConfig, cid: int) -> Attacker | None:
    """Client cid's Attacker when the run's attack draws it, else None."""
    if cfg.attack.name == "none" or cid not in set(R.malicious_ids(cfg)):
        return None
    return Attacker(cfg, cid)


class Scoring(Protocol):
    """What an attack's metric needs of the server's evaluator (core/evaluate.py)."""

    def score(self, arrays: Arrays, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]: ...

    def test_set(self) -> tuple[torch.Tensor, torch.Tensor]: ...


def attack_metrics(cfg: RunConfig, ev: Scoring) -> Callable[[Arrays], dict[str, float]] | None:
    """The attack's own metrics of each evaluated model, for every row (None: it has none):
    the backdoor's success rate."""
    if cfg.attack.name != "backdoor":
        return None
    return functools.partial(_backdoor_success, R.attack_params(cfg), cfg.data, ev)


def _backdoor_success(p: Any, d: Any, ev: Scoring, arrays: Arrays) -> dict[str, float]:
    """The share of the test examples not of the target label that the model classifies as
    the target once the trigger is stamped on them."""
    x, y = ev.test_set()
    keep = (y != int(p.target)).nonzero().flatten()
    if not len(keep):
        return {"attack_success": float("nan")}
    xs = stamp(x[keep], trigger_side(p, tuple(x.shape[1:])), trigger_value(d.dataset, d.data_root))
    target = torch.full((len(keep),), int(p.target), dtype=y.dtype)
    return {"attack_success": float(ev.score(arrays, xs, target)[0])}


def snapshot(arrays: Arrays) -> Arrays:
    """A copy of the received model (training may write into the received buffers)."""
    return {k: np.array(a, copy=True) for k, a in arrays.items()}
