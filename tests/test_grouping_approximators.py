"""Tests of FedSeq approximators (docs/algorithms.md §4.3): confidence vectors, classifier weights,
PCA, combinations."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from fednet.algorithms.grouping import (
    APPROXIMATORS, check_combination, classifier_vector, confidence_vector, pca_reduce,
)
from fednet.errors import ConfigError
from fednet.models import build_model


def _identity_model() -> nn.Module:
    """A Linear model whose logits are its inputs."""
    m = nn.Linear(3, 3, bias=True)
    with torch.no_grad():
        m.weight.copy_(torch.eye(3))
        m.bias.zero_()
    return m


def test_confidence_vector_is_the_normalised_mean_true_class_probability():
    probs = [[0.5, 0.25, 0.25], [0.7, 0.2, 0.1],   # class 0: mean p[0] = 0.6
             [0.1, 0.8, 0.1],                       # class 1: 0.8
             [0.3, 0.3, 0.4], [0.2, 0.2, 0.6]]      # class 2: 0.5
    x = torch.log(torch.tensor(probs, dtype=torch.float32))
    y = torch.tensor([0, 0, 1, 2, 2])
    model = _identity_model().train()
    q = confidence_vector(model, x, y, 3)
    assert q.dtype == np.float64
    assert q == pytest.approx(np.array([0.6, 0.8, 0.5]) / 1.9, rel=1e-6)
    assert q.sum() == pytest.approx(1.0)
    assert model.training  # mode restored
    assert confidence_vector(model, x, y, 3, batch_size=2) == pytest.approx(q, rel=1e-9)


def test_confidence_vector_gives_zero_to_classes_without_exemplars():
    x = torch.log(torch.tensor([[0.5, 0.25, 0.25]]))
    q = confidence_vector(_identity_model(), x, torch.tensor([0]), 3)
    assert q == pytest.approx([1.0, 0.0, 0.0])


def _digits():
    return build_model("digits_cnn", 10, (1, 8, 8), seed=0)


def test_classifier_vector_shapes_and_order_on_digits_net():
    net = _digits()
    w = {n: getattr(net, n).weight.detach().double().numpy().ravel() for n in ("fc1", "fc2", "fc3")}
    assert [v.size for v in w.values()] == [128 * 64, 64 * 32, 32 * 10]
    last = classifier_vector(net, "last")
    assert last.dtype == np.float64 and np.array_equal(last, w["fc3"])
    assert np.array_equal(classifier_vector(net, "last2"), np.concatenate([w["fc3"], w["fc2"]]))  # official order
    assert np.array_equal(classifier_vector(net, "all"), np.concatenate([w["fc1"], w["fc2"], w["fc3"]]))
    assert np.array_equal(classifier_vector(net, "clf_all"), classifier_vector(net, "all"))
    with pytest.raises(ConfigError, match=r"--param approximator=clf_first"):
        classifier_vector(net, "first")
    with pytest.raises(ConfigError, match=r"approximator=confidence"):
        classifier_vector(nn.Sequential(nn.Linear(2, 2)), "last2")


def test_pca_keeps_at_least_90_percent_of_the_variance_with_the_fewest_components():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 5)) @ rng.normal(size=(5, 300)) + 0.05 * rng.normal(size=(40, 300))
    z = pca_reduce(x, 0.9, seed=3)
    total = x.var(axis=0).sum()
    kept = np.sort(z.var(axis=0))[::-1]
    assert z.shape[0] == 40 and z.shape[1] < 300
    assert kept.sum() / total >= 0.9
    assert kept[:-1].sum() / total < 0.9  # one component fewer would not be enough
    assert np.array_equal(pca_reduce(x, 0.9, seed=3), z)
    assert pca_reduce(x, 1.0).shape[1] == 40
    with pytest.raises(ConfigError, match=r"--param pca_variance=1.5"):
        pca_reduce(x, 1.5)


def test_check_combination():
    assert APPROXIMATORS == ("confidence", "clf_last", "clf_last2", "clf_all")
    for m in ("kl", "gini", "cosine", "euclidean", "wasserstein"):
        check_combination("confidence", m)
    for a in APPROXIMATORS[1:]:
        for m in ("cosine", "euclidean", "wasserstein"):
            check_combination(a, m)
        for m in ("kl", "gini"):
            with pytest.raises(ConfigError, match=rf"--param measure={m}.*--param approximator={a}"):
                check_combination(a, m)
    with pytest.raises(ConfigError, match=r"--param approximator=weights"):
        check_combination("weights", "cosine")
    with pytest.raises(ConfigError, match=r"--param measure=kullback"):
        check_combination("confidence", "kullback")
