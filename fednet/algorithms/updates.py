"""Local update rules that client halves compose: plain local training (SGD or the run's
--optimizer), FedProx, FedDyn (client side only); and a block of clients' Plain or Prox rules
trained as one batch (training/batched.py; block_refusal says when not): local_sgd_block into
the clients' models, or train_ahead, which the runtimes call before the tasks are delivered
(--batch-clients, core/batching.py) and whose results Plain.run and Prox.run take in place of
training (take_ahead), everything else about the task unchanged."""
from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from fednet import rng
from fednet.algorithms.common import task_lr
from fednet.algorithms.contract import ClientContext
from fednet.models.arrays import checked_state, load_arrays
from fednet.training import flops, hooks
from fednet.training.local import GradHook, train
from fednet.training.optim import spec_of
from fednet.types import Task


def trainable(ctx: ClientContext) -> list[torch.Tensor]:
    """The model's trainable parameters, in order."""
    return [p for p in ctx.model.parameters() if p.requires_grad]


def local_sgd(ctx: ClientContext, task: Task, extra_hooks: Sequence[GradHook] = (),
              load: bool = True, lr: float | None = None,
              loss_terms: Sequence[Any] = (), keep_optimizer: bool = False) -> dict[str, Any]:
    """Load the task's model (unless load=False) and run the configured local optimizer
    (--optimizer; SGD by default). keep_optimizer: its memory persists in ctx.state, which
    must then derive from training.optim.OptimizerState (and so is checkpointed)."""
    if load:
        load_arrays(ctx.model, task.arrays)
    if ctx.cfg.dp.sgd_noise > 0:  # DP-SGD (training/dpsgd.py)
        return private_sgd(ctx, task, extra_hooks, lr)
    t = ctx.cfg.train
    stats = train(ctx.model, ctx.x, ctx.y, epochs=int(task.body.get("epochs", t.epochs)),
                  batch_size=t.batch_size, lr=float(lr if lr is not None else task_lr(ctx, task)),
                  optim=spec_of(t), generator=ctx.batch_generator(task.round), hooks=extra_hooks,
                  augment=ctx.augment, loss_terms=loss_terms, objective=ctx.objective,
                  opt_state=ctx.state if keep_optimizer else None)
    return {"loss": stats.loss, "samples": stats.samples, "steps": stats.steps}


def private_sgd(ctx: ClientContext, task: Task, extra_hooks: Sequence[GradHook] = (),
                lr: float | None = None) -> dict[str, Any]:
    """DP-SGD through Opacus (--dp-sgd-noise; docs/algorithms.md §11.4) from the loaded model;
    the training loss is withheld from the result (no noise covers it)."""
    from fednet.training.dpsgd import train_private

    t, dp = ctx.cfg.train, ctx.cfg.dp
    noise = torch.Generator(device=ctx.device).manual_seed(
        rng.int_seed(ctx.cfg.seed, "dp-sgd-noise", task.round, ctx.cid))
    stats = train_private(ctx.model, ctx.x, ctx.y, epochs=int(task.body.get("epochs", t.epochs)),
                          batch_size=t.batch_size,
                          spec=spec_of(t, float(lr if lr is not None else task.body.get("lr", t.lr))),
                          generator=ctx.batch_generator(task.round), noise_generator=noise,
                          noise=dp.sgd_noise, clip=dp.sgd_clip, hooks=extra_hooks,
                          augment=ctx.augment, objective=ctx.objective)
    return {"samples": stats.samples, "steps": stats.steps}


@dataclass
class DynState:
    """FedDyn's client term g_k: one tensor per trainable parameter (None before the first task)."""

    feddyn_g: list[torch.Tensor] | None = None


class Plain:
    """FedAvg's client: SGD from the received model."""

    name = "sgd"

    def run(self, ctx: ClientContext, task: Task) -> dict[str, Any]:
        """Train in place (or take what train_ahead trained); returns the training statistics."""
        if not _AHEAD:
            return local_sgd(ctx, task)
        got = load_ahead(ctx, task, 0.0)
        return got if got is not None else local_sgd(ctx, task, load=False)


class Prox:
    """FedProx's client: SGD on F_k + (mu/2)||theta - anchor||^2, anchor = the received model."""

    name = "fedprox"

    def __init__(self, mu: float) -> None:
        self.mu = float(mu)

    def run(self, ctx: ClientContext, task: Task) -> dict[str, Any]:
        """Train in place with the proximal term (mu = 0 is exactly plain SGD)."""
        if _AHEAD:
            got = load_ahead(ctx, task, self.mu)
        else:
            load_arrays(ctx.model, task.arrays)
            got = None
        if got is not None:
            return got
        if self.mu == 0:
            return local_sgd(ctx, task, load=False)
        anchor = [p.detach().clone() for p in trainable(ctx)]
        return local_sgd(ctx, task, [hooks.prox(anchor, self.mu)], load=False)


class Dyn:
    """FedDyn's client: SGD on L_k - <g_k, theta> + (alpha/2)||theta - anchor||^2, then
    g_k <- g_k - alpha (theta_k - anchor). g_k lives in the client's DynState (ctx.state).

    official=True reproduces the FedSeq repository instead (docs/algorithms.md §7.9):
    the linear term carries no gradient and g_k is updated after every minibatch.
    """

    name = "feddyn"

    def __init__(self, alpha: float, clip: float = 0.0, official: bool = False) -> None:
        self.alpha, self.clip, self.official = float(alpha), float(clip), bool(official)

    def run(self, ctx: ClientContext, task: Task) -> dict[str, Any]:
        """Train in place and update this client's g_k."""
        load_arrays(ctx.model, task.arrays)
        params = trainable(ctx)
        anchor = [p.detach().clone() for p in params]
        if ctx.state.feddyn_g is None:
            ctx.state.feddyn_g = [torch.zeros_like(p) for p in params]
        g = ctx.state.feddyn_g
        extra: list[GradHook] = []
        if self.official:
            zeros = [torch.zeros_like(p) for p in params]
            extra.append(hooks.dyn(anchor, zeros, self.alpha))
        else:
            extra.append(hooks.dyn(anchor, g, self.alpha))
        if self.clip > 0:
            extra.append(hooks.clip_norm(self.clip))
        if self.official:  # g_k follows the drift after every minibatch (post-step, via a hook)
            extra.append(_official_g_update(params, anchor, g, self.alpha))
        stats = local_sgd(ctx, task, extra, load=False)
        if not self.official:
            with torch.no_grad():
                for gk, p, a in zip(g, params, anchor):
                    gk.sub_(p - a, alpha=self.alpha)
        return stats


def _official_g_update(params: list[torch.Tensor], anchor: list[torch.Tensor],
                       g: list[torch.Tensor], alpha: float) -> GradHook:
    """Runs before each step: g_k <- g_k - alpha (theta - anchor) with the current drift."""
    def hook(_: Sequence[torch.Tensor]) -> None:
        with torch.no_grad():
            for gk, p, a in zip(g, params, anchor):
                gk.sub_(p - a, alpha=alpha)
    return hook


def rule(name: str, p: Any) -> Plain | Prox | Dyn:
    """A local rule by name ('sgd', 'fedprox', 'feddyn') with its typed parameters
    (mu; alpha, clip, official)."""
    if name in ("sgd", "fedavg"):
        return Plain()
    if name == "fedprox":
        return Prox(p.mu)
    if name == "feddyn":
        return Dyn(p.alpha, p.clip, p.official)
    raise ValueError(f"unknown local rule '{name}'")


# ---- a block of clients trained together (issue 56; training/batched.py) -------------------
def block_refusal(ctxs: Sequence[ClientContext], rules: Sequence[Any]) -> str:
    """Why these clients' local rules cannot run as one batch (training/batched.py); '' when
    they can. It reads only the run's settings, the rules, the dataset's augmentation and
    objective and the model's architecture, never which process holds the clients, so every
    runtime decides alike for the same block."""
    from fednet.training.batched import batchable

    if not ctxs or len(ctxs) != len(rules):
        return "a block needs one rule per client"
    if any(type(r) not in (Plain, Prox) for r in rules):
        return "only FedAvg's and FedProx's local rules (Plain, Prox) are batched"
    cfg, first = ctxs[0].cfg, ctxs[0]
    if cfg.dp.sgd_noise > 0:
        return "DP-SGD (--dp-sgd-noise) trains through Opacus, one client at a time"
    if cfg.train.optimizer != "sgd":
        return f"--optimizer {cfg.train.optimizer}: only SGD is batched"
    shapes = [(n, tuple(p.shape), p.requires_grad) for n, p in first.model.named_parameters()]
    if not all(trains for _, _, trains in shapes):
        return "frozen parameters (the block would share client 0's)"
    for c in ctxs[1:]:  # (a client sharing first's model object has its parameters: read once)
        if (type(c.model) is not type(first.model) or c.augment is not first.augment
                or c.objective is not first.objective or c.device != first.device
                or (c.model is not first.model and [(n, tuple(p.shape), p.requires_grad)
                                                    for n, p in c.model.named_parameters()]
                    != shapes)):
            return (f"client {c.cid}'s model, augmentation, objective or device differs from "
                    f"client {first.cid}'s")
    return batchable(first.model, first.objective)


def local_sgd_block(ctxs: Sequence[ClientContext], tasks: Sequence[Task],
                    rules: Sequence[Any]) -> tuple[list[dict[str, Any]], list[list[int]]]:
    """rules[i].run(ctxs[i], tasks[i]) for a block of clients, trained as one batch
    (training/batched.train_batched): each ctx.model ends holding its client's trained model, as
    the rule leaves it, within training/batched.py's stated tolerance of the plain loop. Returns
    each client's body (loss, samples, steps: local_sgd's keys, nothing more, so a result's bytes
    do not change) and its batch sizes step by step (the runtime charges each task's simulated
    compute with them, as train charges each batch). Raises ValueError with block_refusal's
    reason when the block cannot be batched (run each rule alone then)."""
    from fednet.training.batched import ClientJob, train_batched

    why = block_refusal(ctxs, rules)
    if why:
        raise ValueError(why)
    jobs = []
    for ctx, task, r in zip(ctxs, tasks, rules):
        load_arrays(ctx.model, task.arrays)
        t = ctx.cfg.train
        jobs.append(ClientJob(
            ctx.x, ctx.y, ctx.batch_generator(task.round), lr=task_lr(ctx, task),
            momentum=float(t.momentum), weight_decay=float(t.weight_decay),
            nesterov=bool(t.nesterov), epochs=int(task.body.get("epochs", t.epochs)),
            batch_size=int(t.batch_size), mu=float(getattr(r, "mu", 0.0)),
            start={n: p for n, p in ctx.model.named_parameters() if p.requires_grad}))
    res = train_batched(ctxs[0].model, jobs, augment=ctxs[0].augment,
                        objective=ctxs[0].objective)
    for g, ctx in enumerate(ctxs):
        res.load(ctx.model, g)
        ctx.model.train()
    bodies = [{"loss": s.loss, "samples": s.samples, "steps": s.steps} for s in res.stats]
    return bodies, res.batch_sizes


# ---- a block trained ahead of its tasks' delivery (--batch-clients; core/batching.py) --------
@dataclass
class Ahead:
    """One task's local training, done in a block before the task runs: the trainable
    parameters it started from and ended with (by name), its body, the FedProx mu it used, and
    its batches (sizes, one example's shape and dtype) that its task's meter is charged with."""

    start: dict[str, torch.Tensor]
    end: dict[str, torch.Tensor]
    body: dict[str, Any]
    mu: float
    sizes: list[int]
    example: tuple[int, ...]
    dtype: torch.dtype


_AHEAD: dict[tuple[int, int], Ahead] = {}  # (client id, task id) -> its training, done ahead


def _start(ctx: ClientContext, task: Task, made: dict[tuple[int, str], tuple[Any, torch.Tensor]],
           names: list[str] | None = None) -> dict[str, torch.Tensor]:
    """The trainable parameters a task starts from (its received arrays), on the client's
    device, without touching ctx.model (several clients may share one working model). `made`:
    the tensors already made in this block from the same array objects (a round's tasks carry
    the server's one model), shared instead of copied again; each entry keeps its array, so that
    its id is never reused while the block is built (train_batched stacks the starts and never
    writes them, so sharing changes no bit). `names`: ctx.model's trainable parameters' names
    when the caller has them (trainable_names)."""
    if names is None:
        names = trainable_names(ctx.model)
    out = {}
    for n in names:
        a = task.arrays[n]
        key = (id(a), str(ctx.device))
        got = made.get(key)
        if got is None or got[0] is not a:
            got = made[key] = (a, torch.tensor(np.asarray(a), device=ctx.device))
        out[n] = got[1]
    return out


def trainable_names(model: torch.nn.Module) -> list[str]:
    """The names of a model's trainable parameters, in named_parameters' order."""
    return [n for n, p in model.named_parameters() if p.requires_grad]


def _job(ctx: ClientContext, task: Task, mu: float, start: dict[str, torch.Tensor]) -> Any:
    from fednet.training.batched import ClientJob

    t = ctx.cfg.train
    return ClientJob(ctx.x, ctx.y, ctx.batch_generator(task.round), lr=task_lr(ctx, task),
                     momentum=float(t.momentum), weight_decay=float(t.weight_decay),
                     nesterov=bool(t.nesterov), epochs=int(task.body.get("epochs", t.epochs)),
                     batch_size=int(t.batch_size), mu=mu, start=start)


def train_ahead(ctxs: Sequence[ClientContext], tasks: Sequence[Task],
                rules: Sequence[Any]) -> str:
    """Train a block of tasks' local rules as one batch now (training/batched.py) and keep each
    result for its task (take_ahead); no model and no meter is touched. Returns block_refusal's
    reason ('' when it trained). A block smaller than training/batched.least_clients (2; 3 for
    an RGB input's first convolution) is trained beside copies of its first task: a lone digits
    CNN, or 2 clients' RGB convolutions, run other kernels than a larger block, so that every
    client runs the kernels of every block (measured: a client's bits do not depend on its
    block's size, its place in it or its neighbours; tests/test_batched_runtime.py checks it)."""
    from fednet.training.batched import least_clients, train_batched

    why = block_refusal(ctxs, rules)
    if why:
        return why
    mus = [float(getattr(r, "mu", 0.0)) for r in rules]
    made: dict[tuple[int, str], tuple[Any, torch.Tensor]] = {}
    names: dict[int, list[str]] = {}  # id(model) -> its names, read once (ctxs hold the models)
    starts = [_start(c, t, made, names.get(id(c.model)) or names.setdefault(
        id(c.model), trainable_names(c.model))) for c, t in zip(ctxs, tasks)]
    jobs = [_job(c, t, mu, s) for c, t, mu, s in zip(ctxs, tasks, mus, starts)]
    least = least_clients(ctxs[0].model)
    while len(jobs) < least:  # copies of the first task, trained and dropped
        jobs.append(replace(jobs[0], generator=ctxs[0].batch_generator(tasks[0].round)))
    res = train_batched(ctxs[0].model, jobs, augment=ctxs[0].augment,
                        objective=ctxs[0].objective)
    ends = res.clients(len(ctxs))
    for g, (ctx, task) in enumerate(zip(ctxs, tasks)):
        s = res.stats[g]
        _AHEAD[(ctx.cid, task.task_id)] = Ahead(
            starts[g], ends[g], {"loss": s.loss, "samples": s.samples, "steps": s.steps},
            mus[g], res.batch_sizes[g], res.example, res.dtype)
    return ""


def take_ahead(ctx: ClientContext, task: Task, mu: float) -> dict[str, Any] | None:
    """The task's training done ahead, into ctx.model (which holds the received model now), its
    batches charged to the task's meter as the plain loop charges them; its body. None when none
    was done, or it started elsewhere (another model, another mu: the task then trains
    alone)."""
    got = _AHEAD.pop((ctx.cid, task.task_id), None)
    if got is None or got.mu != mu:
        return None
    start = got.start  # one pass: the same names, each parameter equal to where it started
    view = model_view(ctx.model)
    params = view.params
    if len(params) != len(start) or not all(
            (s := start.get(n)) is not None and torch.equal(p, s) for n, p in params):
        return None
    return _taken(ctx, view, got)


def load_ahead(ctx: ClientContext, task: Task, mu: float) -> dict[str, Any] | None:
    """load_arrays(ctx.model, task.arrays), then take_ahead(ctx, task, mu): the same model,
    meter and answer. When the task was trained ahead from exactly its received arrays (every
    entry of the model a trainable parameter, each received array of its dtype and shape, so
    that loading it would copy it exactly, and equal to where the block's training started),
    the received values are not copied into the model only to be replaced by the final ones
    (load_arrays' checks of the names and shapes still run, with the same ValueError)."""
    got = _AHEAD.get((ctx.cid, task.task_id))
    view = model_view(ctx.model) if got is not None and got.mu == mu else None
    if view is None or got is None or not _starts_here(view, task.arrays, got.start):
        load_arrays(ctx.model, task.arrays)
        return take_ahead(ctx, task, mu)
    checked_state(ctx.model, task.arrays)
    del _AHEAD[(ctx.cid, task.task_id)]
    return _taken(ctx, view, got)


def _starts_here(view: ModelView, arrays: Any, start: dict[str, torch.Tensor]) -> bool:
    """Whether `arrays` are exactly the model's trainable parameters (no other entry), each as
    the parameter holds it (CPU, its dtype and shape) and equal to `start`'s (as torch.equal
    compares: NaN never equal, -0.0 equal to 0.0)."""
    params = view.params
    if len(params) != len(start) or len(arrays) != len(start):
        return False
    for n, p in params:
        s, a = start.get(n), arrays.get(n)
        if (s is None or not isinstance(a, np.ndarray) or p.device.type != "cpu"
                or s.device.type != "cpu" or s.dtype != p.dtype or p.dtype is torch.bfloat16
                or s.shape != p.shape):
            return False
        sn = s.numpy()
        if a.dtype != sn.dtype or a.shape != sn.shape or not (a == sn).all():
            return False
    return True


def _taken(ctx: ClientContext, view: ModelView, got: Ahead) -> dict[str, Any]:
    """take_ahead's end: the final parameters into ctx.model, its meter charged; the body."""
    params = view.params
    with torch.no_grad():  # (one call for every parameter: the same copies)
        torch._foreach_copy_([p for _, p in params], [got.end[n] for n, _ in params])
    if not (view.plain_train and ctx.model.training and all(m.training for m in view.modules)):
        ctx.model.train()  # (a no-op when every module trains already and none overrides it)
    # training/local.train's charge(model, batch), batch by batch: the same integers
    flops.charge_sizes(ctx.model, got.sizes, got.example, got.dtype, arch=view.structure.arch)
    return dict(got.body)


class ModelView:
    """What take_ahead reads of a model object, kept while its structure (flops.structure) is
    the same object: its trainable named parameters (named_parameters' order), its submodules
    (not the model itself: the cache is weak on it) and whether none of them nor the model
    overrides Module.train (then train() only sets each one's flag)."""

    __slots__ = ("structure", "params", "modules", "plain_train")

    def __init__(self, model: torch.nn.Module, structure: flops.Structure) -> None:
        self.structure = structure
        self.params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.modules = structure.modules
        self.plain_train = all(type(m).train is torch.nn.Module.train
                               for m in (model, *self.modules))


_VIEWS: weakref.WeakKeyDictionary[torch.nn.Module, ModelView] = weakref.WeakKeyDictionary()


def model_view(model: torch.nn.Module) -> ModelView:
    """`model`'s ModelView, read again whenever flops.structure(model) was (its structure
    changed)."""
    st = flops.structure(model)
    got = _VIEWS.get(model)
    if got is None or got.structure is not st:
        got = _VIEWS[model] = ModelView(model, st)
    return got


def has_ahead(cid: int, task_id: int) -> bool:
    """Whether client cid's task was trained ahead and not taken yet."""
    return (cid, task_id) in _AHEAD


def forget_ahead() -> None:
    """Drop the results of tasks that never ran (the round ended: offline, or cut short)."""
    _AHEAD.clear()
