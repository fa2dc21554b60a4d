"""tiny_mlp: flatten, one hidden layer of 32 units, the classes (any input shape)."""
from torch import nn


def tiny_mlp(num_classes, input_shape):
    """What `--model tiny_mlp` builds (fednet seeds torch's RNG before calling it)."""
    c, h, w = input_shape
    return nn.Sequential(nn.Flatten(), nn.Linear(c * h * w, 32), nn.ReLU(),
                         nn.Linear(32, num_classes))
