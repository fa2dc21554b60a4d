"""The built-in algorithms: each one's Spec and typed parameters (docs/algorithms.md has the rules).

This is the single place where an algorithm's name, defaults, ranges and default model are
written; the CLI, config.toml and both halves read them from here. No torch is imported.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from fednet.algorithms.grouping.names import APPROXIMATORS, GROUPINGS, MEASURES, PROBABILITY_ONLY
from fednet.config.declare import param
from fednet.algorithms.spec import Spec, register

A = "fednet.algorithms."


@dataclass(frozen=True)
class ProxParams:
    """FedProx's proximal term (docs/algorithms.md §3.2)."""

    mu: float = param(0.01, "proximal weight of FedProx", ge=0, option="--mu")


@dataclass(frozen=True)
class DynParams:
    """FedDyn's dynamic regulariser (docs/algorithms.md §3.4, §7.9)."""

    alpha: float = param(0.1, "FedDyn regularisation", gt=0, option="--dyn-alpha")
    clip: float = param(0.0, "clip the local gradient norm (0 = off)", ge=0, option="--clip")
    official: bool = param(False, "the FedSeq repository's FedDyn variant (docs/algorithms.md §7.9)")


@dataclass(frozen=True)
class ScaffoldParams:
    """SCAFFOLD (docs/algorithms.md §3.3)."""

    option: int = param(2, "control update: 2 = the paper's cheap rule, 1 = full local gradient",
                        ge=1, le=2, option="--scaffold-option")


@dataclass(frozen=True)
class FedSeqParams(ProxParams, DynParams):
    """FedSeq (docs/algorithms.md §4); mu, alpha, clip, official are for --local."""

    approximator: str = param("confidence", "client representation", choices=APPROXIMATORS,
                              option="--approximator")
    measure: str = param("kl", "heterogeneity measure", choices=MEASURES, option="--measure")
    grouping: str = param("greedy", "superclient grouping", choices=GROUPINGS, option="--grouping")
    # e = 10: the paper's chosen default and its code's (evaluator.epochs); it tested 1-40
    pretrain_epochs: int = param(10, "pre-training epochs e", ge=0, option="--pretrain-epochs")
    min_samples: int = param(0, "|D_S|min (0 = room for about one client per class)", ge=0,
                             option="--min-samples")
    max_clients: int = param(11, "K_S,max clients per superclient", ge=1, option="--max-clients")
    passes: int = param(1, "ring passes E_S per round", ge=1, option="--passes")
    superclient_fraction: float = param(0.2, "fraction of superclients per round", gt=0, le=1,
                                        option="--superclient-fraction")
    local: str = param("sgd", "local rule inside the chain", choices=("sgd", "fedprox", "feddyn"),
                       option="--local")
    zero_floor: bool = param(False, "greedy grouping: floor the score at zero")
    pca_variance: float = param(0.9, "PCA variance kept for classifier approximators", gt=0, le=1)

    def check(self) -> str:
        """kl and gini need probability vectors (the confidence approximator)."""
        if self.approximator != "confidence" and self.measure in PROBABILITY_ONLY:
            return (f"--param measure={self.measure} needs probability vectors and cannot be used "
                    f"with --param approximator={self.approximator}; use --param measure=cosine "
                    "(or euclidean, wasserstein) or --param approximator=confidence")
        return ""


@dataclass(frozen=True)
class FedSeqInterParams(FedSeqParams):
    """FedSeqInter (docs/algorithms.md §4.8)."""

    period: int = param(0, "aggregation period in rounds (0 = the number of superclients)", ge=0,
                        option="--period")


@dataclass(frozen=True)
class FactorizedParams:
    """Factorized-FL (docs/algorithms.md §5.4); domain and permuted runs change some defaults."""

    tau: float = param(0.0, "similarity threshold", ge=-1, le=1, option="--tau", note="domain: 0.95")
    eps: float = param(1.0, "softmax sharpness of the matching", ge=0, option="--eps",
                       note="domain: 20")
    min_peers: int = param(0, "least peers aggregated (0 = all)", ge=0, option="--min-peers",
                           note="domain: 4; --permute: half the clients")
    lambda_sparsity: float = param(5e-4, "L1 weight on mu", ge=0, option="--lambda-sparsity")
    matching: str = param("similarity", "peer matching (none = Factorized-FedAvg)",
                          choices=("similarity", "none", "random", "worst"), option="--matching")
    peers: int = param(3, "peers of the random and worst matchings", ge=1)
    l1_detached: bool = param(False, "the L1 term carries no gradient (the official code)")
    clip: float = param(5.0, "clip the local gradient norm (0 = off)", ge=0, option="--clip")


@dataclass(frozen=True)
class StandAloneParams:
    """Stand-Alone (docs/algorithms.md §3.5)."""

    clip: float = param(0.0, "clip the local gradient norm (0 = off)", ge=0, option="--clip")


@dataclass(frozen=True)
class PFedParaParams:
    """pFedPara (docs/algorithms.md §3.7)."""

    clip: float = param(5.0, "clip the local gradient norm (0 = off)", ge=0, option="--clip")


@dataclass(frozen=True)
class CFLParams:
    """Clustered-FL (docs/algorithms.md §3.8)."""

    eps1: float = param(0.4, "split when the mean update norm is below this", gt=0)
    eps2: float = param(1.6, "... and the largest update norm above this", gt=0)
    warmup: int = param(20, "rounds before the first split", ge=0)
    lr_decay: float = param(1.0, "learning rate factor per round", gt=0)


@dataclass(frozen=True)
class FedFomoParams:
    """FedFOMO (docs/algorithms.md §3.9)."""

    m: int = param(5, "peer models each client downloads", ge=1)
    eps: float = param(0.3, "initial exploration probability", ge=0)
    eps_decay: float = param(0.05, "exploration decay per round", ge=0)
    val_fraction: float = param(0.2, "validation share of each client's data", gt=0, lt=1)
    baseline: str = param("current", "theta_b: current (the paper) or first_model (official code)",
                          choices=("current", "first_model"))
    norm: str = param("l1", "distance of the weights", choices=("l1", "l2"))
    self_weight: float = param(0.1, "initial affinity of a client to itself")


@dataclass(frozen=True)
class PerFedAvgParams:
    """Per-FedAvg (docs/algorithms.md §3.10)."""

    alpha: float = param(0.01, "inner (personalization) step size", gt=0)
    beta: float = param(0.005, "outer (meta) step size", gt=0)
    hf: bool = param(False, "Hessian-free variant")
    hvp: str = param("autograd", "Hessian-vector product", choices=("autograd", "fd"))
    fd_delta: float = param(1e-3, "finite-difference step of hvp=fd", gt=0)


@dataclass(frozen=True)
class FedAvgMParams:
    """FedAvgM (docs/algorithms.md §3.11): server SGD with momentum on Δ_t."""

    server_lr: float = param(1.0, "server learning rate eta", gt=0, option="--server-lr")
    server_momentum: float = param(0.9, "server momentum beta", ge=0, lt=1,
                                   option="--server-momentum")


@dataclass(frozen=True)
class FedAdagradParams:
    """FedAdagrad (docs/algorithms.md §3.11; Reddi et al. 2021)."""

    server_lr: float = param(0.1, "server learning rate eta", gt=0, option="--server-lr")
    beta1: float = param(0.9, "server first-moment decay beta1", ge=0, lt=1,
                         option="--server-beta1")
    tau: float = param(1e-3, "server adaptivity tau (v starts at tau^2)", gt=0,
                       option="--server-tau")


@dataclass(frozen=True)
class FedAdamParams(FedAdagradParams):
    """FedAdam and FedYogi (docs/algorithms.md §3.11; Reddi et al. 2021)."""

    server_lr: float = param(0.01, "server learning rate eta", gt=0, option="--server-lr")
    beta2: float = param(0.99, "server second-moment decay beta2", ge=0, lt=1,
                         option="--server-beta2")


@dataclass(frozen=True)
class AsyncParams:
    """FedAsync and FedBuff's pipeline (docs/algorithms.md §3.12)."""

    concurrency: int = param(0, "clients training at once, C (0 = the cohort, max(fraction*N, 1))",
                             ge=0, option="--concurrency")
    buffer: int = param(0, "replies used per round, K (0 = the cohort)", ge=0, option="--buffer")
    staleness: str = param("polynomial", "staleness weight s(tau)",
                           choices=("constant", "polynomial", "hinge"), option="--staleness")
    a: float = param(0.5, "s(tau) = (tau+1)^-a (polynomial), 1/(a(tau-b)+1) (hinge)", ge=0)
    b: int = param(4, "hinge: no discount up to staleness b", ge=0)
    drain: int = param(0, "rounds between drains, where a checkpoint may be written (0 = never)",
                       ge=0)


@dataclass(frozen=True)
class FedAsyncParams(AsyncParams):
    """FedAsync (Xie et al. 2019)."""

    alpha: float = param(0.6, "mixing weight alpha of an arriving model", gt=0, le=1)


@dataclass(frozen=True)
class FedBuffParams(AsyncParams):
    """FedBuff (Nguyen et al. 2022)."""

    server_lr: float = param(1.0, "server learning rate eta_g", gt=0, option="--server-lr")


FACTORIZED = {"digits": "factorized_digits", "*": "factorized_resnet9"}

# Tuned defaults (docs/algorithms.md §0.2): the settings a run gets when it leaves these options
# open (an option or a --config file always wins), chosen by the sweeps of docs/benchmarks/history.md section
# 10 on digits with 100 clients: every built-in algorithm learns with them. With one class per
# client (shards) local training must stay short and a run needs more rounds.
SHARDS: dict[str, Any] = {"rounds": 100, "train.epochs": 1, "train.lr": 0.1}
TUNED: dict[str, dict[str, dict[str, Any]]] = {
    # option I's control (the full local gradient) is far less noisy than option II's with a few
    # local steps per client; option II at lr 0.15 goes back to chance (docs/benchmarks/history.md section 10)
    "scaffold": {"*": {"algo.params.option": 1, "train.lr": 0.1}, "shards": SHARDS},
    "feddyn": {"*": {"train.lr": 0.05}, "shards": {**SHARDS, "train.lr": 0.05}},
    # the paper's beta (0.005) barely moves the model within 25 rounds
    "perfedavg": {"*": {"algo.params.beta": 0.3},  # alpha and beta replace --lr
                  "shards": {"rounds": 100, "train.epochs": 1}},
}


# The keys of the algorithms' own task and result bodies, by kind (spec.BODY_KINDS).
FEDSEQ_TASK = {"approximator": "name", "classes": "count"}  # pre-training: what to estimate
FACTORIZED_TASK = {"upload": "names", "lambda": "number", "clip": "number >= 0",
                   "l1_detached": "flag"}
FOMO_TASK, FOMO_RESULT = {"candidates": "client ids"}, {"candidates": "client ids",
                                                        "mixed": "number or nan"}


ROBUST = ("fedavg", "fedprox", "fedavgm", "fedadam", "fedyogi", "fedadagrad")
"""Their server averages models with FedAvg.take_round: --defense and --attack apply."""
# Differential privacy (docs/algorithms.md §11) composes with the synchronous FedAvg family: a
# server that averages models it sampled as the accountant assumes, clients that send models.
DP = ("central", "local", "distributed", "sgd")
PRIVATE = ("fedavg", "fedprox", "fedavgm", "fedadam", "fedyogi", "fedadagrad")
SUMMED = ("fedavg", "fedprox", "fedavgm", "fedadam", "fedyogi", "fedadagrad", "scaffold")
"""Their server needs only the weighted sum of the clients' models (SCAFFOLD's: and the sum of
its control changes, Spec.secagg_counted): --secagg applies."""
ARRIVALS = ("fedasync", "fedbuff")
"""Their server takes each reply as it arrives (Strategy.virtual_order): Spec.arrivals."""
BATCHED = ("fedavg", "fedprox", "fedavgm", "fedadam", "fedyogi", "fedadagrad", "fedasync",
           "fedbuff")
"""Their client is FedAvgClient or FedProxClient (local SGD, updates.Plain or Prox): a block of
clients can train as one batch (--batch-clients)."""


def _register(spec: Spec, handoffs: bool = False) -> None:
    """Register a built-in algorithm with its tuned defaults (SHARDS unless TUNED says more);
    only FedSeq's rings hand models between clients."""
    register(replace(spec, tuned=TUNED.get(spec.name, {"shards": SHARDS}), handoffs=handoffs,
                     robust=spec.name in ROBUST, dp=DP if spec.name in PRIVATE else (),
                     secagg=spec.name in SUMMED, batched=spec.name in BATCHED,
                     arrivals=spec.name in ARRIVALS))

_register(Spec("fedavg", "FedAvg: local SGD, sample-weighted average",
              A + "fedavg:FedAvg", A + "fedavg:FedAvgClient"))
_register(Spec("fedprox", "FedAvg plus a proximal term toward the received model",
              A + "fedavg:FedAvg", A + "fedavg:FedProxClient", ProxParams))
_register(Spec("scaffold", "control variates c, c_k", A + "scaffold:Scaffold",
              A + "scaffold:ScaffoldClient", ScaffoldParams, secagg_counted="dc:"))
_register(Spec("feddyn", "dynamic regularisation", A + "feddyn:FedDyn", A + "feddyn:FedDynClient",
              DynParams))
_register(Spec("standalone", "every client trains alone; nothing travels",
              A + "standalone:StandAlone", A + "standalone:StandAloneClient", StandAloneParams,
              personalized=True, task_body={"clip": "number >= 0"}))
_register(Spec("centralized", "one model on the pooled training set (the reference accuracy)",
              A + "centralized:Centralized", A + "centralized:CentralizedClient"))
_register(Spec("fedseq", "superclients trained sequentially over peer-to-peer rings",
              A + "fedseq:FedSeq", A + "fedseq:FedSeqClient", FedSeqParams,
              task_body=FEDSEQ_TASK), handoffs=True)
_register(Spec("fedseq_inter", "FedSeq with a bank of models travelling between superclients",
              A + "fedseq_inter:FedSeqInter", A + "fedseq:FedSeqClient", FedSeqInterParams,
              task_body=FEDSEQ_TASK), handoffs=True)
_register(Spec("factorized", "Factorized-FL: u travels, v and mu stay; matching by v similarity",
              A + "factorized:Factorized", A + "factorized:FactorizedClient", FactorizedParams,
              personalized=True, models=FACTORIZED, task_body=FACTORIZED_TASK))
_register(Spec("factorized_beta", "Factorized-FL beta: v and mu shared too",
              A + "factorized:FactorizedBeta", A + "factorized:FactorizedClient", FactorizedParams,
              personalized=True, models=FACTORIZED, task_body=FACTORIZED_TASK))
_register(Spec("pfedpara", "low-rank Hadamard layers; local factors stay personal",
              A + "pfedpara:PFedPara", A + "pfedpara:PFedParaClient", PFedParaParams,
              personalized=True, models={"*": "pfedpara_digits"},
              task_body={"upload": "names", "clip": "number >= 0"}))
_register(Spec("cfl", "Clustered-FL: clusters bi-partitioned by update similarity",
              A + "cfl:ClusteredFL", A + "cfl:CFLClient", CFLParams, personalized=True))
_register(Spec("fedfomo", "each client mixes the peers' models that lower its validation loss",
              A + "fedfomo:FedFomo", A + "fedfomo:FedFomoClient", FedFomoParams, personalized=True,
              task_body=FOMO_TASK, result_body=FOMO_RESULT))
_register(Spec("fedavgm", "FedAvg with server momentum (FedAvgM)", A + "fedopt:FedAvgM",
              A + "fedavg:FedAvgClient", FedAvgMParams))
_register(Spec("fedadam", "FedAvg clients, Adam on the server (Reddi et al. 2021)",
              A + "fedopt:FedAdam", A + "fedavg:FedAvgClient", FedAdamParams))
_register(Spec("fedyogi", "FedAvg clients, Yogi on the server (Reddi et al. 2021)",
              A + "fedopt:FedYogi", A + "fedavg:FedAvgClient", FedAdamParams))
_register(Spec("fedadagrad", "FedAvg clients, Adagrad on the server (Reddi et al. 2021)",
              A + "fedopt:FedAdagrad", A + "fedavg:FedAvgClient", FedAdagradParams))
_register(Spec("perfedavg", "Per-FedAvg (MAML-style local steps)", A + "fedavg:FedAvg",
              A + "perfedavg:PerFedAvgClient", PerFedAvgParams, personalized=True))
_register(Spec("fedasync", "asynchronous: each arriving model mixed in, staleness-weighted",
              A + "asynchronous:FedAsync", A + "fedavg:FedAvgClient", FedAsyncParams))
_register(Spec("fedbuff", "asynchronous: every K buffered, staleness-weighted updates applied",
              A + "asynchronous:FedBuff", A + "fedavg:FedAvgClient", FedBuffParams))
