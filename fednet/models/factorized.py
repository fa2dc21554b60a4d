"""Factorized-FL layers and models (docs/algorithms.md §5.1, §5.2, §1.2, §1.3): W = u v + prune(mu),
kinds u / v / mu."""
from __future__ import annotations

from typing import NotRequired, TypedDict

import torch
import torch.nn.functional as F
from torch import nn

from fednet.models.param_kinds import mark_head, tag
from fednet.models.resnet import Residual

LAMBDA = 5e-4
"""Default lambda_sparsity: the L1 weight on mu and the eval-time pruning threshold."""

PI_MODES = ("semantic", "raw_reshape")
MU_INITS = ("zeros", "xavier")


def _pruned(mu: torch.Tensor, threshold: float, training: bool) -> torch.Tensor:
    """mu as is while training; in eval mode entries with |mu| < threshold are zeroed."""
    return mu if training else mu.masked_fill(mu.abs() < threshold, 0.0)


class _Factorized(nn.Module):
    """Shared parts: u (rows x r), v (r x cols), optional mu (rows x cols), pruning threshold."""

    def _factors(self, rows: int, cols: int, rank: int, mu: bool, mu_init: str, threshold: float) -> None:
        """Create and tag u, v (Xavier-uniform) and mu (zeros, or Xavier-uniform), set rank and threshold."""
        if rank < 1:
            raise ValueError(f"rank must be >= 1, got {rank}")
        if mu_init not in MU_INITS:
            raise ValueError(f"mu_init must be one of {MU_INITS}, got {mu_init!r}")
        self.rank, self.threshold = int(rank), float(threshold)
        self.u = nn.Parameter(nn.init.xavier_uniform_(torch.empty(rows, rank)))
        self.v = nn.Parameter(nn.init.xavier_uniform_(torch.empty(rank, cols)))
        tag(self, "u", "u")
        tag(self, "v", "v")
        if mu:
            self.mu = nn.Parameter(torch.zeros(rows, cols))
            if mu_init == "xavier":
                nn.init.xavier_uniform_(self.mu)
            tag(self, "mu", "mu")
        else:
            self.register_parameter("mu", None)

    def matrix(self) -> torch.Tensor:
        """u v + prune(mu) (prune only in eval mode)."""
        m = self.u @ self.v
        return m if self.mu is None else m + _pruned(self.mu, self.threshold, self.training)


class FactorizedLinear(_Factorized):
    """Dense layer y = x W + bias with W = u v + prune(mu): u (I x r), v (r x O), mu (I x O)."""

    def __init__(self, in_f: int, out_f: int, rank: int = 1, mu: bool = True, bias: bool = True,
                 *, mu_init: str = "zeros", threshold: float = LAMBDA) -> None:
        super().__init__()
        self.in_features, self.out_features = int(in_f), int(out_f)
        self._factors(self.in_features, self.out_features, rank, mu, mu_init, threshold)
        if bias:
            self.bias = nn.Parameter(torch.empty(self.out_features))
            nn.init.xavier_uniform_(self.bias.data.unsqueeze(0))  # bound sqrt(6 / (1 + O)), as the code
            tag(self, "bias", "dense")
        else:
            self.register_parameter("bias", None)

    def composed_weight(self) -> torch.Tensor:
        """W as an I x O matrix (y = x W + bias)."""
        return self.matrix()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x W + bias."""
        return F.linear(x, self.matrix().t(), self.bias)

    def extra_repr(self) -> str:
        """Shown by print(module)."""
        return f"{self.in_features}, {self.out_features}, rank={self.rank}, mu={self.mu is not None}"


class FactorizedConv2d(_Factorized):
    """Conv with M = u v + prune(mu): u (F^2 x r) base filter, v (r x I*O), mu (F^2 x I*O); W = pi(M)."""

    def __init__(self, in_c: int, out_c: int, k: int, stride: int = 1, padding: int = 0, rank: int = 1,
                 mu: bool = True, pi: str = "semantic", *, bias: bool = False, threshold: float = LAMBDA) -> None:
        super().__init__()
        if pi not in PI_MODES:
            raise ValueError(f"pi must be one of {PI_MODES}, got {pi!r}")
        self.in_channels, self.out_channels, self.kernel_size = int(in_c), int(out_c), int(k)
        self.stride, self.padding, self.pi = int(stride), int(padding), pi
        self._factors(self.kernel_size ** 2, self.in_channels * self.out_channels, rank, mu, "zeros", threshold)
        if bias:
            self.bias = nn.Parameter(torch.empty(self.out_channels))
            nn.init.xavier_uniform_(self.bias.data.unsqueeze(0))
            tag(self, "bias", "dense")
        else:
            self.register_parameter("bias", None)

    def composed_weight(self) -> torch.Tensor:
        """W of shape (O, I, F, F): semantic W[o,i,a,b] = M[a*F+b, o*I+i]; raw_reshape = reshape(M, [O, I, F, F])."""
        m, shape = self.matrix(), (self.out_channels, self.in_channels, self.kernel_size, self.kernel_size)
        return m.t().reshape(shape) if self.pi == "semantic" else m.reshape(shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """conv2d(x, W) (+ bias)."""
        return F.conv2d(x, self.composed_weight(), self.bias, self.stride, self.padding)

    def extra_repr(self) -> str:
        """Shown by print(module)."""
        return (f"{self.in_channels}, {self.out_channels}, k={self.kernel_size}, stride={self.stride}, "
                f"padding={self.padding}, rank={self.rank}, mu={self.mu is not None}, pi={self.pi}")


def factorized_layers(model: nn.Module) -> list[tuple[str, _Factorized]]:
    """(name, layer) of every factorized layer, in module order."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, _Factorized)]


def l1_penalty(model: nn.Module, detach: bool = False) -> torch.Tensor:
    """Sum of ||mu||_1 over factorized layers (head included); detach=True mimics the code (no gradient)."""
    terms = [m.mu.detach().abs().sum() if detach else m.mu.abs().sum()
             for _, m in factorized_layers(model) if m.mu is not None]
    if not terms:
        p = next(model.parameters(), None)
        return torch.zeros((), device=None if p is None else p.device)
    return torch.stack(terms).sum()


def nnz_mu(model: nn.Module, threshold: float | None = None) -> int:
    """Number of mu entries with |mu| >= threshold (default: each layer's own) - what survives eval pruning."""
    return sum(int((m.mu.detach().abs() >= (m.threshold if threshold is None else threshold)).sum())
               for _, m in factorized_layers(model) if m.mu is not None)


def set_threshold(model: nn.Module, threshold: float) -> None:
    """Set the eval-time pruning threshold of every factorized layer."""
    for _, m in factorized_layers(model):
        m.threshold = float(threshold)


def matching_layer(model: nn.Module) -> str:
    """Name of the v used for similarity matching: model.matching_param, else the last non-head factorized layer's v."""
    name = getattr(model, "matching_param", None)
    if name:
        return name
    heads = [n for n, m in model.named_modules() if getattr(m, "_fednet_head", False)]
    body = [n for n, _ in factorized_layers(model)
            if not any(n == h or n.startswith(h + ".") or h == "" for h in heads)]
    if not body:
        raise ValueError(f"{type(model).__name__} has no factorized layer outside the head")
    return f"{body[-1]}.v"


class _ConvOptions(TypedDict):
    """The keyword options a model passes to each FactorizedConv2d."""

    rank: int
    mu: bool
    pi: str
    threshold: float
    bias: NotRequired[bool]


class _DenseOptions(TypedDict):
    """The keyword options a model passes to each FactorizedLinear."""

    rank: int
    mu: bool
    mu_init: str
    threshold: float


class FactorizedDigitsNet(nn.Module):
    """1.3 DigitsNet with factorized conv1, conv2, fc1, fc2 and a factorized head fc3 (kind "head")."""

    def __init__(self, num_classes: int = 10, bn: bool = False, input_shape: tuple[int, ...] = (1, 8, 8), *,
                 rank: int = 1, mu: bool = True, mu_init: str = "zeros", pi: str = "semantic",
                 threshold: float = LAMBDA, matching: str = "fc2") -> None:
        super().__init__()
        if matching not in ("fc2", "conv2"):
            raise ValueError(f"matching must be 'fc2' or 'conv2', got {matching!r}")
        c, h, w = input_shape
        conv = _ConvOptions(rank=rank, mu=mu, pi=pi, bias=not bn, threshold=threshold)
        dense = _DenseOptions(rank=rank, mu=mu, mu_init=mu_init, threshold=threshold)
        self.conv1 = FactorizedConv2d(c, 16, 3, padding=1, **conv)
        self.bn1 = nn.BatchNorm2d(16) if bn else nn.Identity()
        self.conv2 = FactorizedConv2d(16, 32, 3, padding=1, **conv)
        self.bn2 = nn.BatchNorm2d(32) if bn else nn.Identity()
        self.pool = nn.MaxPool2d(2)
        self.fc1 = FactorizedLinear(32 * (h // 4) * (w // 4), 64, **dense)
        self.fc2 = FactorizedLinear(64, 32, **dense)
        self.fc3 = mark_head(FactorizedLinear(32, num_classes, **dense))
        self.matching_param = f"{matching}.v"

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """The flattened conv2 output (128 values for 8x8 inputs)."""
        x = self.pool(torch.relu(self.bn1(self.conv1(x))))
        x = self.pool(torch.relu(self.bn2(self.conv2(x))))
        return torch.flatten(x, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of shape (B, num_classes)."""
        x = torch.relu(self.fc1(self.features(x)))
        x = torch.relu(self.fc2(x))
        return self.fc3(x)


class FactorizedResNet9(nn.Module):
    """1.2 ResNet-9 with factorized convs (BN kept dense) and a factorized head 256 -> n_cls (kind "head")."""

    feature_dim = 256

    def __init__(self, num_classes: int = 10, input_shape: tuple[int, ...] = (3, 32, 32), *,
                 rank: int = 1, mu: bool = True, mu_init: str = "zeros", pi: str = "semantic",
                 threshold: float = LAMBDA) -> None:
        super().__init__()
        kw = _ConvOptions(rank=rank, mu=mu, pi=pi, threshold=threshold)

        def conv_bn(c_in: int, c_out: int, k: int = 3, stride: int = 1, padding: int = 1) -> nn.Sequential:
            """Factorized conv (no bias) -> BatchNorm2d -> ReLU."""
            return nn.Sequential(FactorizedConv2d(c_in, c_out, k, stride, padding, **kw),
                                 nn.BatchNorm2d(c_out), nn.ReLU(inplace=True))

        self.encoder = nn.Sequential(
            conv_bn(input_shape[0], 64),                     # 0: 64 x 32 x 32
            conv_bn(64, 128, k=5, stride=2, padding=2),      # 1: 128 x 16 x 16
            Residual(conv_bn(128, 128), conv_bn(128, 128)),  # 2
            conv_bn(128, 256),                               # 3: 256 x 16 x 16
            nn.MaxPool2d(2),                                 # 4: 256 x 8 x 8
            Residual(conv_bn(256, 256), conv_bn(256, 256)),  # 5
            conv_bn(256, 256, padding=0),                    # 6: 256 x 6 x 6 (its v: the matching vector)
            nn.AdaptiveMaxPool2d(1),                         # 7
            nn.Flatten(),                                    # 8: 256
        )
        self.head = mark_head(FactorizedLinear(self.feature_dim, num_classes, rank=rank, mu=mu,
                                               mu_init=mu_init, threshold=threshold))
        self.matching_param = "encoder.6.0.v"

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """The 256-d encoder output."""
        return self.encoder(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of shape (B, num_classes)."""
        return self.head(self.encoder(x))
