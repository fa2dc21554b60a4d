"""Clients trained together: G clients' copies of one architecture, each its own local SGD run,
computed as one batch with torch.func (`functional_call`, `vmap`, `grad`) (issue 56, item 1).

What each client does is exactly what training/local.train does for it alone with SGD (the
default --optimizer): its own data, its own batch order drawn from its own generator in the same
order (`randperm` per epoch, split into batches, the last one short; `augment(batch, generator)`
after each batch's rows are taken), its own learning rate, momentum, Nesterov flag and weight
decay with torch.optim.sgd's arithmetic (d = g + wd p; buf = m buf + d, buf = d on the first
step; d = d + m buf with Nesterov, else buf; p = p - lr d), FedProx's proximal gradient
mu (p - anchor) added before the optimizer step as hooks.prox adds it, and optionally a constant
per-client gradient term (SCAFFOLD's c - c_k, FedDyn's -g_k: hooks.control_variate, hooks.dyn).
Clients of unequal sizes, epochs or batch sizes are padded to the largest batch and the most
steps and masked: a padded row adds nothing to its client's loss or gradient, and a client past
its last step keeps its parameters and momentum unchanged, so each takes exactly its own steps.
Under vmap, which computes every padded slot, a block's clients train in stacks by their width
(_by_width: a client's largest batch rounded up to a power of two, 2 at least, at most its
batch size; a function of the client alone), one stack after another, each padded only to its own width.
The clients are stacked longest first, and a step computes only those still training (a prefix
of the stack, least_clients at least), so a block's short clients do not pay its longest client's steps,
and the step-by-step layout of the batches (_Plan) holds only those steps' slots, not a
clients x most steps x largest batch rectangle. A slot is an index into the block's examples,
gathered once (_sources: the shared images themselves when the clients' rows are views of them;
a natural dataset's clients' own arrays concatenated into a buffer reused block after block),
and a step's views and per-client settings are made once per (clients computed, clients still
training) (_SGD.at): a step costs its kernels, not the block's bookkeeping.
The reported loss is the plain loop's: the batches' mean losses weighted by their sizes.
A step is vmap(grad(loss)) over the clients, except for a linear model on the flattened input
(mclr; _linear_head checks the architecture and probes the forward): its gradient in closed form
by bmm, the same arithmetic without vmap's per-call cost (~1.4 ms against ~0.1 ms a step here),
which is what a block's long tail of a few large clients' steps pays. Under vmap a
non-overlapping max-pooling pools the stacked feature maps in the channels-last layout (_FastPool:
the same values and indices, ~4-14x faster on the small planes of a block of CNN clients).
On a CPU a model whose convolutions are heavy (per_client: CONV_FLOPS_PER_CLIENT or more in
one example's forward, counted from the architecture and the example's shape; fedseq_cnn on
3x32x32 takes 28 MFLOP, the digits CNN on 8x8 0.17) does not run under vmap: its convolutions
are compute-bound per client already, and vmap's grouped convolutions and the copies that fold
the clients into channels lost to the plain loop (1.2x its time, 16 clients of fedseq_cnn; a
grouped convolution written by hand, channels-last or not, 1.2-1.45x). Its clients' steps run
one client at a time (_ClientSteps), each on its batch's real examples in the channels-last
layout (torch's max-pooling of 28x28 planes: 0.12 ms there against 1.9 ms contiguous) and
updated by the same _SGD arithmetic on its own slices: 0.83x the plain loop's process CPU time
(16 clients, one epoch, one thread; femnist_cnn, 21 MFLOP, 0.98-1.05x at one epoch, 0.94x at
five, against 1.77x under vmap). A client's bits then do not depend on its block at all; the
rule is said once per process on the console.

The results are not bitwise the plain loop's: a batched kernel (a bmm for G linear layers, a
grouped convolution for G convolutions, a masked sum for the mean loss, the cross-entropy as a
shifted log-sum-exp in elementwise kernels, fused multiply-adds in the update) adds the same terms
in another order, so each step differs in the last bits of float32, and the differences grow
with the steps as any float32 perturbation does. tests/test_batched.py checks every step against
the plain loop to 1e-5 of each parameter tensor's largest magnitude (measured: 1e-7 to 2e-6),
and in float64 to 1e-12 (measured: 5e-16 after 15 steps of fedseq_cnn): the arithmetic is the
plain loop's. Over many float32 steps a non-smooth network can separate further, as it does from
any perturbation: once a last-bit difference flips a ReLU or a max-pool's choice, the two
trajectories differ by more (fedseq_cnn on 20 random examples, lr 0.15: 4e-7 for 10 steps, then
4e-3, 0.13 by step 15; the plain loop against itself with its start perturbed by 1e-7 jumps at
the same step, to 1e-5).
The same block of clients (the same jobs, in the same order, on the same number of torch
threads) gives the same bits every time. The same client in another block gave the same bits
too on this CPU (1 and 2 threads; blocks of 2 to 40, any place, any neighbours), except in
stacks too small for the kernels of larger ones: the digits CNN alone, G = 1, and an RGB
input's grouped convolution of 2 clients (6 channels: oneDNN's path for fewer than 8) run other
kernels (mclr's bits did not move), so a step computes least_clients(model) clients at least
(2; 3 for RGB) and algorithms/updates.train_ahead trains a smaller block beside copies of its
first client. That is what lets `fednet local` and a `fednet launch`
client process, which hold different blocks, agree bit for bit (a measured property of the
kernels, checked by tests/test_batched_runtime.py, not a guarantee of every backend).

Not batchable (batchable() says why; train_batched raises ValueError with the reason): models with
BatchNorm (a batch's statistics would include the padding, and the running statistics are per
client buffers), dropout (the plain loop draws its masks from the global RNG in the order the
clients run: not reproducible per client), recurrent layers (no vmap batching rule: correct but
slower than the plain loop), any other buffer (a forward may update it), and objectives other
than classification (the padding is masked per example, which needs the per-example loss).
A subclass of Classification with a loss of its own (own_loss) is batched, its clients' steps
computed one client at a time on that loss (_ClientSteps), with a note on the console: vmap's
masked per-example cross-entropy would train it on another loss than its plain loop's.
Other optimizers (Adam, AdamW), DP-SGD and arbitrary hooks or loss terms run in the plain loop.
"""
from __future__ import annotations

import copy
import logging
import weakref
from bisect import bisect_left
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from fednet.data.views import Examples, Rows, gathered
from fednet.training import interrupt
from fednet.training.flops import architecture, kept, template
from fednet.training.local import TrainStats
from fednet.training.objective import Classification, Objective

log = logging.getLogger("fednet.client")

Augment = Callable[[torch.Tensor, torch.Generator], torch.Tensor]
StepHook = Callable[[int, Mapping[str, torch.Tensor]], None]

_DROPOUT = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout,
            nn.FeatureAlphaDropout)


def batchable(model: nn.Module, objective: Objective | None = None) -> str:
    """Why `model` (and `objective`) cannot be trained by train_batched; '' when they can."""
    found: dict[str, list[str]] = {}  # a reason -> the modules it names
    refused: set[str] = set()
    for name, m in model.named_modules():
        label = name or "the model"
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            found.setdefault(f"{type(m).__name__} (batch statistics over the padding; running "
                             "statistics per client)", []).append(label)
            refused.add(name)
        elif isinstance(m, nn.RNNBase):
            found.setdefault(f"{type(m).__name__} (torch.func has no batching rule for its "
                             "kernel: vmap would loop over the clients, slower than the plain "
                             "loop)", []).append(label)
        elif isinstance(m, _DROPOUT) and m.p > 0:
            found.setdefault(f"{type(m).__name__} with p > 0 (the plain loop draws its masks from "
                             "the global RNG in the order the clients run)", []).append(label)
    buffers = [n for n, _ in model.named_buffers() if n.rpartition(".")[0] not in refused]
    if buffers:
        found.setdefault("buffers (a forward may update them, per client)", []).extend(buffers)
    why = [f"{reason} at {_names(where)}" for reason, where in found.items()]
    if objective is not None and not isinstance(objective, Classification):
        why.append(f"objective {objective.name!r} is not classification (padding is masked on "
                   "the per-example cross-entropy)")
    return "; ".join(why)


def _names(names: list[str], most: int = 3) -> str:
    more = f" and {len(names) - most} more" if len(names) > most else ""
    return ", ".join(names[:most]) + more


@dataclass
class ClientJob:
    """One client's local training: its data, batch-order generator and SGD settings.

    start: its starting trainable parameters by name (default: the model's); the proximal
    anchor is the start. correction: a constant added to each trainable parameter's gradient
    (by name) after the proximal term, before weight decay."""

    x: Examples
    y: torch.Tensor
    generator: torch.Generator
    lr: float
    momentum: float = 0.0
    weight_decay: float = 0.0
    nesterov: bool = False
    epochs: int = 1
    batch_size: int = 8
    mu: float = 0.0
    start: Mapping[str, torch.Tensor] | None = None
    correction: Mapping[str, torch.Tensor] | None = None


@dataclass
class BatchedResult:
    """The clients' final trainable parameters and momentum buffers, stacked along a leading
    client dimension (in the jobs' order), each client's TrainStats, and each client's batch
    sizes in the order it took its steps (what the plain loop charges the simulated clock with:
    training/local.train's charge(model, batch) per batch)."""

    params: dict[str, torch.Tensor]
    stats: list[TrainStats]
    momentum: dict[str, torch.Tensor] = field(default_factory=dict)
    batch_sizes: list[list[int]] = field(default_factory=list)  # each client's, step by step
    example: tuple[int, ...] = ()  # one example's shape as the model saw it (after augment)
    dtype: torch.dtype = torch.float32  # and its dtype

    def client(self, g: int) -> dict[str, torch.Tensor]:
        """Client g's final trainable parameters by name."""
        return {k: v[g] for k, v in self.params.items()}

    def clients(self, n: int) -> list[dict[str, torch.Tensor]]:
        """client(g) for the first n clients, each parameter's stack split once (unbind: the
        same views as indexing it client by client)."""
        split = {k: v.unbind(0) for k, v in self.params.items()}
        return [{k: views[g] for k, views in split.items()} for g in range(n)]

    def load(self, model: nn.Module, g: int) -> None:
        """Copy client g's final parameters into `model` (one of the same architecture)."""
        named = dict(model.named_parameters())
        with torch.no_grad():
            for k, v in self.params.items():
                named[k].copy_(v[g])


Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]
"""A step's (x, y, mask, weight) of its clients, each with leading dimensions [k, B]."""


@dataclass
class _Plan:
    """Every client's batches, step by step, without padding to the longest client: step s
    computes the first ks[s] clients of the stack (longest first: those still training, two at
    least), B slots each, in the flat layout's slots [at[s], at[s] + ks[s] B); a slot holds the
    index of its example in x (the block's example tensors, _sources) where mask is set, or,
    augmented, the augmented example itself in x; its label is gathered once, in y."""

    x: torch.Tensor          # the examples the slots index (_sources), or every slot's [E, ...]
    y: torch.Tensor          # every slot's label [E] (a padding slot's: any of the block's)
    rows: torch.Tensor | None  # [E] indices into x; None when x holds the batches
    mask: torch.Tensor       # [E] bool: a real example of the client's batch
    weight: torch.Tensor     # [E] 1 / the examples of the slot's batch where real, else 0
    steps: list[int]         # each client's number of steps
    ks: list[int]            # each step's clients computed
    at: list[int]            # each step's first slot
    width: int               # B: the slots a client has at a step (the largest batch)
    client: torch.Tensor     # [P] the client of each (step, client) pair, step by step
    counts: torch.Tensor     # [P] the real examples of each pair's batch (int64)
    pooled: bool = False     # x is _BUFFERS' memory: give it back after the block

    def batch(self, s: int) -> Batch:
        """Step s's (x, y, mask, weight) of its ks[s] clients, each with leading dimensions
        [k, B]."""
        k, lo = self.ks[s], self.at[s]
        hi = lo + k * self.width
        shape = (k, self.width)
        m, w, y = (self.mask[lo:hi].view(shape), self.weight[lo:hi].view(shape),
                   self.y[lo:hi].view(shape))
        x = self.x[lo:hi] if self.rows is None else self.x.index_select(0, self.rows[lo:hi])
        return x.view(shape + x.shape[1:]), y, m, w

    def per_client(self, values: torch.Tensor) -> list[list[float]]:
        """Per-pair values ([P]) as each client's list, step by step, over its own steps."""
        order = torch.sort(self.client, stable=True).indices
        got = values[order].tolist()
        out, i = [], 0
        for g, n in enumerate(torch.bincount(self.client, minlength=len(self.steps)).tolist()):
            out.append(got[i:i + self.steps[g]])
            i += n
        return out


def _draw(job: ClientJob, augment: Augment | None, batches: list[torch.Tensor]
          ) -> list[torch.Tensor]:
    """One client's epochs of row orders, drawn from its generator in the plain loop's order
    (training/local.batches: a randperm per epoch, split into batches); with `augment`, each
    batch's rows are taken and augmented right after its epoch's permutation is split, with the
    same generator, appended to `batches`."""
    perms = []
    n = len(job.y)
    for _ in range(job.epochs):
        interrupt.poll()
        perm = torch.randperm(n, generator=job.generator)
        perms.append(perm)
        if augment is not None:
            batches.extend(augment(job.x[idx.to(job.x.device)], job.generator)
                           for idx in perm.split(job.batch_size))
    return perms


def _plan(jobs: Sequence[ClientJob], augment: Augment | None, least: int = 2,
          width: int | None = None) -> _Plan:
    """Draw every client's batches and lay them out step by step, masked: client g's slots at
    step s hold positions (s mod k_g) * B_g + b, b < B_g, of its epoch's permutation (k_g its
    batches per epoch), the ones below n_g real. The clients are in the stack's order (longest
    first), so the clients still training at a step are a prefix: a step holds only them (two
    at least), and a block's short clients take no slots for its long clients' steps. A client
    has `width` slots a step (at least its largest batch: _width; default the largest batch
    size)."""
    dev = jobs[0].x.device
    batches: list[torch.Tensor] = []
    perms = [p for j in jobs for p in _draw(j, augment, batches)]
    n = torch.tensor([len(j.y) for j in jobs])
    bs = torch.tensor([j.batch_size for j in jobs])
    epochs = torch.tensor([j.epochs for j in jobs])
    k = (n + bs - 1) // bs
    steps = k * epochs
    G, S, B = len(jobs), int(steps.max()), int(bs.max()) if width is None else width
    ks = (G - torch.cumsum(torch.bincount(steps, minlength=S + 1), 0)[:S]).clamp(
        min=min(least, G))
    g = torch.arange(int(ks.sum())) - torch.repeat_interleave(torch.cumsum(ks, 0) - ks, ks)
    s = torch.repeat_interleave(torch.arange(S), ks)[:, None]  # each (step, client) pair's
    b = torch.arange(B)[None, :]
    kg, bg, ng = k[g][:, None], bs[g][:, None], n[g][:, None]
    pos = (s % kg) * bg + b
    mask = (s < steps[g][:, None]) & (b < bg) & (pos < ng)
    # a real slot's place among its client's epochs of permutations (and augmented batches),
    # client by client as _draw appended them; then its row among the clients' rows
    first = torch.cumsum(n * epochs, 0) - n * epochs
    src = (first[g][:, None] + (s // kg) * ng + pos)[mask]
    own = torch.cat(perms)[src] + (torch.cumsum(n, 0) - n)[g][:, None].expand_as(mask)[mask]
    flat = mask.reshape(-1)
    y = torch.cat([j.y for j in jobs])
    at = (torch.cumsum(ks, 0) - ks) * B
    counts = mask.sum(1)
    if augment is None:
        index = torch.zeros(len(flat), dtype=torch.long)  # a padding slot: row 0, masked
        index[flat] = own
        xs, place, pooled = _sources(jobs)
        rows: torch.Tensor | None = place.index_select(0, index).to(dev)
        ys = y.index_select(0, index.to(y.device))
    else:
        xs = batches[0].new_zeros((len(flat),) + tuple(batches[0].shape[1:]))
        xs[flat.to(xs.device)] = torch.cat(batches)[src.to(xs.device)]
        ys, rows, pooled = y.new_zeros(len(flat)), None, False
        ys[flat.to(y.device)] = y[own.to(y.device)]
    dtype = jobs[0].x.dtype if jobs[0].x.dtype.is_floating_point else torch.float32
    weight = (mask.to(dtype) / counts.clamp(min=1).to(dtype)[:, None]).reshape(-1)
    return _Plan(xs, ys, rows, flat.to(dev), weight.to(dev), steps.tolist(), ks.tolist(),
                 at.tolist(), B, g, counts, pooled)


def _sources(jobs: Sequence[ClientJob]) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """The block's examples as one tensor and the place in it of each of the clients' rows (the
    clients' rows concatenated, as _plan numbers them): a step gathers its batches from it by
    index. Clients whose x is an index view (data/views.Rows) of one base tensor share that
    base, which is not copied when it is the block's only one (a centralized dataset's shared
    images); distinct bases (a natural dataset's clients' own arrays) are concatenated once.
    A base mostly unused by the block (more than twice the rows its clients index) gives only
    the clients' rows instead, gathered, as does an x that is a plain tensor (itself). The
    third value says whether the tensor is _BUFFERS' (to be given back)."""
    keyed: dict[tuple, list[int]] = {}  # a base -> the clients indexing it
    views: list[tuple[torch.Tensor, torch.Tensor | None]] = []
    for g, j in enumerate(jobs):
        x = j.x
        base, idx = (x.base, x.index) if isinstance(x, Rows) and x.base.device == x.device \
            else (gathered(x), None)
        views.append((base, idx))
        key = (base.data_ptr(), base.dtype, base.device, tuple(base.shape), tuple(base.stride()))
        keyed.setdefault(key, []).append(g)
    parts: list[torch.Tensor] = []
    place: list[torch.Tensor | None] = [None] * len(jobs)
    at = 0
    for users in keyed.values():
        base = views[users[0]][0]
        used = sum(len(jobs[g].y) for g in users)
        if all(views[g][1] is None for g in users) or len(base) <= 2 * used:
            parts.append(base)
            for g in users:
                idx = views[g][1]
                place[g] = (torch.arange(at, at + len(base)) if idx is None
                            else idx.to("cpu") + at)
            at += len(base)
        elif all(views[g][1] is not None for g in users):  # a few rows of a large base:
            idx = torch.cat([i for g in users if (i := views[g][1]) is not None])  # those only,
            parts.append(base.index_select(0, idx.to(base.device)))  # in one gather
            for g in users:
                place[g] = torch.arange(at, at + len(jobs[g].y))
                at += len(jobs[g].y)
        else:
            for g in users:
                idx = views[g][1]
                rows = base if idx is None else base.index_select(0, idx.to(base.device))
                parts.append(rows)
                place[g] = torch.arange(at, at + len(rows))
                at += len(rows)
    places = torch.cat([p for p in place if p is not None])
    if len(parts) == 1:
        return parts[0], places, False
    if any(p.dtype != parts[0].dtype or p.device != parts[0].device for p in parts):
        return torch.cat(parts), places, False  # as torch.cat promotes them
    xs = _BUFFERS.take((at, *parts[0].shape[1:]), parts[0].dtype, parts[0].device)
    torch.cat(parts, out=xs)
    return xs, places, True


class _Buffers:
    """The memory of the last block's concatenated examples (_sources), reused by the next
    block of the same dtype, device and example shape while it fits: a new tensor of this size
    (tens of MB) comes from fresh pages of the system, and writing them first costs about as
    much as the copy itself (~0.1 s for a million-client round's block of mclr clients).
    A block takes the buffer while it trains (another block then makes its own); release()
    drops it."""

    def __init__(self) -> None:
        self.free: torch.Tensor | None = None
        self.lent: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id(view) -> (view, buffer)

    def take(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
             ) -> torch.Tensor:
        buf, self.free = self.free, None
        if (buf is None or buf.dtype != dtype or buf.device != device
                or buf.shape[1:] != shape[1:] or len(buf) < shape[0]):
            buf = torch.empty((shape[0] + shape[0] // 4, *shape[1:]), dtype=dtype, device=device)
        view = buf[:shape[0]]
        self.lent[id(view)] = (view, buf)
        return view

    def give(self, x: torch.Tensor) -> None:
        """x (taken) is no longer used: its whole buffer is free for the next block."""
        _, base = self.lent.pop(id(x), (x, x))
        if self.free is None or base.numel() >= self.free.numel():
            self.free = base

    def release(self) -> None:
        self.free = None
        self.lent.clear()


_BUFFERS = _Buffers()


def release_buffers() -> None:
    """Drop the memory kept for the next block (the run ended)."""
    _BUFFERS.release()

def least_clients(model: nn.Module) -> int:
    """The fewest clients a step computes (padded with clients past their end) so that a
    client's bits do not depend on how many it is computed with. Measured on this CPU (oneDNN,
    1 thread): a stack of 1 runs other kernels than a stack of 2 (the digits CNN), and a grouped
    convolution whose groups have c input channels, 1 < c < 8, runs other kernels while the
    stack's c x k channels are fewer than 8 (c = 3, RGB: k = 2 differs from every k >= 3; c = 2:
    k < 4 from k >= 4; c = 1 and c >= 4: every k >= 2 agrees)."""
    least = 2
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            c = m.in_channels // m.groups
            if 1 < c < 8:
                least = max(least, -(-8 // c))
    return least


def _column(values: Sequence[float], like: torch.Tensor) -> torch.Tensor:
    """Per-client scalars as a [G] tensor of `like`'s dtype and device."""
    return torch.tensor(list(values), dtype=like.dtype, device=like.device)


def _check(model: nn.Module, jobs: Sequence[ClientJob], objective: Objective) -> None:
    if not jobs:
        raise ValueError("train_batched needs at least one client")
    why = batchable(model, objective)
    if why:
        raise ValueError(f"{type(model).__name__} cannot be trained batched: {why}")
    for g, j in enumerate(jobs):
        if len(j.y) == 0 or len(j.x) != len(j.y):
            raise ValueError(f"client {g} of the batch has {len(j.x)} inputs and {len(j.y)} "
                             "labels (at least one each, as many inputs as labels)")
        if j.epochs < 1 or j.batch_size < 1:
            raise ValueError(f"client {g} of the batch: epochs and batch_size must be >= 1")


class _SGD:
    """torch.optim.sgd's update (foreach=False, dampening 0) with per-client hyper-parameters,
    FedProx's proximal gradient and a constant correction before it; masked per client."""

    def __init__(self, jobs: Sequence[ClientJob], start: dict[str, torch.Tensor]) -> None:
        like = next(iter(start.values()))
        self.neg_lr = -_column([j.lr for j in jobs], like)
        self.mom = _column([j.momentum for j in jobs], like)
        self.wd = _column([j.weight_decay for j in jobs], like)
        self.mu = _column([j.mu for j in jobs], like)
        self.nesterov = torch.tensor([bool(j.nesterov) for j in jobs], device=like.device)
        self.use_nesterov = any(j.nesterov and j.momentum for j in jobs)
        self.use_mom = any(j.momentum for j in jobs)
        self.use_wd = any(j.weight_decay for j in jobs)
        self.anchor = {k: v.clone() for k, v in start.items()} if any(j.mu for j in jobs) else {}
        self.corr: dict[str, torch.Tensor] = {}
        if any(j.correction is not None for j in jobs):
            self.corr = {k: torch.stack([j.correction[k] if j.correction is not None
                                         else torch.zeros_like(v[0]) for j in jobs])
                         for k, v in start.items()}
        self.buf = {k: torch.zeros_like(v) for k, v in start.items()} if self.use_mom else {}
        self._steps: dict[tuple[int, int], _Step] = {}

    def at(self, params: dict[str, torch.Tensor], k: int, a: int) -> _Step:
        """The step of the first k clients of the stack of which the first a train (the others
        are past their last step: computed, least_clients, and kept as they are): their
        parameters' and buffers' views and their hyper-parameters shaped for each parameter,
        made once per (k, a) and reused (the views follow the in-place updates)."""
        got = self._steps.get((k, a))
        if got is not None:
            return got
        m0 = self.mom[:k]
        off = None
        if a < k:
            off = torch.zeros(k, dtype=torch.bool, device=m0.device)
            off[a:] = True
        mom = m0 if off is None else torch.where(off, 1.0, m0)
        terms = []
        for name, full in params.items():
            p = full[:k]
            shape = (-1,) + (1,) * (p.dim() - 1)
            terms.append(_Term(
                p, self.neg_lr[:k].view(shape),
                self.anchor[name][:k] if self.anchor else None, self.mu[:k].view(shape),
                self.corr[name][:k] if self.corr else None,
                self.wd[:k].view(shape) if self.use_wd else None,
                None if off is None else off.view(shape),
                self.buf[name][:k] if self.use_mom else None, m0.view(shape), mom.view(shape),
                self.nesterov[:k].view(shape) if self.use_nesterov else None))
        got = self._steps[(k, a)] = _Step({n: t.p for n, t in zip(params, terms)}, terms)
        return got

    @staticmethod
    @torch.no_grad()
    def step(terms: Sequence[_Term], grads: Sequence[torch.Tensor]) -> None:
        """One step of the clients of `terms` (_SGD.at), in place in their parameters, momentum
        buffers and `grads` (in the parameters' order). buf = d on a client's first step, as
        torch's sgd has it, because the buffers start at zero (0 * m + d = d). A client past its
        last step (off) has its gradient zeroed and its momentum factor 1: buf = 1 * buf + 0 and
        p = p + (-lr) * 0, both exact."""
        for t, d in zip(terms, grads):
            p = t.p
            if t.anchor is not None:
                d.addcmul_(t.mu, p - t.anchor)
            if t.corr is not None:
                d.add_(t.corr)
            if t.wd is not None:
                d.addcmul_(t.wd, p)
            if t.off is not None:
                d.masked_fill_(t.off, 0.0)
            if t.buf is not None:
                b = t.buf.mul_(t.mom).add_(d)
                d = torch.where(t.nest, d.addcmul(t.m0, b), b) if t.nest is not None else b
                if t.off is not None:
                    d = d.masked_fill(t.off, 0.0)
            p.addcmul_(t.neg_lr, d)


@dataclass
class _Term:
    """One trainable parameter's views for a step of the first k clients (_SGD.at): the
    parameters and per-client settings shaped [k, 1, ...]; None where the block has none of it
    (proximal anchor, correction, weight decay, clients past their end, momentum, Nesterov)."""

    p: torch.Tensor
    neg_lr: torch.Tensor
    anchor: torch.Tensor | None
    mu: torch.Tensor
    corr: torch.Tensor | None
    wd: torch.Tensor | None
    off: torch.Tensor | None
    buf: torch.Tensor | None
    m0: torch.Tensor
    mom: torch.Tensor
    nest: torch.Tensor | None


@dataclass
class _Step:
    """A step's parameters by name ([k, ...] views, what the stepper takes) and its terms."""

    params: dict[str, torch.Tensor]
    terms: list[_Term]
    clients: dict[int, list[_Term]] = field(default_factory=dict)

    def client(self, g: int) -> list[_Term]:
        """Client g's terms (g one of the clients still training): its slices of each term's
        views (made once, reused), no mask (its update is not masked) and its own momentum."""
        got = self.clients.get(g)
        if got is None:
            got = self.clients[g] = [_Term(
                t.p[g], t.neg_lr[g], None if t.anchor is None else t.anchor[g], t.mu[g],
                None if t.corr is None else t.corr[g], None if t.wd is None else t.wd[g], None,
                None if t.buf is None else t.buf[g], t.m0[g], t.m0[g],
                None if t.nest is None else t.nest[g]) for t in self.terms]
        return got


def _cross_entropy(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per-example cross-entropy of logits [B, K] (F.cross_entropy(reduction='none')'s values):
    log-sum-exp shifted by the row's max, in elementwise kernels (torch's fused log_softmax runs
    its few classes per row one row at a time, several times slower on G clients' batches)."""
    z = out - out.detach().amax(-1, keepdim=True)
    return z.exp().sum(-1).log() - z.gather(-1, y[:, None]).squeeze(-1)


def train_batched(model: nn.Module, jobs: Sequence[ClientJob], *, augment: Augment | None = None,
                  objective: Objective | None = None, on_step: StepHook | None = None
                  ) -> BatchedResult:
    """Train len(jobs) clients' copies of `model` together; `model` itself is not changed (it is
    put in train mode, as the plain loop does). Each job's parameters start from job.start or the
    model's. on_step(s, params) sees the stacked parameters after step s (tests).

    A step is vmap(grad(loss)) over the clients: each client's gradient of its own mean loss
    over the real examples of its batch. Under vmap the clients are trained in stacks by their
    width (_by_width: each stack padded to its own clients' width, not the largest batch
    size), one stack after another; the result is in the jobs' order."""
    objective = objective or Classification()
    _check(model, jobs, objective)
    model.train()
    groups = _by_width(model, jobs, augment, objective)
    least = least_clients(model)
    if len(groups) == 1 and (groups[0][0] is None or len(jobs) >= least):
        return _train_stack(model, jobs, groups[0][0], augment, objective, on_step)
    traces: list[list[dict[str, torch.Tensor]]] = []
    parts = []
    for width, idx in groups:
        trace: list[dict[str, torch.Tensor]] = []
        traces.append(trace)
        parts.append((idx, _train_stack(
            model, _at_least([jobs[g] for g in idx], least), width, augment, objective,
            None if on_step is None else _collect(trace))))
    if on_step is not None:
        for s in range(max(len(t) for t in traces)):
            on_step(s, _merged([(idx, t[min(s, len(t) - 1)]) for (idx, _), t in zip(parts, traces)],
                               len(jobs)))
    return _merged_results(parts, len(jobs))


def _stacked(starts: list[torch.Tensor]) -> torch.Tensor:
    """torch.stack(starts), a copy; one tensor repeated (a round's clients all start from the
    model the server sent) is copied by one expand instead of a stack of as many."""
    first = starts[0]
    if all(t is first for t in starts):
        return first.unsqueeze(0).expand((len(starts),) + tuple(first.shape)).clone(
            memory_format=torch.contiguous_format)
    return torch.stack(starts)


def _collect(trace: list[dict[str, torch.Tensor]]) -> StepHook:
    """An on_step hook that keeps each step's parameters (a stack's, merged after: tests)."""
    return lambda _s, p: trace.append(dict(p))


def _width(job: ClientJob) -> int:
    """The slots a client takes a step in a stack of its width: its largest batch
    (min(batch_size, examples)) rounded up to a power of two, _LEAST_WIDTH at least, at most
    its batch size. A function of the client alone, so its stack (and its bits) does not depend
    on its block."""
    return min(job.batch_size, max(_LEAST_WIDTH, 1 << (len(job.y) - 1).bit_length()))


_LEAST_WIDTH = 2
"""A client of one example shares the stack of those of two: a stack of width 1 costs its own
steps' overhead, and its linear layers' gradients are bmm's of inner size 1, slower than of 2
(digits CNN, 46 clients of one example and 54 of two: 0.8x the time of two stacks)."""


def _by_width(model: nn.Module, jobs: Sequence[ClientJob], augment: Augment | None,
              objective: Objective) -> list[tuple[int | None, list[int]]]:
    """The stacks the jobs train in: (width, the jobs' indices), widest first, when their steps
    run under vmap, which computes every slot of a stack (a block of the digits CNN's clients
    of one or two examples, batch size 8: 8 slots a client a step for 1.5 real examples; one
    stack of width 2 takes about half the time of one of width 8). Else one stack as wide as
    the largest batch size (None): a linear model's closed-form step (its padding costs a few
    rows of a bmm, and a stack more costs its plan), a step client by client (_ClientSteps
    computes only the real rows) and augmented batches (their shape is known after the
    draw)."""
    x = jobs[0].x
    if (augment is not None or own_loss(objective) or _linear_model(model)
            or per_client(model, tuple(x.shape[1:]), x.device)):
        return [(None, list(range(len(jobs))))]
    by: dict[int, list[int]] = {}
    for g, j in enumerate(jobs):
        by.setdefault(_width(j), []).append(g)
    return sorted(by.items(), reverse=True)


def _at_least(jobs: list[ClientJob], least: int) -> list[ClientJob]:
    """`jobs`, and copies of the first (its generator's state cloned before any draw) until
    there are `least` (least_clients: a stack too small for the kernels of larger ones), whose
    results are dropped."""
    while len(jobs) < least:
        j = jobs[0]
        g = torch.Generator(device=j.generator.device)
        g.set_state(j.generator.get_state())
        jobs = jobs + [replace(j, generator=g)]
    return jobs


def _merged(parts: Sequence[tuple[list[int], Mapping[str, torch.Tensor]]], total: int
            ) -> dict[str, torch.Tensor]:
    """Stacks' tensors ([their clients (and copies), ...] by name) as one [total, ...] each,
    each stack's first len(idx) rows at its jobs' indices (which cover 0..total-1: nothing
    is left unwritten)."""
    first = parts[0][1]
    out = {n: v.new_empty((total,) + tuple(v.shape[1:])) for n, v in first.items()}
    for idx, got in parts:
        at = torch.tensor(idx, device=next(iter(first.values())).device)
        for n, v in got.items():
            out[n].index_copy_(0, at, v[:len(idx)])
    return out


def _merged_results(parts: Sequence[tuple[list[int], BatchedResult]], total: int
                    ) -> BatchedResult:
    """The stacks' results as one, in the jobs' order (momentum buffers: zeros for a stack
    without them, as its clients' momentum is 0)."""
    first = parts[0][1]
    params = _merged([(idx, r.params) for idx, r in parts], total)
    buf: dict[str, torch.Tensor] = {}
    if any(r.momentum for _, r in parts):
        buf = _merged([(idx, r.momentum or {n: torch.zeros_like(v) for n, v in r.params.items()})
                       for idx, r in parts], total)
    stats: list[TrainStats] = [TrainStats(0.0, 0, 0)] * total
    sizes: list[list[int]] = [[] for _ in range(total)]
    for idx, r in parts:
        for i, g in enumerate(idx):
            stats[g], sizes[g] = r.stats[i], r.batch_sizes[i]
    return BatchedResult(params, stats, buf, sizes, first.example, first.dtype)


def _train_stack(model: nn.Module, jobs: Sequence[ClientJob], width: int | None,
                 augment: Augment | None, objective: Objective, on_step: StepHook | None
                 ) -> BatchedResult:
    """train_batched's jobs of one stack, `width` slots a client a step (None: the largest
    batch size)."""
    order = _longest_first(jobs)
    jobs = [jobs[g] for g in order]
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    fixed = {n: p.detach() for n, p in model.named_parameters() if not p.requires_grad}
    own = dict(model.named_parameters())
    params = {n: _stacked([(j.start[n] if j.start is not None else own[n]).detach()
                           for j in jobs]) for n in names}  # stack copies: the block's own
    plan = _plan(jobs, augment, least_clients(model), width)
    opt = _SGD(jobs, params)
    back = torch.argsort(torch.tensor(order)).to(plan.mask.device)  # sorted -> the jobs' order

    step_grads = _stepper(model, fixed, params, plan, objective)
    down = [-n for n in plan.steps]  # ascending: bisect counts the clients still training
    losses = []
    try:
        with torch.no_grad():  # the updates' (torch.func.grad computes its gradients regardless)
            for s, k in enumerate(plan.ks):
                interrupt.poll()
                now = opt.at(params, k, k if s < plan.steps[k - 1] else bisect_left(down, -s))
                if isinstance(step_grads, _ClientSteps):  # each client's step on its own
                    loss = step_grads(now, *plan.batch(s))
                else:
                    grads, loss = step_grads(now.params, *plan.batch(s))
                    opt.step(now.terms, [grads[n] for n in names])
                losses.append(loss)
                if on_step is not None:
                    on_step(s, {n: p[back] for n, p in params.items()})
    finally:
        if plan.pooled:
            _BUFFERS.give(plan.x)
    # each client's batches' real examples, and their mean losses weighted by their sizes (in
    # float64), step by step
    sizes = [[int(c) for c in row] for row in plan.per_client(plan.counts)]
    terms = plan.per_client(torch.cat(losses).double().cpu() * plan.counts)
    stats = [TrainStats(sum(t) / max(sum(c), 1), sum(c), k)
             for t, c, k in zip(terms, sizes, plan.steps)]
    at = back.tolist()
    if at == list(range(len(at))):  # already in the jobs' order: the block's own tensors
        out, buf = params, opt.buf
    else:
        out, buf = {n: p[back] for n, p in params.items()}, {n: b[back] for n, b in opt.buf.items()}
    return BatchedResult(out, [stats[g] for g in at], buf, [sizes[g] for g in at],
                         tuple(plan.x.shape[1:]), plan.x.dtype)


Stepper = Callable[[dict[str, torch.Tensor], torch.Tensor, torch.Tensor, torch.Tensor,
                    torch.Tensor], tuple[dict[str, torch.Tensor], torch.Tensor]]
"""One step's gradients of the first k clients' mean losses (by parameter name, [k, ...]) and
the losses ([k]), from their parameters and their batch's (x, y, mask, weight)."""


def _stepper(model: nn.Module, fixed: dict[str, torch.Tensor], params: dict[str, torch.Tensor],
             plan: _Plan, objective: Objective) -> Stepper | _ClientSteps:
    """vmap(grad(loss)) over the clients; for a linear model on the flattened input (mclr),
    whose forward the probe confirms, its gradient in closed form (_linear_step: a step's
    kernels without vmap's per-call cost, ~10x less a step at mclr's size); for a model whose
    convolutions are heavy on a CPU (per_client says when) or an objective with its own loss
    (own_loss), each client's gradient on its own (_ClientSteps, on objective.loss)."""
    own = own_loss(objective)
    head = None if own else _linear_head(model, fixed, params, plan)
    if head is not None:
        return _linear_step(*head)
    why = own or per_client(model, tuple(plan.x.shape[1:]), plan.x.device)
    if why:
        if why not in _SAID:
            _SAID.add(why)
            log.warning("--batch-clients: %s", why)
        return _ClientSteps(model, fixed, objective)
    model = _with_fast_pools(model)

    def loss_of(p: dict[str, torch.Tensor], xb: torch.Tensor, yb: torch.Tensor,
                m: torch.Tensor, _w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        per = _cross_entropy(functional_call(model, (p, fixed), (xb,)), yb)
        loss = torch.where(m, per, 0.0).sum() / m.sum().clamp(min=1)  # the client's batch mean
        return loss, loss.detach()

    return vmap(grad(loss_of, has_aux=True))


def own_loss(objective: Objective) -> str:
    """Why a classification objective's clients are stepped one at a time (_ClientSteps, on
    objective.loss) rather than under vmap or _linear_step, which compute Classification's own
    cross-entropy (_cross_entropy: per example, masked over the padding): a subclass that
    defines its own loss (a plugin's label smoothing, a focal loss) would otherwise train on
    plain cross-entropy batched and on its loss alone. '' when the loss is Classification's."""
    if type(objective).loss is Classification.loss:
        return ""
    return (f"objective {objective.name or type(objective).__name__!r} has its own loss "
            f"({type(objective).__name__}.loss): each client's step is computed on it one "
            "client at a time, not under vmap (whose masked per-example loss is "
            "cross-entropy)")


CONV_FLOPS_PER_CLIENT = 2e6
"""On a CPU, a model whose convolutions take at least this many FLOPs in one example's forward
trains its clients one by one in the batched engine (per_client): fedseq_cnn on 3x32x32 takes
28 MFLOP and trained 1.2x slower under vmap than alone; the digits CNN on 8x8, 0.17 MFLOP, 3-4x
faster (benchmarks/bench_batched.py)."""

_SAID: set[str] = set()  # per_client's notes already logged by this process
_CONV_FLOPS: weakref.WeakKeyDictionary[nn.Module, dict[tuple, int]] = weakref.WeakKeyDictionary()
"""A model -> its conv_flops by (architecture, example shape), counted once (per_client)."""


def conv_flops(model: nn.Module, example: tuple[int, ...]) -> int:
    """The FLOPs of `model`'s convolutions (nn.Conv1d/2d/3d: 2 x output elements x input
    channels per group x kernel size) in the forward of one example of shape `example`, from
    the output shapes of a forward of zeros on the meta device (nothing is computed: on
    training/flops.template's copy, made once per architecture); 0 for a model without
    convolutions or whose forward the meta device cannot run."""
    convs = [m for m in model.modules() if isinstance(m, nn.modules.conv._ConvNd)]
    if not convs:
        return 0
    total = 0

    def count(m: nn.Module, _inp: Any, out: torch.Tensor) -> None:
        nonlocal total
        assert isinstance(m, nn.modules.conv._ConvNd)
        per = m.in_channels // m.groups
        for k in m.kernel_size:
            per *= k
        total += 2 * out.numel() * per

    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    twin = template(model)  # training/flops' cached meta copy: no deep copy a block
    hooks = [m.register_forward_hook(count) for m in twin.modules()
             if isinstance(m, nn.modules.conv._ConvNd)]
    try:
        with torch.no_grad():
            twin(torch.zeros((1, *example), dtype=dtype, device="meta"))
    except Exception:  # noqa: BLE001 - a forward the meta device cannot run: no rule applies
        return 0
    finally:
        for h in hooks:
            h.remove()
    return total


def per_client(model: nn.Module, example: tuple[int, ...], device: torch.device) -> str:
    """Why the batched engine trains these clients one by one (_ClientSteps) rather than under
    vmap; '' when it batches them. The rule: on a CPU, a model whose convolutions take
    CONV_FLOPS_PER_CLIENT or more in one example's forward (conv_flops). Its convolutions are
    then compute-bound per client already, and vmap's grouped convolutions and the copies that
    fold the clients into channels cost more than the per-step overhead they share; its
    clients' steps (gradient and SGD update) run one client at a time in the channels-last
    layout (where torch's max-pooling of 28x28 planes is ~15x faster than on contiguous ones).
    It reads only the architecture, the example's shape and the device, so every runtime and
    every block decides alike. conv_flops is counted once per model and example shape
    (_CONV_FLOPS: a runtime's blocks share one working model; the meta forward took ~11 ms a
    block of the digits CNN under cProfile, digits 1,000 clients, 100 a round)."""
    if device.type != "cpu":
        return ""
    key = (architecture(model), tuple(example))
    known = _CONV_FLOPS.setdefault(model, {})
    flops = known.get(key)
    if flops is None:  # (kept on disk with the model's FLOP counts: no meta forward, which
        # would import torch._dynamo, in a process whose counts were all read from there)
        flops = known[key] = kept(model, f"conv_flops{tuple(example)}",
                                  lambda: conv_flops(model, example), __file__)
    if flops < CONV_FLOPS_PER_CLIENT:
        return ""
    return (f"{type(model).__name__}'s convolutions on {'x'.join(map(str, example))} inputs "
            f"({flops / 1e6:.3g} MFLOP an example, >= {CONV_FLOPS_PER_CLIENT / 1e6:g}) are "
            "compute-bound on a CPU: each client's step (gradient and SGD update) is computed "
            "on its own, in the channels-last layout, not under vmap")


class _ClientSteps:
    """A step of each client on its own (per_client's rule): its gradient of objective.loss (the
    plain loop's loss, a mean) on its batch's real examples only (a prefix of its slots: the
    padding is not computed), by functional_call and autograd, its inputs in the
    channels-last layout (conv2d's and max-pooling's fast CPU kernels), then its
    update by _SGD.step on its own slices (_Step.client) while its gradient is in the cache. A
    client without real examples at the step (past its last one) computes nothing and keeps its
    parameters and momentum, as _SGD's masked update would."""

    def __init__(self, model: nn.Module, fixed: dict[str, torch.Tensor],
                 objective: Objective) -> None:
        self.model, self.fixed, self.objective = model, fixed, objective

    def __call__(self, now: _Step, xb: torch.Tensor, yb: torch.Tensor, m: torch.Tensor,
                 _w: torch.Tensor) -> torch.Tensor:
        """Step the first k clients ([k, B, ...] batches) in place; their losses [k]."""
        losses = torch.zeros(xb.shape[0], dtype=xb.dtype if xb.is_floating_point()
                             else torch.float32, device=xb.device)
        x = xb.flatten(0, 1)
        if x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        width = xb.shape[1]
        for g, c in enumerate(m.sum(1).tolist()):
            if not c:
                continue
            own = {n: v[g].detach().requires_grad_() for n, v in now.params.items()}
            with torch.enable_grad():
                out = functional_call(self.model, (own, self.fixed),
                                      (x[g * width:g * width + c],))
                loss = self.objective.loss(out, yb[g, :c])
                got = torch.autograd.grad(loss, list(own.values()))
            _SGD.step(now.client(g), got)
            losses[g] = loss.detach()
        return losses


def _with_fast_pools(model: nn.Module) -> nn.Module:
    """`model`, or a copy of it (its parameters are functional_call's anyway) whose
    non-overlapping max-poolings (nn.MaxPool2d, kernel = stride, no padding, dilation or
    ceil_mode) compute their forward in the channels-last layout (_FastPool): under vmap the
    clients' feature maps are one [k B, C, H, W] batch of small planes, which the contiguous
    kernel pools ~10x slower (digits CNN: 8x8 and 4x4 planes, 9 ms against 0.7 ms a call). The
    same values and indices (a window's first largest, NaN first, in both kernels), so the same
    bits; the backward is the plain one. The copy is made once per model (_TWINS) and made
    again only if the model's architecture (training/flops.architecture) changed."""
    arch = architecture(model)
    got = _TWINS.get(model)
    if got is not None and got[0] == arch:
        return model if got[1] is None else got[1]
    pools = [n for n, m in model.named_modules() if type(m) is nn.MaxPool2d and plain_pool(m)]
    if not pools:
        _TWINS[model] = (arch, None)  # (None: the model itself; a value holding its own weak
        return model  # key would keep the model alive for good)
    twin = copy.deepcopy(model)
    for name in pools:
        parent, _, leaf = name.rpartition(".")
        m = twin.get_submodule(name)
        assert isinstance(m, nn.MaxPool2d)
        setattr(twin.get_submodule(parent) if parent else twin, leaf, _FastPool(m.kernel_size))
    _TWINS[model] = (arch, twin)
    return twin


_TWINS: weakref.WeakKeyDictionary[nn.Module, tuple[tuple, nn.Module | None]] = \
    weakref.WeakKeyDictionary()
"""A model -> (its architecture, _with_fast_pools' copy of it), made once: a runtime trains its
blocks on one working model (core/executor): no deep copy a block."""


def plain_pool(m: nn.MaxPool2d) -> bool:
    """Whether the pooling is k x k windows at stride k, nothing else (what _FastPool computes)."""
    def pair(v: object) -> tuple:
        return tuple(v) if isinstance(v, (tuple, list)) else (v, v)
    k = pair(m.kernel_size)
    return (k[0] == k[1] and pair(m.stride) == k and pair(m.padding) == (0, 0)
            and pair(m.dilation) == (1, 1) and not m.ceil_mode and not m.return_indices)


class _FastPool(nn.Module):
    """nn.MaxPool2d(k) (stride k) on a batch of images, computed on a channels-last copy and
    given back contiguous; as nn.MaxPool2d otherwise. Under vmap the copy is of the stacked
    clients' maps, which vmap's batching rule folds into one channels-last batch (a view),
    pooled by the channels-last kernel: the same values and indices as the contiguous one (a
    window's first largest, NaN first), and the backward scatters the gradient to the same
    places, so the same bits. Plain differentiable ops: an autograd.Function here cost
    functorch's generic custom-function path under vmap(grad) (pytree flattening, wrapped
    outputs) about as much as the pooling itself (digits CNN, 100 clients: a block's training
    131 -> 83 ms, min of 12, the same bits)."""

    def __init__(self, kernel: int | tuple[int, ...]) -> None:
        super().__init__()
        self.k = int(kernel[0] if isinstance(kernel, (tuple, list)) else kernel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4:
            return torch.nn.functional.max_pool2d(x, self.k)
        cl = x.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)  # channels-last strides
        return torch.nn.functional.max_pool2d(cl, self.k).contiguous()


def differentiates(model: nn.Module) -> bool:
    """Whether train_batched differentiates `model` with torch.func (whose first gradient
    imports torch._dynamo, ~0.75 s: fednet launch's zygote imports it before forking), i.e.
    every model but the one nn.Linear trained in closed form (_linear_model)."""
    return not _linear_model(model)


def _linear_model(model: nn.Module) -> bool:
    """Whether the model is one nn.Linear with a bias and no buffers (what _linear_head probes
    further)."""
    mods = list(model.named_modules())
    return (len(mods) == 2 and isinstance(mods[1][1], nn.Linear) and mods[1][1].bias is not None
            and not list(model.buffers()))


def _linear_head(model: nn.Module, fixed: dict[str, torch.Tensor],
                 params: dict[str, torch.Tensor], plan: _Plan) -> tuple[str, str] | None:
    """(weight, bias) names when the model is one nn.Linear with a bias and nothing else (no
    other module, parameter or buffer) and its forward on client 0's first batch equals
    linear(flatten(x)) bit for bit; None otherwise."""
    mods = list(model.named_modules())
    if len(mods) != 2 or not isinstance(mods[1][1], nn.Linear) or fixed:
        return None
    name, fc = mods[1]
    w, b = f"{name}.weight", f"{name}.bias"
    if fc.bias is None or set(params) != {w, b} or list(model.buffers()):
        return None
    xb = plan.batch(0)[0][0]
    one = {w: params[w][0], b: params[b][0]}
    with torch.no_grad():
        got = functional_call(model, one, (xb,))
        want = torch.nn.functional.linear(xb.flatten(1), one[w], one[b])
    return (w, b) if got.shape == want.shape and torch.equal(got, want) else None


def _linear_step(w: str, b: str) -> Stepper:
    """The step of a linear model's clients in closed form: logits z = x W^T + b by baddbmm, the
    per-example cross-entropy as _cross_entropy computes it, and its gradient with respect to
    the logits of each client's mean loss over the real examples, (softmax(z) - onehot(y)) / n
    on real rows and 0 on padding, then dW = dz^T x (bmm) and db = the sum of dz over the
    batch: autograd's arithmetic for the same loss, summed in another order."""

    def step(p: dict[str, torch.Tensor], xb: torch.Tensor, yb: torch.Tensor, m: torch.Tensor,
             weight: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        with torch.no_grad():
            x = xb.flatten(2)  # [k, B, D]
            z = torch.baddbmm(p[b][:, None, :], x, p[w].transpose(1, 2))  # [k, B, K]
            z.sub_(z.amax(-1, keepdim=True))
            e = z.exp()
            total = e.sum(-1, keepdim=True)
            y = yb[..., None]
            per = total.log().sub_(z.gather(-1, y)).squeeze(-1)  # [k, B]
            w3 = weight[..., None]  # [k, B, 1]: 1/n real, 0 padding
            dz = e.div_(total).mul_(w3)
            dz.scatter_add_(-1, y, w3.neg())
            return {w: torch.bmm(dz.transpose(1, 2), x), b: dz.sum(1)}, (per * weight).sum(1)

    return step


def _longest_first(jobs: Sequence[ClientJob]) -> list[int]:
    """The jobs' order by their steps, most first (ties in the given order): the clients still
    training at any step are then a prefix of the stack, and a step computes only them (a
    block's clients of unequal sizes do not all pay its longest client's steps). A client's bits
    do not depend on its place or on how many are computed with it (least_clients at least: see
    algorithms/updates.train_ahead)."""
    steps = [-(-len(j.y) // j.batch_size) * j.epochs for j in jobs]
    return sorted(range(len(jobs)), key=lambda g: -steps[g])
