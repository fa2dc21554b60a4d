"""pFedPara layers and digits model (docs/algorithms.md §3.7): W = W_global * (W_local + 1),
low-rank Hadamard factors."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from fednet.models.convfc import ConvFC
from fednet.models.param_kinds import mark_head, tag

GAIN = math.sqrt(2.0)
"""nn.init.calculate_gain("relu")."""


def fedpara_rank(out_c: int, in_c: int, k: int = 1, gamma: float = 0.1) -> int:
    """3.7: the smallest r with both factor pairs using about gamma of the weights and r^2 >= max(O, I)."""
    o, i = int(out_c), int(in_c)
    ratio = math.sqrt((o + i) ** 2 / (4 * k ** 4) + gamma * o * i * k ** 2 / (2 * k ** 2)) - (o + i) / (2 * k ** 2)
    return max(math.ceil(math.sqrt(o)), math.ceil(math.sqrt(i)), math.ceil(ratio))


def _normal(shape: tuple[int, ...], fan: int) -> nn.Parameter:
    """A factor ~ Normal(0, gain_relu / sqrt(fan))."""
    return nn.Parameter(torch.randn(shape) * (GAIN / math.sqrt(fan)))


def _bias(module: nn.Module, out: int, fan_in: int, bias: bool) -> None:
    """torch's default layer bias, U(+-1/sqrt(fan_in)), tagged "dense" (or None)."""
    if not bias:
        module.register_parameter("bias", None)
        return
    bound = 1.0 / math.sqrt(fan_in)
    module.bias = nn.Parameter(torch.empty(out).uniform_(-bound, bound))
    tag(module, "bias", "dense")


class FedParaLinear(nn.Module):
    """W (O x I) = (X1 Y1^T) * (X2 Y2^T + 1), X (O x r), Y (I x r); 1 = global (shared), 2 = local (kept)."""

    x1: nn.Parameter  # registered by setattr in __init__ (named here for the type checker)
    y1: nn.Parameter
    x2: nn.Parameter
    y2: nn.Parameter
    bias: nn.Parameter | None

    def __init__(self, in_f: int, out_f: int, gamma: float = 0.1, bias: bool = True, *,
                 rank: int | None = None) -> None:
        super().__init__()
        self.in_features, self.out_features = int(in_f), int(out_f)
        self.rank = int(rank) if rank else fedpara_rank(self.out_features, self.in_features, 1, gamma)
        o, i, r = self.out_features, self.in_features, self.rank
        for s, kind in (("1", "global"), ("2", "local")):
            setattr(self, "x" + s, _normal((o, r), o))  # fan as in the r x O layout of the official code
            setattr(self, "y" + s, _normal((i, r), i))
            tag(self, "x" + s, kind)
            tag(self, "y" + s, kind)
        _bias(self, o, i, bias)

    def composed_weight(self) -> torch.Tensor:
        """W of shape (O, I)."""
        return (self.x1 @ self.y1.t()) * (self.x2 @ self.y2.t() + 1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x W^T + bias."""
        return F.linear(x, self.composed_weight(), self.bias)

    def extra_repr(self) -> str:
        """Shown by print(module)."""
        return f"{self.in_features}, {self.out_features}, rank={self.rank}"


class FedParaConv2d(nn.Module):
    """W = (T1 x1 X1 x2 Y1) * (T2 x1 X2 x2 Y2 + 1), T (r x r x k x k), X (r x O), Y (r x I)."""

    t1: nn.Parameter  # registered by setattr in __init__ (named here for the type checker)
    x1: nn.Parameter
    y1: nn.Parameter
    t2: nn.Parameter
    x2: nn.Parameter
    y2: nn.Parameter
    bias: nn.Parameter | None

    def __init__(self, in_c: int, out_c: int, k: int, stride: int = 1, padding: int = 0, gamma: float = 0.1,
                 bias: bool = True, *, rank: int | None = None) -> None:
        super().__init__()
        self.in_channels, self.out_channels, self.kernel_size = int(in_c), int(out_c), int(k)
        self.stride, self.padding = int(stride), int(padding)
        o, i, k = self.out_channels, self.in_channels, self.kernel_size
        self.rank = r = int(rank) if rank else fedpara_rank(o, i, k, gamma)
        for s, kind in (("1", "global"), ("2", "local")):
            setattr(self, "t" + s, _normal((r, r, k, k), r * k * k))  # torch's fan_in of each factor
            setattr(self, "x" + s, _normal((r, o), o))
            setattr(self, "y" + s, _normal((r, i), i))
            for name in ("t", "x", "y"):
                tag(self, name + s, kind)
        _bias(self, o, i * k * k, bias)

    @staticmethod
    def _tucker(t: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """W[o,i,a,b] = sum_{p,q} T[p,q,a,b] X[p,o] Y[q,i], contracted left to right whether or
        not the opt_einsum package is installed (torch would let it choose another order, and
        other last bits: installing it, e.g. with Opacus, changed pFedPara's golden numbers)."""
        ein = torch.backends.opt_einsum
        was = ein.enabled
        ein.enabled = False
        try:
            return torch.einsum("pqab,po,qi->oiab", t, x, y)
        finally:
            ein.enabled = was

    def composed_weight(self) -> torch.Tensor:
        """W of shape (O, I, k, k)."""
        return self._tucker(self.t1, self.x1, self.y1) * (self._tucker(self.t2, self.x2, self.y2) + 1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """conv2d(x, W) + bias."""
        return F.conv2d(x, self.composed_weight(), self.bias, self.stride, self.padding)

    def extra_repr(self) -> str:
        """Shown by print(module)."""
        return (f"{self.in_channels}, {self.out_channels}, k={self.kernel_size}, stride={self.stride}, "
                f"padding={self.padding}, rank={self.rank}")


class PFedParaDigitsNet(ConvFC):
    """1.3 DigitsNet with every conv / fc layer a pFedPara layer; fc3 is the head (kind "head")."""

    def __init__(self, num_classes: int = 10, gamma: float = 0.1,
                 input_shape: tuple[int, ...] = (1, 8, 8)) -> None:
        super().__init__()
        c, h, w = input_shape
        self.conv1 = FedParaConv2d(c, 16, 3, padding=1, gamma=gamma)
        self.conv2 = FedParaConv2d(16, 32, 3, padding=1, gamma=gamma)
        self.pool = nn.MaxPool2d(2)
        self.fc1 = FedParaLinear(32 * (h // 4) * (w // 4), 64, gamma)
        self.fc2 = FedParaLinear(64, 32, gamma)
        self.fc3 = mark_head(FedParaLinear(32, num_classes, gamma))
