"""Algorithm registry: name -> class. Algorithms never import sockets or the wire format."""
from __future__ import annotations

from fednet.algorithms.base import Algorithm, ClientContext
from fednet.algorithms.centralized import Centralized
from fednet.algorithms.cfl import ClusteredFL
from fednet.algorithms.fedavg import FedAvg, FedProx
from fednet.algorithms.factorized import Factorized
from fednet.algorithms.feddyn import FedDyn
from fednet.algorithms.fedfomo import FedFomo
from fednet.algorithms.perfedavg import PerFedAvg
from fednet.algorithms.pfedpara import PFedPara
from fednet.algorithms.fedseq import FedSeq
from fednet.algorithms.fedseq_inter import FedSeqInter
from fednet.algorithms.scaffold import Scaffold
from fednet.algorithms.standalone import StandAlone
from fednet.config import ALGORITHMS, RunConfig
from fednet.errors import ConfigError

REGISTRY: dict[str, type[Algorithm]] = {
    "fedavg": FedAvg, "fedprox": FedProx, "scaffold": Scaffold, "feddyn": FedDyn,
    "standalone": StandAlone, "centralized": Centralized, "fedseq": FedSeq,
    "fedseq_inter": FedSeqInter, "factorized": Factorized, "factorized_beta": Factorized,
    "pfedpara": PFedPara, "cfl": ClusteredFL, "fedfomo": FedFomo, "perfedavg": PerFedAvg,
}


def available() -> list[str]:
    """Names that this build can run."""
    return [n for n in ALGORITHMS if n in REGISTRY]


# Algorithms that need a model of their own kind; "auto" resolves to it (by input size).
MODEL_FOR = {"factorized": ("factorized_digits", "factorized_resnet9"),
             "factorized_beta": ("factorized_digits", "factorized_resnet9"),
             "pfedpara": ("pfedpara_digits", "pfedpara_digits")}


def model_name(cfg: RunConfig) -> str:
    """The architecture to build: --model, or the algorithm's own for "auto"."""
    if cfg.train.model != "auto" or cfg.algo.name not in MODEL_FOR:
        return cfg.train.model
    small, large = MODEL_FOR[cfg.algo.name]
    return small if cfg.data.dataset == "digits" else large


def build(cfg: RunConfig) -> Algorithm:
    """Instantiate the configured algorithm or raise a ConfigError naming --algo."""
    cls = REGISTRY.get(cfg.algo.name)
    if cls is None:
        raise ConfigError(f"--algo '{cfg.algo.name}' is not available in this build; "
                          f"available: {', '.join(available())}")
    return cls(cfg)


__all__ = ["Algorithm", "ClientContext", "REGISTRY", "available", "build"]
