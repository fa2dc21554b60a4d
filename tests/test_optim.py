"""Local optimizers (--optimizer): torch's functional kernels, bit-identical SGD, no torch._dynamo,
state that persists and checkpoints, one-line configuration errors."""
from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence

import numpy as np
import pytest
import torch

from fednet.algorithms.state import Shapes, decode, encode
from fednet.config import RunConfig
from fednet.algorithms.checks import validate
from fednet.data import load_dataset
from fednet.errors import ConfigError
from fednet.models import build_model
from fednet.training.local import train
from fednet.training.optim import Optimizer, OptimizerState, OptimSpec


class HandSGD:
    """fednet's former hand-written SGD (the reference the functional sgd must match bit for bit)."""

    def __init__(self, params: Sequence[torch.Tensor], lr: float, momentum: float = 0.0,
                 weight_decay: float = 0.0) -> None:
        self.params, self.lr, self.momentum, self.wd = list(params), lr, momentum, weight_decay
        self.buf: dict[int, torch.Tensor] = {}

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        for i, p in enumerate(self.params):
            d = p.grad
            if d is None:
                continue
            if self.wd:
                d = d.add(p, alpha=self.wd)
            if self.momentum:
                b = self.buf.get(i)
                if b is None:
                    b = self.buf[i] = d.clone()
                else:
                    b.mul_(self.momentum).add_(d)
                d = b
            p.add_(d, alpha=-self.lr)


def _data(n: int = 96) -> tuple[torch.Tensor, torch.Tensor]:
    ds = load_dataset("digits")
    return torch.from_numpy(ds.train_x[:n]), torch.from_numpy(ds.train_y[:n])


def _run(make_opt, steps: int = 30, seed: int = 0) -> dict[str, np.ndarray]:
    x, y = _data()
    model = build_model("digits_cnn", 10, (1, 8, 8), seed=seed)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = make_opt(params)
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        idx = torch.randperm(len(y), generator=g)[:8]
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
        opt.step()
    return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


def _same_bits(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(a[k].tobytes() == b[k].tobytes() for k in a)


@pytest.mark.parametrize("lr,momentum,wd", [(0.15, 0.0, 4e-4), (0.05, 0.9, 0.0),
                                            (0.1, 0.5, 1e-3), (0.2, 0.0, 0.0)])
def test_sgd_is_bit_identical_to_the_hand_written_loop(lr, momentum, wd):
    ours = _run(lambda ps: Optimizer(ps, OptimSpec("sgd", lr, momentum, wd)))
    hand = _run(lambda ps: HandSGD(ps, lr, momentum, wd))
    assert _same_bits(ours, hand)


@pytest.mark.parametrize("name,cls", [("adam", "Adam"), ("adamw", "AdamW")])
def test_adam_matches_torch_optim(name, cls):
    """Same numbers as torch.optim's classes (imported here only, in the test process)."""
    ours = _run(lambda ps: Optimizer(ps, OptimSpec(name, 1e-3, 0.0, 1e-2, beta1=0.8,
                                                   beta2=0.99, eps=1e-7)))
    theirs = _run(lambda ps: getattr(torch.optim, cls)(ps, lr=1e-3, betas=(0.8, 0.99), eps=1e-7,
                                                        weight_decay=1e-2, foreach=False))
    for k in ours:
        np.testing.assert_allclose(ours[k], theirs[k], rtol=0, atol=1e-7)


def test_nesterov_matches_torch_optim():
    ours = _run(lambda ps: Optimizer(ps, OptimSpec("sgd", 0.05, 0.9, 1e-4, nesterov=True)))
    theirs = _run(lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, weight_decay=1e-4,
                                             nesterov=True, foreach=False))
    assert _same_bits(ours, theirs)


def test_no_dynamo_is_imported():
    code = ("import sys, torch\n"
            "from fednet.training.local import train\n"
            "from fednet.training.optim import OptimSpec\n"
            "x, y = torch.randn(16, 1, 8, 8), torch.randint(0, 10, (16,))\n"
            "from fednet.models import build_model\n"
            "m = build_model('digits_cnn', 10, (1, 8, 8), seed=0)\n"
            "for o in ('sgd', 'adam', 'adamw'):\n"
            "    train(m, x, y, epochs=1, batch_size=8, lr=0.01, optim=OptimSpec(o, 0.01),\n"
            "          generator=torch.Generator().manual_seed(0))\n"
            "print('torch._dynamo' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_state_persists_across_calls_and_checkpoints():
    x, y = _data(64)
    model = build_model("digits_cnn", 10, (1, 8, 8), seed=0)
    st = OptimizerState()
    spec = OptimSpec("adam", 1e-3)
    for rnd in range(2):
        train(model, x, y, epochs=1, batch_size=16, lr=1e-3, optim=spec, opt_state=st,
              generator=torch.Generator().manual_seed(rnd))
    params = [p for p in model.parameters() if p.requires_grad]
    assert st.opt_steps == [8] * len(params)  # 2 calls x 4 batches: the moments kept going
    assert len(st.momentum) == len(st.moment2) == len(params)
    arrays, meta = encode(st, lambda f: f"state/{f}")
    shapes = Shapes({}, [tuple(p.shape) for p in params], clients=1)

    def fail(m: str) -> None:
        raise AssertionError(m)
    back, _ = decode(OptimizerState, arrays, meta, lambda f: f"state/{f}", shapes, fail, fail)
    assert back.opt_steps == st.opt_steps
    assert all(torch.equal(back.moment2[i], st.moment2[i]) for i in st.moment2)


@pytest.mark.parametrize("train_cfg,needle", [
    ({"optimizer": "adam", "momentum": 0.9}, "--momentum is SGD's"),
    ({"nesterov": True}, "--nesterov needs --optimizer sgd and a --momentum above 0"),
    ({"beta1": 0.5}, "--betas and --optimizer-eps are Adam's"),
    ({"optimizer": "adam", "beta2": 1.0}, "--betas must be in [0, 1) (got 1.0)"),
    ({"optimizer": "adamw", "eps": 0.0}, "--optimizer-eps must be positive"),
    ({"optimizer": "lion"}, "--optimizer must be one of: sgd, adam, adamw (got 'lion')"),
])
def test_wrong_settings_are_one_line(train_cfg, needle):
    cfg = RunConfig().replace(**{f"train.{k}": v for k, v in train_cfg.items()})
    with pytest.raises(ConfigError, match=None) as e:
        validate(cfg)
    assert needle in str(e.value) and "\n" not in str(e.value)
