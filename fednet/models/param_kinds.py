"""Parameter kinds (docs/algorithms.md §5.4-§5.6, §3.7): tagged where a parameter is created, so
code selects by kind."""
from __future__ import annotations

from torch import nn

KINDS = ("u", "v", "mu", "dense", "norm", "head", "global", "local")
"""Parameter kinds: factor u / v / mu, plain weights, normalisation affine, classifier head, pFedPara global / local."""

BUFFER = "buffer"
"""Kind state_kinds gives to non-parameter state (BN running stats, num_batches_tracked)."""

_NORMS = (nn.modules.batchnorm._NormBase, nn.GroupNorm, nn.LayerNorm)


def tag(module: nn.Module, name: str, kind: str) -> nn.Parameter:
    """Tag module's own parameter name with kind (kept on the module, so copy.deepcopy keeps it, and on the tensor)."""
    if kind not in KINDS:
        raise ValueError(f"unknown parameter kind {kind!r}; expected one of {KINDS}")
    p = module._parameters[name]
    if p is None:
        raise ValueError(f"{type(module).__name__}.{name} is None and cannot be tagged")
    module.__dict__.setdefault("_fednet_kinds", {})[name] = kind
    p._fednet_kind = kind  # type: ignore[attr-defined]  # fednet's own tag on the tensor
    return p


def mark_head(module: nn.Module) -> nn.Module:
    """Mark module (and everything under it) as the classifier head; returns module."""
    module.__dict__["_fednet_head"] = True  # a plain attribute, as module.__setattr__ stores a bool
    return module


def _own_kind(module: nn.Module, leaf: str, p: nn.Parameter) -> str:
    """The tag of a parameter, else "norm" for normalisation layers, else "dense"."""
    kind = module.__dict__.get("_fednet_kinds", {}).get(leaf) or getattr(p, "_fednet_kind", None)
    if kind:
        return kind
    return "norm" if isinstance(module, _NORMS) else "dense"


def param_kinds(model: nn.Module, head: bool = True) -> dict[str, str]:
    """Name -> kind for every named parameter; head=False reports the head's own kinds instead of "head"."""
    modules = dict(model.named_modules())
    heads = {n for n, m in modules.items() if getattr(m, "_fednet_head", False)}
    out: dict[str, str] = {}
    for name, p in model.named_parameters():
        prefix, _, leaf = name.rpartition(".")
        parts = prefix.split(".") if prefix else []
        in_head = head and any(".".join(parts[:i]) in heads for i in range(len(parts) + 1))
        out[name] = "head" if in_head else _own_kind(modules[prefix], leaf, p)
    return out


def state_kinds(model: nn.Module, head: bool = True) -> dict[str, str]:
    """Name -> kind for every state_dict entry: parameters as param_kinds, buffers as "buffer"."""
    kinds = param_kinds(model, head)
    return {name: kinds.get(name, BUFFER) for name in model.state_dict()}


def names_of_kind(model: nn.Module, *kinds: str, head: bool = True) -> list[str]:
    """Parameter names (in model order) whose kind is one of kinds."""
    unknown = set(kinds) - set(KINDS) - {BUFFER}
    if unknown:
        raise ValueError(f"unknown parameter kinds {sorted(unknown)}; expected some of {KINDS}")
    return [n for n, k in state_kinds(model, head).items() if k in kinds]
