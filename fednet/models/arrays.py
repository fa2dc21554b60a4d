"""Bridge between torch modules and named numpy arrays (what goes on the wire), copying only where needed."""
from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import nn


_STATE_METHODS = ("state_dict", "_save_to_state_dict", "get_extra_state")
_KEEPS: dict[tuple[type, tuple[str, ...]], bool] = {}


def keeps_module_methods(cls: type, names: tuple[str, ...]) -> bool:
    """Whether module class `cls` overrides none of nn.Module's methods `names` (kept per class
    and names): where it does not, a reader of Module's own tables gives what they would."""
    got = _KEEPS.get((cls, names))
    if got is None:
        got = _KEEPS[(cls, names)] = all(getattr(cls, k) is getattr(nn.Module, k)
                                         for k in names)
    return got


def state_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """model.state_dict()'s entries (detached), in its order: read from the modules' own tables
    as Module.state_dict reads them (each module's parameters, then its persistent buffers,
    then its children's, no None), about twice as fast (a batched round reads a model's state
    several times a task); a model with a module whose class overrides state_dict,
    _save_to_state_dict or get_extra_state, or with a state_dict hook, is read through
    state_dict() itself."""
    out: dict[str, torch.Tensor] = {}
    return out if _walk_state(model, "", out) else model.state_dict()


def _walk_state(m: nn.Module, prefix: str, out: dict[str, torch.Tensor]) -> bool:
    if (not keeps_module_methods(type(m), _STATE_METHODS) or m._state_dict_pre_hooks or m._state_dict_hooks):
        return False
    for name, p in m._parameters.items():
        if p is not None:
            out[prefix + name] = p.detach()
    if m._buffers:
        skip = m._non_persistent_buffers_set
        for name, b in m._buffers.items():
            if b is not None and name not in skip:
                out[prefix + name] = b.detach()
    for name, c in m._modules.items():
        if c is not None and not _walk_state(c, prefix + name + ".", out):
            return False
    return True


def state_arrays(model: nn.Module) -> dict[str, np.ndarray]:
    """Ordered name -> numpy array of every state_dict entry; CPU tensors are shared (no copy), others copied."""
    out: dict[str, np.ndarray] = {}
    for name, t in state_tensors(model).items():
        t = t.detach()
        out[name] = (t if t.is_cpu else t.cpu()).numpy()
    return out


def state_nbytes(model: nn.Module) -> int:
    """Bytes of a model's state (parameters and buffers): what one copy of it moves."""
    return sum(t.numel() * t.element_size() for t in model.state_dict().values())


def _check_names(state: Mapping[str, torch.Tensor], arrays: Mapping[str, np.ndarray], strict: bool) -> None:
    """Raise ValueError naming the first missing, unexpected or wrongly shaped entry."""
    if strict:
        for name in state:
            if name not in arrays:
                raise ValueError(f"load_arrays: missing entry {name!r}")
        for name in arrays:
            if name not in state:
                raise ValueError(f"load_arrays: unexpected entry {name!r}")
    for name, t in state.items():
        if name in arrays and tuple(_shape(arrays[name])) != tuple(t.shape):
            raise ValueError(
                f"load_arrays: entry {name!r} has shape {tuple(np.shape(arrays[name]))}, model expects {tuple(t.shape)}"
            )


def _shape(a: Any) -> tuple[int, ...]:
    """np.shape(a), an array's own shape without a call into numpy."""
    return a.shape if isinstance(a, np.ndarray) else np.shape(a)


def checked_state(model: nn.Module, arrays: Mapping[str, np.ndarray], strict: bool = True
                  ) -> dict[str, torch.Tensor]:
    """state_tensors(model), once `arrays` were checked against it as load_arrays checks them
    (the same ValueError)."""
    state = state_tensors(model)
    _check_names(state, arrays, strict)
    return state


def load_arrays(model: nn.Module, arrays: Mapping[str, np.ndarray], strict: bool = True) -> None:
    """Copy arrays into the model's own tensors in place (read-only inputs fine); strict: names and
    shapes must match."""
    state = checked_state(model, arrays, strict)
    with torch.no_grad():
        for name, t in state.items():
            if name not in arrays:
                continue
            src = np.asarray(arrays[name])
            if t.is_cpu and t.dtype is not torch.bfloat16:
                dst = t.numpy()
                if np.may_share_memory(dst, src) and _same_memory(src, t):  # (bounds first: cheap)
                    continue  # already the tensor's own memory (adopt_arrays): nothing to copy
                try:  # straight numpy copy into the tensor's memory: no temporary tensor, no torch warning
                    np.copyto(dst, src, casting="same_kind")
                except TypeError as e:
                    raise ValueError(f"load_arrays: entry {name!r} has dtype {src.dtype}, model has {t.dtype}") from e
                continue
            if t.is_cpu and _same_memory(src, t):
                continue
            if not src.flags.aligned:
                src = np.ascontiguousarray(src)
            with warnings.catch_warnings():  # the source is only read; torch's non-writable warning does not apply
                warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
                t.copy_(torch.from_numpy(src))


def _same_memory(src: np.ndarray, t: torch.Tensor) -> bool:
    """`src` is exactly the CPU tensor's memory (same start, same size)."""
    nbytes = t.numel() * t.element_size()
    if not src.size or src.nbytes != nbytes:
        return False
    start = src.__array_interface__["data"][0]  # (ctypes.data builds a ctypes object)
    return bool(start == t.data_ptr())


def adopt_arrays(model: nn.Module, arrays: Mapping[str, np.ndarray]) -> int:
    """Make each given array the memory of the model's tensor of that name, instead of copying
    it in (CPU tensors; the array's dtype, shape, C order and writable). The caller hands the
    arrays over: they must be referenced nowhere else (e.g. a received model that decode joined
    into its own buffer, protocol.frames.is_private). Entries that do not qualify are left
    alone, for load_arrays to copy. Returns the bytes taken over."""
    state = model.state_dict(keep_vars=True)  # the Parameter and buffer objects themselves
    done = 0
    for name, src in arrays.items():
        t = state.get(name)
        if t is None or t.device.type != "cpu" or not isinstance(src, np.ndarray):
            continue
        if not (src.flags.writeable and src.flags.c_contiguous and src.flags.aligned) or \
                tuple(src.shape) != tuple(t.shape) or not src.dtype.isnative:
            continue
        try:
            new = torch.from_numpy(src)
        except TypeError:  # a dtype torch has no tensor for
            continue
        if new.dtype != t.dtype:
            continue
        t.data = new  # the old memory goes when nothing else (an unsent message) holds it
        done += src.nbytes
    return done


def num_params(model: nn.Module) -> int:
    """Number of trainable parameter values."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def clone_arrays(arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Deep, writable copy of a name -> array mapping (order kept)."""
    return {name: np.array(a, copy=True) for name, a in arrays.items()}
