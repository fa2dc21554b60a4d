"""The work a client's torch loops do, in FLOPs counted by PyTorch's own counter
(`torch.utils.flop_counter.FlopCounterMode`), for the simulated clock (docs/usage.md, "Client
compute").

A batch's FLOPs depend on the model's architecture, the batch's shape and dtype and what the
loop does with it (`MODES`), never on the values: each (architecture, shape, dtype, mode) is
counted once per process on a copy of the model on torch's meta device (no storage, no data,
milliseconds; a CPU copy with zero inputs for a model that meta cannot run) and cached. The
counter counts the matrix products and convolutions (mm, addmm, bmm, convolution and their
backward, attention): elementwise work (activations, normalization, the loss, the optimizer's
update) counts no FLOPs. The same run counts the batch's dispatched aten operations (`Work.ops`:
every operator call torch dispatches, views included, and one update per trained tensor), whose
fixed cost (dispatch, autograd, the loop's Python: a few microseconds each) is most of a small
model's time, and among them its convolutions (`Work.convs`: forward and backward calls), each
of which also pays a fixed cost of its own (the CPU's oneDNN kernels reorder their inputs and
weights on every call: ~0.1 ms, most of a small CNN's step); a profile charges them at its
`s_per_op` and `s_per_conv` (network/latency.compute_time). What the model leaves out is
docs/usage.md's "Client compute".

The loops (training/local.py, training/dpsgd.py, and the algorithms' own loops) call `charge`
with each batch; it adds to the `Meter` that core/executor.py opens around one task, and does
nothing outside one (the server's evaluation). A task's compute is its meter's total divided by
the client's FLOP/s, plus its dispatched operations times the client's seconds per operation
(network/latency.compute_time): the same integers in every runtime, so
`fednet local` and `fednet launch` stamp the same simulated seconds to the last bit.
"""
from __future__ import annotations

import contextlib
import contextvars
import copy
import fcntl
import hashlib
import json
import os
import sys
import tempfile
import weakref
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from fednet import opcount as ops
from fednet.models.arrays import keeps_module_methods

MODES = ("train", "eval", "dpsgd", "hvp")
"""What a loop does with a batch: train (forward and backward), eval (forward without a graph),
dpsgd (forward and backward through Opacus's per-example gradients, then their clipping and
sum: training/dpsgd.py), hvp (forward, a backward that keeps its graph and a second backward
through it: a Hessian-vector product, Per-FedAvg's HF variant)."""


class Work(NamedTuple):
    """What one batch costs: its counted FLOPs, its dispatched aten operations and how many of
    those are convolutions (CONVOLUTIONS)."""

    flops: int
    ops: int
    convs: int = 0


CONVOLUTIONS = frozenset({"convolution", "convolution_backward"})
"""The aten operators counted as convolutions (Work.convs): the forward and backward calls."""


class Meter:
    """The FLOPs charged while it is open (one task of one client), and the protocol work
    (`ops`: fednet/opcount.py's counts, e.g. secure aggregation's primitives; the batches'
    dispatched aten operations and convolutions are its opcount.DISPATCH and CONVOLUTION
    entries, charged at the profile's s_per_op and s_per_conv, not as protocol work)."""

    __slots__ = ("flops", "batches", "ops", "archs")

    def __init__(self) -> None:
        self.flops = 0
        self.batches = 0
        self.ops: dict[str, float] = {}
        # id(model) -> (the model, its architecture), looked up once a task through structure()
        # (a model does not change its layers while it trains; the structure's key costs ~45 us
        # for the digits CNN, which a charge per batch would pay every batch; architecture()
        # itself is read again only when it changed); the model is held so that its id is not
        # another model's while the meter is open
        self.archs: dict[int, tuple[nn.Module, tuple]] = {}

    def architecture(self, model: nn.Module) -> tuple:
        """`model`'s architecture, read once while this meter is open."""
        got = self.archs.get(id(model))
        if got is None:
            got = self.archs[id(model)] = (model, structure(model).arch)
        return got[1]


_ACTIVE: contextvars.ContextVar[Meter | None] = contextvars.ContextVar("fednet_flops",
                                                                        default=None)
_TEMPLATES: dict[tuple, nn.Module] = {}  # architecture -> its meta (or CPU) copy
_COUNTS: dict[tuple, Work] = {}  # (architecture, shape, dtype, mode) -> one batch's Work


@contextlib.contextmanager
def metered(on: bool = True) -> Iterator[Meter]:
    """A Meter that every `charge` inside the block adds to (on=False: one whose FLOPs stay at 0:
    a profile whose compute is not in FLOPs needs no count); the protocol work charged inside
    (opcount.charge) is counted either way, in its `ops`."""
    meter = Meter()
    with ops.counted() as meter.ops:
        if not on:
            yield meter
            return
        token = _ACTIVE.set(meter)
        try:
            yield meter
        finally:
            _ACTIVE.reset(token)


def charge(model: nn.Module, x: torch.Tensor, mode: str = "train") -> None:
    """Charge the open meter (if any) one batch `x` through `model` in `mode` (MODES)."""
    meter = _ACTIVE.get()
    if meter is None or len(x) == 0:
        return
    _add(meter, batch_work(model, tuple(x.shape), x.dtype, mode, meter.architecture(model)), 1)


def charge_sizes(model: nn.Module, sizes: Sequence[int], example: tuple[int, ...],
                 dtype: torch.dtype = torch.float32, mode: str = "train",
                 arch: tuple | None = None) -> None:
    """Charge the open meter (if any) batches of `sizes` examples of shape `example` each, as
    `charge` would batch by batch (the same integers: a batch's FLOPs depend on its shape only;
    a block trained ahead, training/batched.py, charges its clients' batches with it). `arch`:
    the model's architecture when the caller has it (structure(model).arch); else it is read
    through structure(model), kept per model object while its structure does not change."""
    meter = _ACTIVE.get()
    if meter is None:
        return
    if arch is None:
        arch = structure(model).arch
    for size, n in Counter(s for s in sizes if s).items():
        _add(meter, batch_work(model, (size, *example), dtype, mode, arch), n)


class Structure:
    """What one model object's structure reads as (structure(model)): its `key` (every
    submodule's, parameter's and buffer's name and identity, and each tensor's shape, dtype and
    requires_grad), its submodules (named_modules' order without the model itself, which is
    never held: the caches are weak on it; they and the tensors are held, so that no id in
    `key` is reused while it is kept) and its `arch` (architecture(model))."""

    __slots__ = ("key", "modules", "held", "arch", "__weakref__")

    def __init__(self, key: tuple, modules: list[nn.Module], held: list, arch: tuple) -> None:
        self.key, self.modules, self.held, self.arch = key, modules, held, arch


_STRUCTURES: weakref.WeakKeyDictionary[nn.Module, Structure] = weakref.WeakKeyDictionary()


def structure_key(model: nn.Module) -> tuple[tuple, list[nn.Module], list[torch.Tensor]]:
    """(the key of `model`'s structure, its submodules, its parameters and buffers): everything
    architecture(model) depends on (the model's class; every module's name, identity and class;
    each one's own parameters' and buffers' names, identities, shapes, dtypes and
    requires_grad), in one pass. Two equal keys of one model (its objects held meanwhile) mean
    the same architecture, the same modules and the same parameters. Read from the modules'
    own tables (_modules, _parameters, _buffers) in named_modules' order, as Module's methods
    would yield them (a task trained ahead reads it every task: ~4x faster than through
    them); a model with a module whose class overrides those methods is read through them."""
    got = _plain_key(model)
    return got if got is not None else _methods_key(model)


_MODULE_METHODS = ("named_modules", "named_parameters", "named_buffers", "_named_members",
                   "__hash__", "__eq__")


def _plain_key(model: nn.Module) -> tuple[tuple, list[nn.Module], list[torch.Tensor]] | None:
    """structure_key read from the tables (None: a module's class overrides a method): the
    same tuple as _methods_key (named_modules' pre-order, its memo of modules seen; each
    module's members without None and without a tensor it holds twice)."""
    out: list = [type(model)]
    modules: list[nn.Module] = []
    held: list[torch.Tensor] = []
    seen: set[int] = set()
    stack: list[tuple[str, nn.Module]] = [("", model)]
    while stack:
        name, m = stack.pop()
        if not keeps_module_methods(type(m), _MODULE_METHODS):
            return None
        if id(m) in seen:
            continue
        seen.add(id(m))
        if m is not model:  # (the model itself is the caches' weak key: never held)
            modules.append(m)
        out.append((name, id(m), type(m)))
        once: set[int] = set()
        for k, p in m._parameters.items():
            if p is not None and id(p) not in once:
                once.add(id(p))
                held.append(p)
                out.append((k, id(p), p.shape, p.dtype, p.requires_grad))
        once.clear()
        for k, b in m._buffers.items():
            if b is not None and id(b) not in once:
                once.add(id(b))
                held.append(b)
                out.append((k, id(b), b.shape, b.dtype))
        children = [(name + "." + k if name else k, c) for k, c in m._modules.items()
                    if c is not None]
        stack.extend(reversed(children))
    return tuple(out), modules, held


def _methods_key(model: nn.Module) -> tuple[tuple, list[nn.Module], list[torch.Tensor]]:
    """structure_key through Module's methods (a class may override them)."""
    out: list = [type(model)]
    modules: list[nn.Module] = []
    held: list[torch.Tensor] = []
    for name, m in model.named_modules():
        if m is not model:  # (the model itself is the caches' weak key: never held)
            modules.append(m)
        out.append((name, id(m), type(m)))
        for k, p in m.named_parameters(recurse=False):
            held.append(p)
            out.append((k, id(p), p.shape, p.dtype, p.requires_grad))
        for k, b in m.named_buffers(recurse=False):
            held.append(b)
            out.append((k, id(b), b.shape, b.dtype))
    return tuple(out), modules, held


def structure(model: nn.Module) -> Structure:
    """`model`'s Structure, kept per model object: read again (architecture(model)) only when
    its key changed (a parameter or buffer added, removed, replaced, reshaped, recast, or its
    requires_grad toggled; a submodule added, removed or swapped); the same object while it did
    not."""
    key, modules, held = structure_key(model)
    got = _STRUCTURES.get(model)
    if got is None or got.key != key:
        got = _STRUCTURES[model] = Structure(key, modules, held, architecture(model))
    return got


def _add(meter: Meter, work: Work, n: int) -> None:
    """n batches of `work` on the meter."""
    meter.flops += n * work.flops
    meter.batches += n
    ops.add(meter.ops, {ops.DISPATCH: float(n * work.ops), ops.CONVOLUTION: float(n * work.convs)})


def batch_flops(model: nn.Module, shape: tuple[int, ...], dtype: torch.dtype = torch.float32,
                mode: str = "train") -> int:
    """FLOPs of one batch of `shape` through `model` in `mode`, counted once and cached."""
    return batch_work(model, shape, dtype, mode).flops


def batch_work(model: nn.Module, shape: tuple[int, ...], dtype: torch.dtype = torch.float32,
               mode: str = "train", arch: tuple | None = None) -> Work:
    """FLOPs and dispatched operations of one batch of `shape` through `model` in `mode`,
    counted once and cached (`arch`: the model's architecture, when the caller has it)."""
    if mode not in MODES:
        raise ValueError(f"unknown compute mode {mode!r}; one of {', '.join(MODES)}")
    arch = architecture(model) if arch is None else arch
    key = (arch, tuple(int(s) for s in shape), str(dtype), mode)
    got = _COUNTS.get(key)
    if got is None:
        got = _disk(model, arch).get(key[1:])
        if got is None:
            got = _count(template(model, arch), key[1], dtype, mode)
            _disk(model, arch).put(key[1:], got)
        _COUNTS[key] = got
    return got


def known(model: nn.Module, example: tuple[int, ...], sizes: Sequence[int],
          dtype: torch.dtype = torch.float32, mode: str = "train") -> bool:
    """Whether the Work of a batch of each of `sizes` examples of shape `example` through
    `model` in `mode` is known without counting (in this process's cache or the disk cache:
    torch's counter then does not start here); the ones on disk are read into this process's
    cache."""
    arch = structure(model).arch
    for size in sizes:
        key = (arch, (int(size), *map(int, example)), str(dtype), mode)
        if key not in _COUNTS:
            got = _disk(model, arch).get(key[1:])
            if got is None:
                return False
            _COUNTS[key] = got
    return True


def kept(model: nn.Module, name: str, make: Callable[[], int], code: str) -> int:
    """An integer that depends only on `model`'s architecture and code, torch's version and the
    source file `code` (the caller's, where make's rule lives), e.g. training/batched.conv_flops
    (a forward on the meta device, whose first run imports torch._dynamo as the counter's
    does): read from the disk cache beside the model's counts, else make() and kept there."""
    disk = _disk(model, structure(model).arch)
    try:
        with open(code, "rb") as f:
            entry = f"kept|{name}|{hashlib.sha256(f.read()).hexdigest()[:16]}"
    except OSError:
        return int(make())
    got = disk.counts.get(entry) if disk.path else None
    if isinstance(got, list) and len(got) == 1:
        return int(got[0])
    value = int(make())
    disk.write(entry, [value])
    return value


CACHE_ENV = "FEDNET_FLOPS_CACHE"
"""The disk cache's folder (default ~/.cache/fednet/flops; "off": none). One JSON file per
architecture and everything else a count depends on (_disk_name): the counts of torch's counter
made by any process of this host, so that a later run (or another process of this one) reads
them instead of counting: a process's first count starts torch's counter, which imports
torch._dynamo and sympy (~0.75 s and ~150 MB, as long as importing torch itself). Delete the
folder to count again."""
_DISK_MODES = frozenset({"train", "eval", "hvp"})  # (dpsgd's count runs Opacus: not kept)


class _DiskCounts:
    """One architecture's counts in the disk cache: read once (at the first look-up), each
    new count merged into the file under a lock and written whole (a reader never sees half a
    file)."""

    __slots__ = ("path", "counts")

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.counts = _read_counts(path) if path else {}

    def get(self, key: tuple) -> Work | None:
        got = self.counts.get(_entry(key)) if self.path else None
        return Work(*got) if got is not None and len(got) == 3 else None

    def put(self, key: tuple, work: Work) -> None:
        if key[2] in _DISK_MODES:
            self.write(_entry(key), list(work))

    def write(self, entry: str, value: list[int]) -> None:
        """Keep `value` under `entry`, in this process and on disk."""
        if self.path is None:
            return
        self.counts[entry] = value
        try:
            folder = os.path.dirname(self.path)
            os.makedirs(folder, exist_ok=True)
            with open(self.path + ".lock", "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                self.counts = {**_read_counts(self.path), **self.counts}
                fd, tmp = tempfile.mkstemp(dir=folder, prefix=".counts.")
                with os.fdopen(fd, "w") as f:
                    json.dump({"counts": self.counts}, f)
                os.chmod(tmp, 0o644)
                os.replace(tmp, self.path)
        except OSError:  # a folder that cannot be written: the counts stay in this process
            self.path = None


def _entry(key: tuple) -> str:
    """A count's name in its architecture's file: (shape, dtype, mode) as one string."""
    shape, dtype, mode = key
    return f"{mode}|{dtype}|{','.join(map(str, shape))}"


def _read_counts(path: str) -> dict[str, list[int]]:
    try:
        with open(path) as f:
            got = json.load(f)["counts"]
    except (OSError, ValueError, KeyError, TypeError):  # none yet, or not ours: counted anew
        return {}
    if not isinstance(got, dict):
        return {}
    return {k: v for k, v in got.items() if isinstance(k, str) and isinstance(v, list)
            and len(v) in (1, 3) and all(type(x) is int for x in v)}


_DISKS: dict[tuple, _DiskCounts] = {}  # architecture -> its counts in the disk cache


def _disk(model: nn.Module, arch: tuple) -> _DiskCounts:
    got = _DISKS.get(arch)
    if got is None:
        got = _DISKS[arch] = _DiskCounts(_disk_path(model, arch))
    return got


def _disk_path(model: nn.Module, arch: tuple) -> str | None:
    """The file of `model`'s counts, None where the disk cache is off or a module of the model
    has no source file to fingerprint (a class defined in an interactive session)."""
    folder = os.environ.get(CACHE_ENV, "")
    if folder.lower() in ("off", "0", "none"):
        return None
    name = _disk_name(model, arch)
    if name is None:
        return None
    folder = os.path.expanduser(folder or "~/.cache/fednet/flops")
    return os.path.join(os.path.abspath(folder), name + ".json")


def _disk_name(model: nn.Module, arch: tuple) -> str | None:
    """A digest of everything a count depends on: the architecture (its classes, shapes and
    settings), the source files that define its classes and this module (the forward and the
    modes' steps: a changed file is another key), and the versions of torch (its counter, its
    operators' decompositions) and Python."""
    import fednet

    files = {__file__}
    for m in model.modules():
        mod = sys.modules.get(type(m).__module__)
        path = getattr(mod, "__file__", None)
        if not path:
            return None
        files.add(path)
    h = hashlib.sha256(repr((arch, torch.__version__, fednet.__version__,
                             sys.version_info[:3])).encode())
    for path in sorted(files):
        try:
            with open(path, "rb") as f:
                h.update(path.encode() + b"\0" + hashlib.sha256(f.read()).digest())
        except OSError:
            return None
    return h.hexdigest()[:32]


def architecture(model: nn.Module) -> tuple:
    """What a model's FLOPs depend on besides its input: its class, every parameter's and
    buffer's name, shape and dtype (and whether it is trained), and every submodule's name,
    class and settings (_settings: a convolution's stride, padding, dilation and groups, a
    pooling's kernel and stride, ...: two models of the same parameters' shapes that differ
    there do different work). Read per model object (structure()): a setting changed in place on
    a model already read is not seen until its structure changes."""
    return (type(model).__module__, type(model).__qualname__,
            tuple((n, tuple(p.shape), str(p.dtype), p.requires_grad)
                  for n, p in model.named_parameters()),
            tuple((n, tuple(b.shape), str(b.dtype)) for n, b in model.named_buffers()),
            tuple((n, type(m).__module__, type(m).__qualname__, _settings(m))
                  for n, m in model.named_modules()))


_MODULE_STATE = frozenset(nn.Module().__dict__)
"""The attributes every nn.Module has (its tensors', submodules' and hooks' tables, `training`):
not settings."""


def _settings(m: nn.Module) -> tuple:
    """A module's own settings: its attributes besides nn.Module's own (_MODULE_STATE) whose
    values are plain data (numbers, strings, None, dtypes, sequences of those) or functions (by
    name), sorted by name; anything else (a tensor, an object) is left out."""
    out = []
    for k, v in m.__dict__.items():
        if k not in _MODULE_STATE:
            got = _plain(v)
            if got is not _SKIP:
                out.append((k, got))
    return tuple(sorted(out, key=lambda kv: kv[0]))


_SKIP = object()


_SCALARS = (type(None), bool, int, float, str, torch.dtype)


def _plain(v: object) -> object:
    """`v` as a hashable key part, or _SKIP where it is not plain data (_settings)."""
    if type(v) in _SCALARS or isinstance(v, _SCALARS):
        return v
    if isinstance(v, (tuple, list)):
        parts = tuple(_plain(x) for x in v)
        return _SKIP if any(x is _SKIP for x in parts) else (type(v).__name__, parts)
    if callable(v) and hasattr(v, "__qualname__"):  # a function: F.relu, torch.tanh
        return ("fn", getattr(v, "__module__", None), v.__qualname__)
    return _SKIP


def template(model: nn.Module, arch: tuple | None = None) -> nn.Module:
    """The cached storage-free copy of `model`'s architecture (made now if it is new): call it
    before a wrapper hooks the model (Opacus), so that the copy carries no hooks."""
    arch = architecture(model) if arch is None else arch
    got = _TEMPLATES.get(arch)
    if got is None:
        got = _TEMPLATES[arch] = _copy(model, "meta")
    return got


def _copy(model: nn.Module, device: str) -> nn.Module:
    """`model` on `device` (parameters and buffers new and zero, never copied; no hooks)."""
    memo: dict[int, object] = {}
    for p in model.parameters():
        memo[id(p)] = nn.Parameter(torch.zeros_like(p, device=device),
                                   requires_grad=p.requires_grad)
    for b in model.buffers():
        memo[id(b)] = torch.zeros_like(b, device=device)
    out = copy.deepcopy(model, memo)
    for m in out.modules():
        for hooks in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks",
                      "_backward_pre_hooks", "_forward_hooks_with_kwargs",
                      "_forward_pre_hooks_with_kwargs", "_forward_hooks_always_called"):
            d = getattr(m, hooks, None)
            if d is not None:
                d.clear()
    return out


def _count(tmpl: nn.Module, shape: tuple[int, ...], dtype: torch.dtype, mode: str) -> Work:
    """Run one batch of zeros through a copy of `tmpl` under the counter (on meta; on the CPU
    where the model cannot run on meta: a data-dependent step)."""
    try:
        return _run(copy.deepcopy(tmpl), shape, dtype, mode, "meta")
    except Exception:  # noqa: BLE001 - meta has no kernel, or the model reads a value
        return _run(_copy(tmpl, "cpu"), shape, dtype, mode, "cpu")


def _scalar(out: object) -> torch.Tensor:
    """A scalar to differentiate from a model's output (a tuple's first tensor)."""
    while isinstance(out, (tuple, list)):
        out = out[0]
    assert isinstance(out, torch.Tensor)
    return out.float().sum()


def _run(m: nn.Module, shape: tuple[int, ...], dtype: torch.dtype, mode: str, device: str
         ) -> Work:
    from torch.utils.flop_counter import FlopCounterMode

    x = torch.zeros(shape, dtype=dtype, device=device)
    params: list[torch.Tensor] = [p for p in m.parameters() if p.requires_grad]
    with FlopCounterMode(display=False) as counter, _Dispatched() as calls:
        _step(m, x, params, mode)
    updates = len(params) if mode != "eval" else 0  # the optimizer's step: one per tensor
    return Work(int(counter.get_total_flops()), calls.n + updates, calls.convs)


def _step(m: nn.Module, x: torch.Tensor, params: list[torch.Tensor], mode: str) -> None:
    """One batch of `mode` through m (under the counters)."""
    if mode == "eval" or not params:
        m.eval()
        with torch.no_grad():
            m(x)
    elif mode == "train":
        m.train()
        _scalar(m(x)).backward()
    elif mode == "hvp":
        m.train()
        # (allow_unused: a parameter whose gradient does not depend on the parameters is
        # absent from the second graph: the last layer's bias under this sum of the outputs)
        grads = torch.autograd.grad(_scalar(m(x)), params, create_graph=True,
                                    allow_unused=True)
        dot = sum((g * g.detach()).sum() for g in grads if g is not None)
        torch.autograd.grad(dot, params, allow_unused=True)  # type: ignore[arg-type]  # sum(): Tensor | 0
    else:
        _dpsgd(m, x, params)


class _Dispatched(TorchDispatchMode):
    """Counts the aten operator calls dispatched inside it (views too: each has its fixed
    cost), in the order the counter sees them; the calls themselves run unchanged."""

    def __init__(self) -> None:
        super().__init__()
        self.n = self.convs = 0

    def __torch_dispatch__(self, func: Callable[..., object], types: object,
                           args: tuple = (), kwargs: dict | None = None) -> object:
        self.n += 1
        self.convs += getattr(func, "__name__", "").split(".")[0] in CONVOLUTIONS
        return func(*args, **(kwargs or {}))


def _dpsgd(m: nn.Module, x: torch.Tensor, params: list[torch.Tensor]) -> None:
    """DP-SGD's work on a batch as training/dpsgd.py does it: the forward and backward through
    Opacus's GradSampleModule (per-example gradients) and DPOptimizer's clipping and sum."""
    import warnings

    import opacus
    from opacus.optimizers import DPOptimizer

    m.train()
    gsm = opacus.GradSampleModule(m, loss_reduction="mean")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Full backward hook is firing")
        _scalar(gsm(x)).backward()
    dp = DPOptimizer(_Groups(params), noise_multiplier=0.0,
                     max_grad_norm=1.0, expected_batch_size=len(x))
    dp.clip_and_accumulate()


class _Groups:
    """What DPOptimizer reads of the optimizer it wraps (as training/dpsgd.py's _Params)."""

    def __init__(self, params: list[torch.Tensor]) -> None:
        self.param_groups = [{"params": params}]
        self.state: dict = {}
        self.defaults: dict = {}
