"""DP-SGD inside a client through Opacus (docs/algorithms.md §11.4): one step worked out by hand
from per-example gradients, the batches and the noise from the run's seeded streams, a model
Opacus cannot handle refused in one line, and a client's per-example epsilon in the rows."""
from __future__ import annotations

import json

import pytest
import torch
from torch import nn

pytest.importorskip("opacus")
pytest.importorskip("dp_accounting")

from fednet.errors import ConfigError  # noqa: E402
from fednet.privacy.accountant import Accountant  # noqa: E402
from fednet.privacy.plan import sgd_steps  # noqa: E402
from fednet.training.dpsgd import check_model, train_private  # noqa: E402
from fednet.training.optim import OptimSpec  # noqa: E402
from tests.conftest import small_config  # noqa: E402


def _toy() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    x = torch.tensor([[1.0, 0.0, 2.0], [0.5, -1.0, 0.0], [3.0, 1.0, 1.0], [0.0, 0.0, -2.0]])
    return model, x, torch.tensor([0, 1, 1, 0])


def test_one_dpsgd_step_by_hand():
    """n = 4, B = 4: q = 1 (every example), one step. Each example's gradient clipped to C,
    summed, N(0, (zC)^2) from the noise generator added, divided by q n = 4, lr 0.5."""
    model, x, y = _toy()
    start = {k: v.detach().clone() for k, v in model.named_parameters()}
    per = []
    for i in range(4):  # per-example gradients by plain autograd
        model.zero_grad()
        nn.functional.cross_entropy(model(x[i:i + 1]), y[i:i + 1]).backward()
        per.append([p.grad.detach().clone() for p in model.parameters()])
    model.zero_grad()
    clipped = []
    for g in per:
        norm = torch.sqrt(sum((t ** 2).sum() for t in g))
        f = min(1.0, float(0.5 / (norm + 1e-6)))  # Opacus's factor: C / (norm + 1e-6), at most 1
        clipped.append([t * f for t in g])
    noise_gen = torch.Generator().manual_seed(11)
    noise = [torch.normal(0, 1.3 * 0.5, size=p.shape, generator=noise_gen)
             for p in model.parameters()]
    want = {name: start[name] - 0.5 * (sum(c[i] for c in clipped) + noise[i]) / 4
            for i, name in enumerate(start)}
    stats = train_private(model, x, y, epochs=1, batch_size=4, spec=OptimSpec(lr=0.5, weight_decay=0.0),
                          generator=torch.Generator().manual_seed(1),
                          noise_generator=torch.Generator().manual_seed(11), noise=1.3, clip=0.5)
    assert stats.samples == 4 and stats.steps == 1
    for name, p in model.named_parameters():
        assert torch.allclose(p.detach(), want[name], atol=1e-6), name
    assert not hasattr(model.weight, "grad_sample")  # Opacus's hooks and attributes are gone


def test_batches_are_poisson_samples_and_the_run_is_seeded():
    outs = []
    for _ in range(2):
        model, x, y = _toy()
        s = train_private(model, x, y, epochs=3, batch_size=2, spec=OptimSpec(lr=0.1),
                          generator=torch.Generator().manual_seed(4),
                          noise_generator=torch.Generator().manual_seed(5), noise=1.0, clip=1.0)
        outs.append((s.samples, model.weight.detach().numpy().tobytes()))
    assert outs[0] == outs[1]
    assert sgd_steps(4, 2) == (0.5, 2) and sgd_steps(5, 2) == (1 / 3, 3)


def test_an_empty_poisson_batch_is_a_step_of_noise_alone():
    """40 examples, batches of 1: q = 1/40, so about a third of the steps sample no example."""
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    x, y = torch.randn(40, 3), torch.randint(0, 2, (40,))
    before = model.weight.detach().clone()
    s = train_private(model, x, y, epochs=1, batch_size=1, spec=OptimSpec(lr=0.1),
                      generator=torch.Generator().manual_seed(2),
                      noise_generator=torch.Generator().manual_seed(3), noise=1.0, clip=1.0)
    assert s.steps == 40 and 20 < s.samples < 60
    assert torch.isfinite(model.weight).all() and not torch.equal(model.weight, before)


def test_a_model_with_batch_norm_is_refused():
    assert check_model(nn.Sequential(nn.Linear(3, 2))) == ""
    assert check_model(nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2))) != ""


def test_a_run_reports_each_clients_per_example_epsilon(tmp_path):
    from fednet.core.inproc import run_local

    cfg = small_config(clients=3, rounds=2, out=str(tmp_path / "r"),
                       dp={"sgd_noise": 1.1, "sgd_clip": 1.0})
    s = run_local(cfg, quiet=True)
    rows = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert "train_loss" not in rows[0]  # withheld: the clients' loss is not private
    sizes = [json.loads(x)["samples"]
             for x in (tmp_path / "r" / "clients.jsonl").read_text().splitlines()]
    per = {}
    for cid, n in enumerate(sizes):
        q, steps = sgd_steps(n, cfg.train.batch_size)
        per[cid] = Accountant("rdp", 1e-5).epsilon([(("poisson", q, 1.1), 2 * steps)])
    assert s["dp"]["sgd"]["epsilon"] == rows[-1]["dp_sgd_epsilon"] == max(per.values())
    assert {int(k): v for k, v in s["dp"]["sgd"]["per_client"].items()} == per
    assert "epsilon" not in rows[0]  # no user-level mechanism: no user-level epsilon


def test_session_refuses_a_model_opacus_cannot_handle(monkeypatch):
    import fednet.training.dpsgd as dpsgd
    from fednet.core.session import Session

    monkeypatch.setattr(dpsgd, "check_model", lambda model: "BatchNorm cannot be used")
    with pytest.raises(ConfigError, match="choose a --model without batch norm"):
        Session(small_config(dp={"sgd_noise": 1.0}), quiet=True, write=False)
