"""Command-line options of the local optimizer (shared by launch, local, server)."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from fednet.config import OPTIMIZERS
from fednet.errors import ConfigError

# option name -> dotted config key
KEYS = {"optimizer": "train.optimizer", "nesterov": "train.nesterov",
        "optimizer_eps": "train.eps"}


OPTIONS: list[Callable[[Any], Any]] = [
    click.option("--optimizer", type=click.Choice(OPTIMIZERS),
                 help="The clients' local optimizer (torch's functional kernels); adam and adamw "
                      "want a much smaller --lr, e.g. 0.001. [default: sgd]"),
    click.option("--nesterov/--no-nesterov", default=None,
                 help="Nesterov momentum (sgd with --momentum > 0). [default: off]"),
    click.option("--betas", metavar="B1,B2",
                 help="Adam's and AdamW's moment decays. [default: 0.9,0.999]"),
    click.option("--optimizer-eps", type=float,
                 help="Adam's and AdamW's epsilon. [default: 1e-8]"),
]


def overrides(opts: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """The dotted config keys these options set (base: the configuration so far)."""
    over: dict[str, Any] = {KEYS[k]: v for k, v in opts.items() if k in KEYS and v is not None}
    betas = opts.get("betas")
    if betas is not None:
        try:
            b1, b2 = (float(x) for x in str(betas).split(","))
        except ValueError:
            raise ConfigError(f"--betas expects two numbers B1,B2, e.g. 0.9,0.999 (got "
                              f"'{betas}')") from None
        over["train.beta1"], over["train.beta2"] = b1, b2
    return over
