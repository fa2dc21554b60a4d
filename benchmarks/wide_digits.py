"""A plugin model for benchmarks (--plugin benchmarks/wide_digits.py --model digits_wide): the
digits CNN (docs/algorithms.md §1.3) with a 4096-wide first classifier layer, 664,618
parameters (2.7 MB a copy) instead of 15,466, so that moving the model costs real link time
while a client's compute (14-15 digits) stays small."""
from __future__ import annotations

from torch import nn

from fednet.models.convfc import ConvFC
from fednet.models.nets import register_model

WIDTH = 4096


class WideDigitsNet(ConvFC):
    """conv 16, conv 32 (3x3, pooled), fc 128 -> 4096 -> 32 -> classes."""

    def __init__(self, num_classes: int = 10, input_shape: tuple[int, int, int] = (1, 8, 8)) -> None:
        super().__init__()
        c, h, w = input_shape
        self.conv1 = nn.Conv2d(c, 16, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, kernel_size=3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.fc1 = nn.Linear(32 * (h // 4) * (w // 4), WIDTH)
        self.fc2 = nn.Linear(WIDTH, 32)
        self.fc3 = nn.Linear(32, num_classes)


register_model("digits_wide", lambda k, shape: WideDigitsNet(k, shape))
