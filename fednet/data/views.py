"""Rows: an index view of a shared image tensor, gathered batch by batch (never copied whole).

A client's training images (ClientContext.x) and test images (test_x) are Rows of the run's
shared arrays: `rows[k]` (an int, a slice, or an index tensor/array) gathers base[index[k]] and
moves it to the view's device, which is what the training and evaluation loops do with a tensor;
the values are the same, bit for bit, as indexing the client's gathered copy. Any other torch
operation on a Rows (e.g. model(ctx.x)) receives the gathered tensor (__torch_function__).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch


class Rows:
    """base[index] on `device`, gathered on access; base and index stay where they are."""

    def __init__(self, base: torch.Tensor, index: np.ndarray | torch.Tensor,
                 device: torch.device | str | None = None) -> None:
        self.base = base
        if isinstance(index, np.ndarray) and not index.flags.writeable:
            index = index.copy()  # e.g. received from the wire: a few bytes per row
        self.index = torch.as_tensor(index, dtype=torch.int64)
        self.device = torch.device(device) if device is not None else base.device

    @classmethod
    def of(cls, array: np.ndarray, index: np.ndarray, device: torch.device | str) -> Rows:
        """A view of a numpy array's rows (the tensor shares the array's memory)."""
        return cls(torch.from_numpy(array), index, device)

    def __len__(self) -> int:
        return int(self.index.shape[0])

    @property
    def shape(self) -> torch.Size:
        return torch.Size((len(self), *self.base.shape[1:]))

    @property
    def dtype(self) -> torch.dtype:
        return self.base.dtype

    def size(self, dim: int | None = None) -> Any:
        """Like torch.Tensor.size."""
        return self.shape if dim is None else self.shape[dim]

    def __getitem__(self, key: Any) -> torch.Tensor:
        if isinstance(key, torch.Tensor):
            key = key.to(self.index.device)
            if key.dtype == torch.int64 and key.dim() == 1:  # a batch: index_select is the same
                # gather as indexing, at half its cost (torch's indexing parses its key in Python)
                return self.base.index_select(0, self.index.index_select(0, key)).to(self.device)
        elif isinstance(key, np.ndarray):
            key = torch.from_numpy(key)
        return self.base[self.index[key]].to(self.device)

    def materialize(self) -> torch.Tensor:
        """The gathered rows as one new tensor on the view's device."""
        return self.base[self.index].to(self.device)

    def to(self, device: torch.device | str) -> Rows:
        """The same rows delivered on another device (nothing moves until a gather)."""
        return Rows(self.base, self.index, device)

    def subset(self, key: Any) -> Rows:
        """A view of some of these rows (still no copy of an image)."""
        if isinstance(key, np.ndarray):
            key = torch.from_numpy(key)
        return Rows(self.base, self.index[key], self.device)

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
        def real(a: Any) -> Any:
            if isinstance(a, Rows):
                return a.materialize()
            if isinstance(a, (list, tuple)):
                return type(a)(real(b) for b in a)
            return a
        return func(*real(args), **{k: real(v) for k, v in (kwargs or {}).items()})


Examples = torch.Tensor | Rows
"""A client's inputs: a tensor, or an index view of the shared images gathered on access."""


def gathered(x: Examples) -> torch.Tensor:
    """x as one tensor (a Rows view gathered, as a torch function receives it)."""
    return x.materialize() if isinstance(x, Rows) else x
