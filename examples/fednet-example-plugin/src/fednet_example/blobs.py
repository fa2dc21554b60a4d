"""blobs: 10 Gaussian clusters in 16 dimensions (as 1 x 4 x 4 images), 2,000 train and 500 test
points, drawn from fednet's seeded streams (the same data on every host and in every process)."""
import numpy as np

from fednet.api import Dataset, generator


def load_blobs(data_root, download, split_seed):
    """What `--dataset blobs` loads (the arguments are fednet's; blobs needs no files)."""
    g = generator(split_seed, "blobs")
    centers = g.normal(0.0, 0.5, size=(10, 16))
    y = g.integers(0, 10, size=2500)
    x = (centers[y] + g.normal(0.0, 1.0, size=(2500, 16))).astype(np.float32).reshape(-1, 1, 4, 4)
    return Dataset("blobs", x[:2000], y[:2000], x[2000:], y[2000:], num_classes=10,
                   input_shape=(1, 4, 4), class_names=tuple(str(i) for i in range(10)))


load_blobs.default_model = "tiny_mlp"  # what --model auto builds for blobs
