"""The golden runs (benchmarks/golden.py): the arguments every run shares, each algorithm's own,
and the variants pinned beside them."""
from __future__ import annotations

# `fednet local` arguments shared by every algorithm (digits is the default dataset).
# Every setting an algorithm's tuned defaults could change is given (docs/algorithms.md §0.2), so
# the numbers pin the code, not the defaults of the day.
COMMON = ["--dataset", "digits", "--clients", "6", "--rounds", "3", "--epochs", "1", "--seed", "0",
          "--partition", "dirichlet", "--alpha", "0.5", "--latency", "lan", "--lr", "0.15"]
# Per algorithm: what makes its run small and still non-trivial.
FEDSEQ = ["--pretrain-epochs", "1", "--min-samples", "300", "--max-clients", "3"]
EXTRA: dict[str, list[str]] = {
    "fedavg": [],
    "fedprox": ["--mu", "0.01"],
    "scaffold": ["--scaffold-option", "2"],
    "feddyn": ["--dyn-alpha", "0.1"],
    "standalone": [],
    "centralized": [],
    "fedseq": FEDSEQ + ["--superclient-fraction", "1.0"],
    "fedseq_inter": FEDSEQ + ["--superclient-fraction", "0.5", "--period", "3"],
    "factorized": [],
    "factorized_beta": [],
    "pfedpara": [],
    "cfl": ["--param", "warmup=1", "--param", "eps1=10", "--param", "eps2=0.1"],
    "fedfomo": ["--param", "m=3"],
    "perfedavg": ["--param", "beta=0.005"],
    "fedavgm": ["--server-lr", "1.0", "--server-momentum", "0.9"],
    "fedadam": ["--server-lr", "0.01", "--server-tau", "0.001"],
    "fedyogi": ["--server-lr", "0.01", "--server-tau", "0.001"],
    "fedadagrad": ["--server-lr", "0.1", "--server-tau", "0.001"],
    "fedasync": ["--concurrency", "3", "--buffer", "2", "--staleness", "polynomial",
                 "--param", "alpha=0.6", "--param", "a=0.5"],
    "fedbuff": ["--concurrency", "3", "--buffer", "2", "--staleness", "polynomial",
                "--param", "a=0.5", "--server-lr", "1.0"],
}
# Runs pinned beside the algorithms': name -> (algorithm, more arguments). --compress: every
# codec on FedAvg, and top-k's error feedback on a client state of its own (SCAFFOLD's).
VARIANTS: dict[str, tuple[str, list[str]]] = {
    "fedavg+fp16": ("fedavg", ["--compress", "fp16"]),
    "fedavg+int8": ("fedavg", ["--compress", "int8"]),
    "fedavg+qsgd": ("fedavg", ["--compress", "qsgd:16"]),
    "fedavg+topk": ("fedavg", ["--compress", "topk:0.01"]),
    "fedavg+sign": ("fedavg", ["--compress", "sign"]),
    "scaffold+topk": ("scaffold", ["--compress", "topk:0.05"]),
    "fedbuff+hetero": ("fedbuff", ["--latency", "hetero", "--deadline", "0.2"]),  # a straggler
    "fedasync+hinge": ("fedasync", ["--staleness", "hinge", "--param", "b=1", "--latency",
                                    "hetero", "--server-bandwidth", "20Mbit"]),
    "fedbuff+topk": ("fedbuff", ["--compress", "topk:0.05"]),
    "fedavg+down-int8": ("fedavg", ["--compress-down", "int8"]),
    "scaffold+down-fp16": ("scaffold", ["--compress-down", "fp16", "--compress", "topk:0.05"]),
    "fedbuff+down-qsgd": ("fedbuff", ["--compress-down", "qsgd:127", "--latency", "hetero"]),
    "fedseq+handoff-int8": ("fedseq", ["--compress-handoff", "int8", "--compress-down", "fp16"]),
    "fedseq_inter+handoff-qsgd": ("fedseq_inter", ["--compress-handoff", "qsgd:127"]),
    "fedavg+secagg-full": ("fedavg", ["--secagg", "full"]),
    "fedadam+secagg-plus": ("fedadam", ["--secagg", "plus", "--secagg-neighbours", "4"]),
    # --attack, --defense (issue 40): each attack once, each defense at least once; Bulyan's n >= 4f + 3: 7 clients
    "fedavg+labelflip+median": ("fedavg", ["--attack", "labelflip", "--malicious", "0.2", "--defense", "median"]),
    "fedavg+signflip+krum": ("fedavg", ["--attack", "signflip", "--malicious", "0.2", "--defense", "krum"]),
    "fedavg+noise+trimmed_mean": ("fedavg", ["--attack", "noise", "--malicious", "0.2", "--defense", "trimmed_mean"]),
    "fedavg+backdoor+norm_bound": ("fedavg", ["--attack", "backdoor", "--malicious", "0.2", "--defense", "norm_bound"]),
    "fedavg+alie+multikrum": ("fedavg", ["--attack", "alie", "--malicious", "0.34", "--defense", "multikrum",
                                         "--param", "f=1"]),
    "fedadam+ipm+centered_clip": ("fedadam", ["--attack", "ipm", "--malicious", "0.34", "--defense", "centered_clip",
                                              "--param", "radius=1"]),
    "fedavg+minmax+bulyan": ("fedavg", ["--clients", "7", "--attack", "minmax", "--malicious", "0.29",
                                        "--defense", "bulyan", "--param", "f=1"]),
    "fedprox+minsum": ("fedprox", ["--attack", "minsum", "--malicious", "0.34"]),
    # differential privacy (docs/algorithms.md §11): DP-FedAvg with Poisson and fixed-size
    # sampling, adaptive clipping under a server optimizer, local DP, DP-SGD inside FedProx's
    # clients (the noise is tiny: these pin the mechanisms' arithmetic and streams, not privacy)
    "fedavg+dp-central": ("fedavg", ["--dp", "central", "--dp-noise", "0.1", "--dp-clip", "2",
                                     "--fraction", "0.5"]),
    "fedavg+dp-fixed": ("fedavg", ["--dp", "central", "--dp-noise", "0.1", "--dp-clip", "2",
                                   "--fraction", "0.5", "--dp-sampling", "fixed"]),
    "fedavgm+dp-adaptive": ("fedavgm", ["--dp", "central", "--dp-adaptive", "--dp-noise", "0.1",
                                        "--dp-count-noise", "1", "--dp-clip", "2"]),
    "fedavg+dp-local": ("fedavg", ["--dp", "local", "--dp-noise", "0.02", "--dp-clip", "2"]),
    "fedprox+dp-sgd": ("fedprox", ["--dp-sgd-noise", "1.0", "--dp-sgd-clip", "1.0"]),
}
