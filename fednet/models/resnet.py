"""Factorized-FL's ResNet-9 backbone (docs/algorithms.md §1.2) and a 32x32 ResNet-18 (§1.4;
torchvision, imported lazily)."""
from __future__ import annotations

import torch
from torch import nn


def conv_bn(c_in: int, c_out: int, kernel: int = 3, stride: int = 1, padding: int = 1) -> nn.Sequential:
    """Conv (no bias) -> BatchNorm2d -> ReLU."""
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, kernel_size=kernel, stride=stride, padding=padding, bias=False),
        nn.BatchNorm2d(c_out),
        nn.ReLU(inplace=True),
    )


class Residual(nn.Module):
    """x + f(x)."""

    def __init__(self, *layers: nn.Module) -> None:
        super().__init__()
        self.res = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x plus the residual branch."""
        return x + self.res(x)


class ResNet9(nn.Module):
    """1.2: encoder (9 modules, 256-d feature) + head Linear(256, n_cls).

    2,571,338 trainable params for 10 classes; 2,574,282 float state values with BN running mean/var
    (the paper's "2.574M"), plus 8 int64 num_batches_tracked scalars.
    """

    feature_dim = 256

    def __init__(self, num_classes: int = 10, input_shape: tuple[int, ...] = (3, 32, 32)) -> None:
        super().__init__()
        c = input_shape[0]
        self.encoder = nn.Sequential(
            conv_bn(c, 64),                                            # 0: 64 x 32 x 32
            conv_bn(64, 128, kernel=5, stride=2, padding=2),           # 1: 128 x 16 x 16
            Residual(conv_bn(128, 128), conv_bn(128, 128)),            # 2
            conv_bn(128, 256),                                         # 3: 256 x 16 x 16
            nn.MaxPool2d(2),                                           # 4: 256 x 8 x 8
            Residual(conv_bn(256, 256), conv_bn(256, 256)),            # 5
            conv_bn(256, 256, padding=0),                              # 6: 256 x 6 x 6
            nn.AdaptiveMaxPool2d(1),                                   # 7
            nn.Flatten(),                                              # 8: 256
        )
        self.head = nn.Linear(self.feature_dim, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """The 256-d encoder output."""
        return self.encoder(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of shape (B, num_classes)."""
        return self.head(self.encoder(x))


def resnet18(num_classes: int = 10, input_shape: tuple[int, ...] = (3, 32, 32)) -> nn.Module:
    """torchvision's ResNet-18 with the usual 32x32 stem: 3x3 stride-1 conv1, no max-pool (11,173,962 params)."""
    from torchvision.models import resnet18 as tv_resnet18  # lazy: torchvision costs seconds of import

    net = tv_resnet18(weights=None, num_classes=num_classes)
    net.conv1 = nn.Conv2d(input_shape[0], 64, kernel_size=3, stride=1, padding=1, bias=False)
    net.maxpool = nn.Identity()
    return net
