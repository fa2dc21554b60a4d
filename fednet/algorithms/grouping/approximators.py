"""Client approximators psi (docs/algorithms.md §4.3): confidence vectors and classifier weights (+ server-side PCA)."""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from fednet import opcount
from fednet.algorithms.grouping.names import APPROXIMATORS, MEASURES, PROBABILITY_ONLY
from fednet.errors import ConfigError
from fednet.training.flops import charge
from fednet.rng import generator

CLASSIFIER_PARTS = ("last", "last2", "all")
"""Accepted `which` values of classifier_vector (also with the "clf_" prefix)."""


def confidence_vector(model: nn.Module, ex_x: torch.Tensor, ex_y: torch.Tensor, num_classes: int,
                      batch_size: int = 256) -> np.ndarray:
    """q[c] = mean over class-c exemplars of softmax(f(x))[c], normalised to sum 1 (float64; 0 for absent classes)."""
    if ex_x.shape[0] == 0 or ex_x.shape[0] != ex_y.shape[0]:
        raise ValueError(f"confidence_vector needs matching non-empty exemplars, got {ex_x.shape[0]} x and "
                         f"{ex_y.shape[0]} y")
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    total = torch.zeros(num_classes, dtype=torch.float64)
    count = torch.zeros(num_classes, dtype=torch.float64)
    try:
        with torch.no_grad():
            for s in range(0, ex_x.shape[0], batch_size):
                x = ex_x[s:s + batch_size].to(device)
                y = ex_y[s:s + batch_size].to(device).long()
                charge(model, x, "eval")
                p = torch.softmax(model(x).double(), dim=1)
                true_p = p.gather(1, y.view(-1, 1)).view(-1).cpu()
                total.index_add_(0, y.cpu(), true_p)
                count.index_add_(0, y.cpu(), torch.ones_like(true_p))
    finally:
        model.train(was_training)
    q = torch.where(count > 0, total / count.clamp(min=1), torch.zeros_like(total)).numpy()
    return q / q.sum()


def _linears(model: nn.Module) -> list[nn.Linear]:
    """The model's Linear modules in registration order (fc1, fc2, fc3 for DigitsNet / FedSeqCNN)."""
    return [m for m in model.modules() if isinstance(m, nn.Linear)]


def vector_size(which: str, num_classes: int, linears: list[int]) -> int:
    """The length of the representation `which` makes (what the server expects of every client):
    one entry per class (confidence), or the sizes of the chosen Linear weights (`linears`: the
    model's, in registration order)."""
    if which == "confidence":
        return num_classes
    part = which.removeprefix("clf_")
    chosen = {"last": linears[-1:], "last2": linears[-2:], "all": linears}.get(part, [])
    return int(sum(chosen))


def classifier_vector(model: nn.Module, which: str) -> np.ndarray:
    """Flattened Linear weights (no biases): last = [W_L]; last2 = [W_L, W_{L-1}] (official order); all = [W_1..W_L]."""
    part = which.removeprefix("clf_")
    if part not in CLASSIFIER_PARTS:
        raise ConfigError(f"--param approximator=clf_{part} is not known; choose one of: {', '.join(APPROXIMATORS)}")
    layers = _linears(model)
    need = {"last": 1, "last2": 2, "all": 1}[part]
    if len(layers) < need:
        raise ConfigError(f"--param approximator=clf_{part} needs {need} Linear layer(s), the model has "
                          f"{len(layers)}; use --param approximator=confidence")
    chosen = {"last": layers[-1:], "last2": layers[-1:-3:-1], "all": layers}[part]
    return np.concatenate([m.weight.detach().cpu().double().numpy().ravel() for m in chosen])


PCA_FLOPS = 480
"""pca_reduce's work (the server's, at the setup stage: opcount's open count), FLOPs ("gemm")
per K d min(K, d) of its K x d representations: sklearn's full SVD and transform, measured at
the gemm rate of the same minutes (secagg/rates.py, 1.8e11-1.9e11/s) on K = 1500 x d = 100
(353, 833) and K = 800 x d = 400 (472, 482) (at 66bdfdc; not at run time)."""


def pca_reduce(reps: np.ndarray, variance: float = 0.9, seed: int = 0) -> np.ndarray:
    """PCA(n_components=variance, svd_solver="full") fitted on all clients jointly (variance 1 keeps all)."""
    from sklearn.decomposition import PCA

    reps = np.asarray(reps, dtype=np.float64)
    if not 0.0 < float(variance) <= 1.0:
        raise ConfigError(f"--param pca_variance={variance} must be in (0, 1], e.g. 0.9 (fraction of variance kept)")
    if reps.ndim != 2 or reps.shape[0] < 2:
        return reps.copy()  # nothing to fit on a single client
    state = int(generator(seed, "grouping/pca").integers(0, 2**31 - 1))
    n = float(variance) if float(variance) < 1.0 else None
    k, d = reps.shape
    opcount.charge({"gemm": float(PCA_FLOPS * k * d * min(k, d))})  # (the server's: setup)
    return PCA(n_components=n, svd_solver="full", random_state=state).fit_transform(reps)


def check_combination(approximator: str, measure: str) -> None:
    """ConfigError for unknown names or a probability-only measure (kl, gini) with a classifier approximator."""
    if approximator not in APPROXIMATORS:
        raise ConfigError(f"--param approximator={approximator} is not known; choose one of: "
                          f"{', '.join(APPROXIMATORS)}")
    if measure not in MEASURES:
        raise ConfigError(f"--param measure={measure} is not known; choose one of: {', '.join(MEASURES)}")
    if approximator != "confidence" and measure in PROBABILITY_ONLY:
        raise ConfigError(f"--param measure={measure} needs probability vectors and cannot be used with "
                          f"--param approximator={approximator}; use --param measure=cosine (or euclidean, "
                          f"wasserstein) or --param approximator=confidence")
