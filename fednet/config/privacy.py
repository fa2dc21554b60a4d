"""The run settings of differential privacy (--dp, --dp-*): a section of RunConfig
(config/settings.py), declared like every setting; the mechanisms and the accountant are
fednet/privacy (docs/algorithms.md §11)."""
from __future__ import annotations

from dataclasses import dataclass

from fednet.config.declare import setting


@dataclass(frozen=True)
class DPConfig:
    """Differential privacy (docs/algorithms.md §11): user-level DP-FedAvg at the server
    (central) or each client's own clipped and noised update (local); DP-SGD inside clients."""

    mode: str = setting(
        "none", "User-level differential privacy: central (the server clips every update and "
        "noises their sum: DP-FedAvg), local (each client clips and noises its own update "
        "before it leaves) or distributed (with --secagg: each client clips its update and adds "
        "its share of discrete Gaussian noise; the server unmasks only the noisy sum), or a "
        "plugin's mechanism (fednet.api.register_dp); needs pip install 'fednet[dp]'",
        option="--dp", metavar="none|central|local|distributed|NAME")
    clip: float = setting(1.0, "l2 norm C every client's update is clipped to (with "
                          "--dp-adaptive: its start)", gt=0, option="--dp-clip", metavar="C")
    noise: float = setting(
        0.0, "Noise multiplier z: the noise's standard deviation is z*C on the sum of the clipped "
        "updates (central; distributed: at least, the clients' shares summed) or on each "
        "update (local)", ge=0, option="--dp-noise", metavar="Z",
        note="0: calibrated to --dp-epsilon")
    epsilon: float = setting(
        0.0, "Privacy budget epsilon at --dp-delta: without --dp-noise the noise is calibrated to "
        "spend it in --rounds; a run that would exceed it stops as budget_spent", ge=0,
        option="--dp-epsilon", metavar="E", note="0: none")
    delta: float = setting(
        0.0, "The delta of the (epsilon, delta) guarantee: keep it well below 1/clients (a run "
        "warns when it is not)", ge=0, lt=1, option="--dp-delta",
        shown="min(1e-5, 1/(10 clients))", note="0: the default")
    sampling: str = setting(
        "poisson", "How --dp central draws a round's clients, as the accountant assumes: poisson "
        "(each client with probability --fraction) or fixed (floor(fraction*N) without "
        "replacement)", choices=("poisson", "fixed"), option="--dp-sampling")
    against: str = setting(
        "release", "--dp distributed: whom --dp-epsilon (its calibration and its budget) holds "
        "against: release (whoever sees only the released models, not who took part: "
        "amplification by the cohort's sampling, as Kairouz et al. 2021 account) or server "
        "(the server, which knows who took part: no amplification); both are reported",
        choices=("release", "server"), option="--dp-against")
    survivors: float = setting(
        0.0, "--dp distributed: the fraction F of a round's cohort of m whose noise shares its "
        "sum must hold: each client's share is scaled so that t = floor(F m) + 1 (at most m) "
        "survivors carry the noise z C, and secure aggregation fails a round that unmasks "
        "fewer than t (1: the whole cohort, no dropout tolerated; lower F tolerates dropouts "
        "at sqrt(m / t) times the noise when none drop)", ge=0, le=1, option="--dp-survivors",
        metavar="F", note="0: --secagg-threshold")
    accountant: str = setting("rdp", "dp-accounting's accountant: rdp (Renyi DP) or pld (privacy "
                              "loss distributions: tighter, slower; Poisson sampling only)",
                              choices=("rdp", "pld"), option="--dp-accountant")
    adaptive: bool = setting(
        False, "--dp central: the clip norm follows --dp-quantile of the update norms through a "
        "noised count (Andrew et al. 2021)", option="--dp-adaptive/--no-dp-adaptive")
    quantile: float = setting(0.5, "Adaptive clipping's target quantile of the update norms",
                              gt=0, lt=1, option="--dp-quantile")
    clip_lr: float = setting(0.2, "Adaptive clipping's learning rate (geometric update)", gt=0,
                             option="--dp-clip-lr")
    count_noise: float = setting(
        0.0, "Adaptive clipping: standard deviation of the noise on the count of unclipped "
        "updates, in clients", ge=0, option="--dp-count-noise",
        note="0: the expected cohort / 20")
    sgd_noise: float = setting(
        0.0, "DP-SGD inside every client (Opacus: per-example clipping and noise): its noise "
        "multiplier; per-example privacy accounted per client", ge=0, option="--dp-sgd-noise",
        metavar="Z", note="0: off")
    sgd_clip: float = setting(1.0, "DP-SGD's per-example gradient clip norm", gt=0,
                              option="--dp-sgd-clip", metavar="C")
    sgd_delta: float = setting(1e-5, "DP-SGD's delta (per example)", gt=0, lt=1,
                               option="--dp-sgd-delta")
