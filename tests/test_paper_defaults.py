"""Defaults that are the papers' (issue 55 item 4; docs/algorithms.md §0.5 lists the others)."""
from __future__ import annotations

import torch

from fednet.algorithms.catalog import FactorizedParams, FedSeqParams, StandAloneParams
from fednet.models.factorized import factorized_layers
from fednet.models.nets import build_model


def test_fedseq_pretrains_for_the_papers_ten_epochs():
    assert FedSeqParams().pretrain_epochs == 10  # the paper's chosen e and its code's


def test_factorized_fl_and_stand_alone_keep_their_defaults():
    assert FactorizedParams().lambda_sparsity == 5e-4 and FactorizedParams().clip == 5.0
    assert StandAloneParams().clip == 0.0  # clipping is in no paper's Stand-Alone


def test_the_code_init_variant_differs_only_in_the_dense_mu():
    paper = build_model("factorized_digits", 10, (1, 8, 8), seed=0)
    code = build_model("factorized_digits_xavier", 10, (1, 8, 8), seed=0)
    for (name, a), (_, b) in zip(factorized_layers(paper), factorized_layers(code)):
        dense = name.startswith("fc")
        assert not torch.count_nonzero(a.mu)  # the paper: zeros everywhere
        assert bool(torch.count_nonzero(b.mu)) == dense, name  # the code: Xavier on dense mu
