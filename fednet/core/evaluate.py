"""The server's model: initial weights and test-set evaluation.

The server's evaluation (Evaluator.score) gives training/local.evaluate's numbers to the bit
(the same batches of EVAL_BATCH examples, each batch's loss and score summed by the objective in
the same order) at less cost, on a CPU (issue 56: a 10k-image test set of fedseq_cnn was most of
a round):
- under torch.inference_mode (no autograd bookkeeping);
- its non-overlapping max-poolings (nn.MaxPool2d, kernel = stride) pool a channels-last copy
  of their input and give the result back contiguous (channels_last_pools): the same values
  (a max is exact) in the layout the next layer had, ~5x faster on 28x28 planes (fedseq_cnn's
  first pooling: 13 ms against 2.6 ms for 64 images);
- a batch's forward runs in chunks of a few dozen examples (chunk_size: the largest module
  output of a chunk within CHUNK_BYTES), whose outputs are concatenated before the batch's loss:
  a 1,024-image batch of fedseq_cnn makes 200 MB activations, which glibc maps fresh and the
  kernel faults in page by page on every batch (2 M page faults an evaluation, as much system
  time as compute on the shared machine), while a chunk's stay in reused memory. Chunking is
  used only when a probe at the first evaluation finds the chunked forward of one batch equal
  to the whole batch's bit for bit (the kernels' per-example results do not depend on the
  batch's size on this CPU: measured); otherwise each batch is one forward, as before.
"""
from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator

import torch
from torch import nn

from fednet.config import RunConfig
from fednet.algorithms import model_name
from fednet.data import load_dataset, natural, run_test_split
from fednet.models import build_model
from fednet.models.factorized import matching_layer
from fednet.models.param_kinds import state_kinds
from fednet.models.arrays import clone_arrays, load_arrays, state_arrays, state_nbytes
from fednet.platform.malloc import reuse_freed_memory
from fednet.core.work import PlainWork
from fednet.training.batched import plain_pool
from fednet.training.local import evaluate
from fednet.training.objective import get_objective
from fednet.types import Arrays

EVAL_BATCH: int = inspect.signature(evaluate).parameters["batch_size"].default
"""The examples whose loss is summed at once: training/local.evaluate's batch (the same sums)."""

CHUNK_BYTES = 16 << 20
"""A forward chunk's largest layer output, at most (below glibc's largest mmap threshold,
32 MiB, so that its memory is reused rather than mapped and faulted in again)."""


@contextlib.contextmanager
def channels_last_pools(model: nn.Module) -> Iterator[None]:
    """Within the block, `model`'s non-overlapping max-poolings (training/batched.plain_pool) of
    4-d CPU inputs pool a channels-last copy of the input and return the result contiguous:
    the same values as the contiguous kernel (each output a window's maximum), in the layout
    the next layer had, several times faster on small planes. Hooks only: the module tree and
    every FLOP and operation count (training/flops' templates drop hooks) are unchanged."""
    handles = []
    for m in model.modules():
        if type(m) is nn.MaxPool2d and plain_pool(m):
            handles.append(m.register_forward_pre_hook(_to_channels_last))
            handles.append(m.register_forward_hook(_to_contiguous))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _to_channels_last(_m: nn.Module, args: tuple) -> tuple | None:
    x = args[0] if args else None
    if isinstance(x, torch.Tensor) and x.dim() == 4 and x.device.type == "cpu":
        return (x.contiguous(memory_format=torch.channels_last), *args[1:])
    return None


def _to_contiguous(_m: nn.Module, _args: tuple, out: object) -> object:
    return out.contiguous() if isinstance(out, torch.Tensor) else None


def chunk_size(model: nn.Module, x: torch.Tensor) -> int:
    """The most examples a forward chunk holds: its largest module output within CHUNK_BYTES,
    from the outputs of a forward of x's first example (one example: ~1 ms of fedseq_cnn)."""
    largest = 0

    def see(_m: nn.Module, _i: object, out: object) -> None:
        nonlocal largest
        if isinstance(out, torch.Tensor):
            largest = max(largest, out.numel() * out.element_size())

    hooks = [m.register_forward_hook(see) for m in model.modules()]
    try:
        model(x[:1])
    finally:
        for h in hooks:
            h.remove()
    return max(1, min(EVAL_BATCH, CHUNK_BYTES // max(largest, 1)))


def _forward(model: nn.Module, x: torch.Tensor, chunk: int) -> torch.Tensor:
    """model(x), computed `chunk` examples at a time and concatenated."""
    if chunk >= len(x):
        return model(x)
    return torch.cat([model(x[i:i + chunk]) for i in range(0, len(x), chunk)])


class Evaluator:
    """Holds one model and the held-out test set; evaluates arrays on demand."""

    def __init__(self, cfg: RunConfig) -> None:
        d = cfg.data
        full = load_dataset(d.dataset, d.data_root or None, d.download)
        full = natural.test_dataset(full, d, cfg.clients, cfg.seed)  # natural: the run's held-out set
        ds, self.exemplars = run_test_split(full, d.exemplars, cfg.seed)
        self.num_classes = ds.num_classes
        self.objective = get_objective(ds.objective)  # the loss and the score of the task
        self.x = torch.from_numpy(ds.test_x)
        self.y = torch.from_numpy(ds.test_y)
        self.model = build_model(model_name(cfg), ds.num_classes, ds.input_shape, dataset=d.dataset,
                                 seed=cfg.seed)
        self.model_bytes = state_nbytes(self.model)  # one copy of the model's state
        reuse_freed_memory(self.model_bytes)  # big models: results joined into mapped pages
        self.trainable = {n for n, p in self.model.named_parameters() if p.requires_grad}
        self.kinds = state_kinds(self.model)
        self.matching = matching_layer(self.model) if "v" in self.kinds.values() else ""
        self.linears = [m.weight.numel() for m in self.model.modules()
                        if isinstance(m, torch.nn.Linear)]  # FedSeq's classifier representation
        self.initial: Arrays = clone_arrays(state_arrays(self.model))
        self._shape = (model_name(cfg), ds.num_classes, ds.input_shape, d.dataset, cfg.seed)
        self.chunk = 0  # a forward's examples at most (_chunk: decided at the first evaluation)

    def pretrain_init(self) -> Arrays:
        """FedSeq's theta_pre: another random init of the same model (seed + 1,000,003), built
        only when an algorithm asks for it (Strategy.wants_pretrain_init: FedSeq)."""
        name, classes, shape, dataset, seed = self._shape
        pre = build_model(name, classes, shape, dataset=dataset, seed=seed + 1_000_003)
        return clone_arrays(state_arrays(pre))

    def __call__(self, arrays: Arrays) -> tuple[float, float]:
        """(accuracy, loss) of the model given by `arrays` on the test set."""
        return self.score(arrays, self.x, self.y)

    def score(self, arrays: Arrays, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
        """(accuracy, loss) of the model given by `arrays` on examples x, y (an attack's own
        metric: the test set transformed): training/local.evaluate's numbers, bit for bit, at
        less cost (the module's docstring)."""
        load_arrays(self.model, arrays)
        model, objective = self.model.eval(), self.objective
        correct, loss, n = 0, 0.0, len(y)
        with torch.inference_mode(), channels_last_pools(model):
            chunk = self._chunk(x)
            for i in range(0, n, EVAL_BATCH):
                out, yb = _forward(model, x[i:i + EVAL_BATCH], chunk), y[i:i + EVAL_BATCH]
                loss += objective.loss_sum(out, yb)
                correct += objective.score_sum(out, yb)  # type: ignore[assignment]  # (int, then float)
        return correct / max(n, 1), loss / max(n, 1)

    def _chunk(self, x: torch.Tensor) -> int:
        """The forward's chunk (chunk_size), kept only if the chunked forward of the first batch
        equals its whole forward bit for bit (checked once, at the first evaluation, on the
        model as it is then); EVAL_BATCH otherwise."""
        if self.chunk:
            return self.chunk
        self.chunk = EVAL_BATCH
        if not isinstance(x, torch.Tensor) or x.device.type != "cpu" or len(x) == 0:
            return self.chunk  # chunks only for CPU tensors
        chunk = chunk_size(self.model, x)
        xb = x[:EVAL_BATCH]
        if chunk < len(xb):
            whole = self.model(xb)
            if isinstance(whole, torch.Tensor) and torch.equal(_forward(self.model, xb, chunk),
                                                               whole):
                self.chunk = chunk
        return self.chunk

    def plain_work(self, batch_size: int) -> PlainWork:
        """Plain training's work on this model, its batches shaped as the test set's examples
        (core/work.PlainWork: FLOPs counted once per batch shape)."""
        return PlainWork(self.model, self.x, batch_size)

    def test_set(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The held-out examples and labels (not to be written)."""
        return self.x, self.y
