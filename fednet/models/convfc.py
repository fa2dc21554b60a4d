"""The shared shape of the small CNNs: conv1, conv2 (each ReLU + pool), then fc1, fc2, fc3."""
from __future__ import annotations

import torch
from torch import nn


class ConvFC(nn.Module):
    """Forward pass of a 2-conv / 3-FC network; subclasses create conv1, conv2, pool, fc1-fc3."""

    conv1: nn.Module
    conv2: nn.Module
    pool: nn.Module
    fc1: nn.Module
    fc2: nn.Module
    fc3: nn.Module

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """The flattened conv2 output."""
        x = self.pool(torch.relu(self.conv1(x)))
        x = self.pool(torch.relu(self.conv2(x)))
        return torch.flatten(x, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of shape (B, num_classes)."""
        x = torch.relu(self.fc1(self.features(x)))
        x = torch.relu(self.fc2(x))
        return self.fc3(x)
