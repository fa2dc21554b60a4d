"""The models of the naturally federated datasets (docs/algorithms.md §1.5), as their papers use them.

- mclr: multinomial logistic regression, one linear layer (FedProx's model for Synthetic(alpha, beta)).
- femnist_cnn: LEAF's FEMNIST CNN: 5x5 conv 32 and 5x5 conv 64 ("same" padding, each ReLU and 2x2
  max-pool), fc 2048, 62 classes; 6,603,710 parameters.
- char_lstm: LEAF's Shakespeare model: embedding 8 of the 80 characters, a 2-layer LSTM of 256,
  a linear layer on the last step's output to the next character; 819,920 parameters.
- sent140_bow: logistic regression on a bag of hashed words (fednet's, cheap; LEAF's sent140
  models need GloVe embeddings): each word of the vocabulary has a weight per class, a tweet's
  logits are the sum over its words plus a bias; the weights start at zero.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from fednet.data.leaf import LETTERS, VOCAB
from fednet.models.param_kinds import mark_head


class LogisticRegression(nn.Module):
    """Multinomial logistic regression on the flattened input (mclr)."""

    def __init__(self, num_classes: int, input_shape: tuple[int, ...]) -> None:
        super().__init__()
        self.fc = mark_head(nn.Linear(math.prod(input_shape), num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(x, 1))


class FemnistCNN(nn.Module):
    """LEAF's FEMNIST CNN (femnist_cnn)."""

    def __init__(self, num_classes: int = 62, input_shape: tuple[int, ...] = (1, 28, 28)) -> None:
        super().__init__()
        c, h, w = input_shape
        self.conv1 = nn.Conv2d(c, 32, kernel_size=5, padding=2)
        self.conv2 = nn.Conv2d(32, 64, kernel_size=5, padding=2)
        self.pool = nn.MaxPool2d(2)
        self.fc1 = nn.Linear(64 * (h // 4) * (w // 4), 2048)
        self.fc2 = mark_head(nn.Linear(2048, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(torch.relu(self.conv1(x)))
        x = self.pool(torch.relu(self.conv2(x)))
        return self.fc2(torch.relu(self.fc1(torch.flatten(x, 1))))


class CharLSTM(nn.Module):
    """LEAF's Shakespeare next-character LSTM (char_lstm); input: N x 80 character indices."""

    def __init__(self, num_classes: int = 80, input_shape: tuple[int, ...] = (80,),
                 letters: int = len(LETTERS)) -> None:
        super().__init__()
        self.embed = nn.Embedding(letters, 8)
        self.lstm = nn.LSTM(8, 256, num_layers=2, batch_first=True)
        self.fc = mark_head(nn.Linear(256, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(self.embed(x.long()))
        return self.fc(out[:, -1])


class BagOfWords(nn.Module):
    """Logistic regression on hashed word counts (sent140_bow); input: N x words ids, 0 pads."""

    def __init__(self, num_classes: int = 2, input_shape: tuple[int, ...] = (25,),
                 vocab: int = VOCAB) -> None:
        super().__init__()
        self.words = nn.Embedding(vocab, num_classes, padding_idx=0)
        nn.init.zeros_(self.words.weight)  # a convex model: start from zero logits
        self.bias = nn.Parameter(torch.zeros(num_classes))
        mark_head(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.words(x.long()).sum(1) + self.bias
