"""Checkpoints of typed algorithm state: a state dataclass <-> named arrays (.npz) and JSON.

What a field holds is read from its annotation (contract.py lists the vocabulary):
  Model (dict[str, ndarray])    arrays PREFIX/<entry>       entries named and shaped like the model's
  list[Model], dict[int, Model] arrays PREFIX/<i>/<entry>   (dict keys are client ids)
  np.ndarray                    array PREFIX                shaped like the fresh state's
  list[Tensor]                  arrays PREFIX/<i>           one per trainable parameter, its shape
  dict[int, Tensor]             arrays PREFIX/<i>           keyed by trainable parameter index
  tuple[Tensor, ...]            arrays PREFIX/<i>           integer index tensors
  anything else                 JSON                        ints in list[list[int]] and the keys
                                                            of dict[int, ...] are client ids
A field that is None (or an empty container) writes no arrays. decode() checks everything it
reads and reports the first problem through `fail(message)`; nothing is ever unpickled. With
finite=True (a checkpoint or store file read at --resume) every floating array must also hold
only finite values: no state of any algorithm (a model, FedOpt's moments, SCAFFOLD's controls,
FedDyn's h, the centered-clipping center) is NaN or inf in a run that had not diverged.
"""
from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np

if TYPE_CHECKING:  # (torch is imported where a state moves to a device)
    import torch

Arrays = dict[str, np.ndarray]
ARRAY_KINDS = ("model", "models", "model_map", "array", "tensors", "tensor_map", "tensor_tuple")


@dataclass
class Shapes:
    """What decode() checks arrays against."""

    model: Arrays                      # the initial model (names, shapes, dtypes)
    params: list[tuple[int, ...]]      # shapes of the trainable parameters, in order
    clients: int                       # client ids are 0 .. clients - 1
    fresh: object = None               # a fresh state (np.ndarray fields are shaped like its)


def _unoptional(tp: object) -> object:
    args = typing.get_args(tp)
    if type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return rest[0] if len(rest) == 1 else tp
    return tp


def kind(tp: object) -> str:
    """The storage kind of an annotation (one of ARRAY_KINDS, or 'json')."""
    import torch

    tp = _unoptional(tp)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is np.ndarray:
        return "array"
    is_model = lambda a: typing.get_origin(a) is dict and typing.get_args(a) == (str, np.ndarray)  # noqa: E731
    if origin is dict and args == (str, np.ndarray):
        return "model"
    if origin is list and args and is_model(args[0]):
        return "models"
    if origin is dict and args and args[0] is int and is_model(args[1]):
        return "model_map"
    if origin is list and args == (torch.Tensor,):
        return "tensors"
    if origin is dict and args == (int, torch.Tensor):
        return "tensor_map"
    if origin is tuple and args and args[0] is torch.Tensor:
        return "tensor_tuple"
    return "json"


def fields_of(cls: type) -> dict[str, tuple[str, Any]]:
    """field name -> (kind, annotation) of a state dataclass."""
    hints = typing.get_type_hints(cls)
    return {f.name: (kind(hints[f.name]), hints[f.name]) for f in dataclasses.fields(cls)}


def _np(v: Any) -> np.ndarray:
    return v.detach().cpu().numpy() if hasattr(v, "detach") else np.asarray(v)


def encode(state: Any, prefix: Callable[[str], str]) -> tuple[Arrays, dict[str, Any]]:
    """(arrays, JSON fields) of a state dataclass; prefix(field) names the field's arrays."""
    arrays: Arrays = {}
    meta: dict[str, Any] = {}
    for name, (k, _) in fields_of(type(state)).items():
        v, p = getattr(state, name), prefix(name)
        if k == "json":
            meta[name] = v
        elif v is None:
            continue
        elif k == "model":
            arrays.update({f"{p}/{n}": a for n, a in v.items()})
        elif k == "array":
            arrays[p] = v
        elif k in ("models", "tensors", "tensor_tuple"):
            for i, x in enumerate(v):
                if k == "models":
                    arrays.update({f"{p}/{i}/{n}": a for n, a in x.items()})
                else:
                    arrays[f"{p}/{i}"] = _np(x)
        elif k == "model_map":
            for cid, x in v.items():
                arrays.update({f"{p}/{int(cid)}/{n}": a for n, a in x.items()})
        else:  # tensor_map
            arrays.update({f"{p}/{int(i)}": _np(x) for i, x in v.items()})
    return arrays, meta


def _index(text: str, limit: int) -> int | None:
    return int(text) if text.isdigit() and int(text) < limit and str(int(text)) == text else None


class _Decoder:
    """Rebuilds one state from its arrays, reporting the first problem via fail()."""

    def __init__(self, shapes: Shapes, fail: Callable[[str], NoReturn],
                 device: torch.device | str | None = None,
                 finite: bool = False) -> None:
        self.s, self.fail, self.device, self.finite = shapes, fail, device, finite
        # a trainable parameter's dtype: one of the model's floating ones (a float64 file for
        # float32 parameters would change the arithmetic of a resumed run)
        self.floats = {a.dtype for a in shapes.model.values() if a.dtype.kind == "f"}

    def numbers(self, key: str, a: np.ndarray) -> None:
        """With finite: a floating array that holds NaN or inf fails."""
        if self.finite and a.dtype.kind in "fc" and not np.isfinite(a).all():
            bad = int(a.size - np.count_nonzero(np.isfinite(a)))
            self.fail(f"array '{key}' holds {bad} NaN or inf value{'s' * (bad != 1)} (a state "
                      "is finite in a run that goes on)")

    def entry(self, key: str, name: str, a: np.ndarray, exact: bool) -> None:
        """An array that stands for model entry `name`."""
        ref = self.s.model.get(name)
        if ref is None:
            self.fail(f"array '{key}' does not belong to this model")
            return
        if a.shape != ref.shape:
            self.fail(f"array '{key}' has shape {a.shape}, the model needs {ref.shape}")
        if exact and a.dtype != ref.dtype:
            self.fail(f"array '{key}' has dtype {a.dtype}, the model needs {ref.dtype}")
        if not exact and a.dtype.kind != ref.dtype.kind:
            self.fail(f"array '{key}' has dtype {a.dtype}, expected the kind of {ref.dtype} "
                      f"(shape {ref.shape})")
        self.numbers(key, a)

    def model(self, p: str, got: dict[str, np.ndarray], exact: bool) -> Arrays:
        for n, a in got.items():
            self.entry(f"{p}/{n}", n, a, exact)
        if exact:
            for n in self.s.model:
                if n not in got:
                    self.fail(f"array '{p}/{n}' is missing")
        return dict(got)

    def tensor(self, key: str, a: np.ndarray, i: int | None) -> Any:
        import torch

        if i is not None:
            if i >= len(self.s.params) or a.shape != self.s.params[i] or a.dtype.kind != "f" \
                    or (self.floats and a.dtype not in self.floats):
                want = self.s.params[i] if i < len(self.s.params) else "none"
                self.fail(f"array '{key}' has shape {a.shape} and dtype {a.dtype}; trainable "
                          f"parameter {i} has shape {want} and dtype "
                          f"{' or '.join(sorted(map(str, self.floats))) or 'floating'}")
        elif a.ndim != 1 or a.dtype.kind not in "iu":
            self.fail(f"array '{key}' must be a 1-d integer index array")
        self.numbers(key, a)
        t = torch.from_numpy(np.array(a))
        return t.to(self.device) if self.device is not None else t

    def field(self, k: str, p: str, got: dict[str, np.ndarray], name: str) -> Any:
        """The value of one array field from its arrays (keys relative to p)."""
        if k == "model":
            return self.model(p, got, exact=name == "model")
        if k == "array":
            ref = getattr(self.s.fresh, name, None)
            a = got.get("")
            if a is None or set(got) != {""} or (ref is not None and (a.shape, a.dtype) !=
                                                  (ref.shape, ref.dtype)):
                self.fail(f"array '{p}' does not fit the state (expected "
                          f"{getattr(ref, 'shape', '?')} {getattr(ref, 'dtype', '?')})")
            self.numbers(p, a)
            return np.array(a)
        groups: dict[int, dict[str, np.ndarray]] = {}
        limit = self.s.clients if k == "model_map" else 1 << 30
        for rel, a in got.items():
            head, _, rest = rel.partition("/")
            i = _index(head, limit)
            if i is None or (k in ("models", "model_map")) != bool(rest):
                self.fail(f"array '{p}/{rel}' does not belong to this state")
                continue
            groups.setdefault(i, {})[rest] = a
        if k in ("models", "tensors", "tensor_tuple") and sorted(groups) != list(range(len(groups))):
            self.fail(f"arrays '{p}/<i>' are not numbered 0..{len(groups) - 1}")
        order = sorted(groups)
        if k == "models":
            return [self.model(f"{p}/{i}", groups[i], False) for i in order]
        if k == "model_map":
            return {i: self.model(f"{p}/{i}", groups[i], False) for i in order}
        per = k != "tensor_tuple"
        vals = {i: self.tensor(f"{p}/{i}", groups[i][""], i if per else None) for i in order}
        if k == "tensors" and len(vals) != len(self.s.params):
            self.fail(f"arrays '{p}/<i>': {len(vals)}, one per trainable parameter is "
                      f"{len(self.s.params)}")
        return vals if k == "tensor_map" else (
            tuple(vals.values()) if k == "tensor_tuple" else list(vals.values()))


def _json_ok(v: Any, tp: Any, clients: int, ids: bool = False) -> Any:
    """v as annotation tp wants it (JSON dict keys back to ints); raises ValueError."""
    if v is None and type(None) in typing.get_args(tp):
        return None
    tp = _unoptional(tp)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return v
    if tp in (int, float, str, bool):
        ok = isinstance(v, tp) and not (tp is not bool and isinstance(v, bool))
        ok = ok or (tp is float and isinstance(v, int) and not isinstance(v, bool))
        if not ok or (ids and not 0 <= v < clients):
            raise ValueError(f"{v!r} is not {'a client id' if ids else tp.__name__}")
        return v
    if origin is list:
        if not isinstance(v, list):
            raise ValueError(f"{v!r} is not a list")
        inner = args[0] if args else Any
        nested = typing.get_origin(inner) is list
        return [_json_ok(x, inner, clients, ids or nested) for x in v]
    if origin is dict:
        if not isinstance(v, dict):
            raise ValueError(f"{v!r} is not an object")
        kt, vt = args if args else (str, Any)
        out = {}
        for key, x in v.items():
            k2 = _index(str(key), clients) if kt is int else key
            if k2 is None:
                raise ValueError(f"key {key!r} is not a client id")
            out[k2] = _json_ok(x, vt, clients)
        return out
    return v


def check_model(prefix: str, got: Arrays, shapes: Shapes, fail: Callable[[str], NoReturn],
                finite: bool = False) -> Arrays:
    """A whole model (PREFIX/<entry>): every entry of the initial model, same shapes and dtypes
    (finite: and no NaN or inf)."""
    return _Decoder(shapes, fail, finite=finite).model(prefix, got, exact=True)


def decode(cls: type, arrays: Arrays, meta: dict[str, Any], prefix: Callable[[str], str],
           shapes: Shapes, fail: Callable[[str], NoReturn], fail_json: Callable[[str], NoReturn],
           device: torch.device | str | None = None, finite: bool = False) -> tuple[Any, set[str]]:
    """The inverse of encode(): (an instance of cls, the array names it used). Every array and
    JSON field is checked (finite: floating arrays hold no NaN or inf); fail() (arrays) or
    fail_json() gets the first problem and must raise. Fields without arrays or JSON keep their
    defaults (None, empty)."""
    dec = _Decoder(shapes, fail, device, finite)
    values: dict[str, Any] = {}
    owned: set[str] = set()
    for name, (k, tp) in fields_of(cls).items():
        p = prefix(name)
        if k == "json":
            if name in meta:
                try:
                    values[name] = _json_ok(meta[name], tp, shapes.clients)
                except ValueError as e:
                    fail_json(f"'{name}' does not fit the state ({e})")
            continue
        got = {key[len(p) + 1:] if key != p else "": a for key, a in arrays.items()
               if key == p or key.startswith(p + "/")}
        owned |= {key for key in arrays if key == p or key.startswith(p + "/")}
        if got:
            values[name] = dec.field(k, p, got, name)
        elif name == "model":
            dec.model(p, {}, exact=True)  # names the first missing entry
    return cls(**values), owned


def to_device(state: Any, device: torch.device | str) -> Any:
    """The state with every tensor moved to `device` (fields replaced in place)."""
    def move(v: Any) -> Any:
        if hasattr(v, "to") and hasattr(v, "detach"):
            return v.to(device)
        if isinstance(v, list):
            return [move(x) for x in v]
        if isinstance(v, tuple):
            return tuple(move(x) for x in v)
        if isinstance(v, dict):
            return {k: move(x) for k, x in v.items()}
        return v
    for f in dataclasses.fields(state):
        setattr(state, f.name, move(getattr(state, f.name)))
    return state
