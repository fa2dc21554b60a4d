"""The checks of a whole configuration: every declared range (config/declare.py), the
algorithm's name and parameters (the registry), then the rules across settings, each written out
here with the options it names; and how a run is evaluated (eval_mode). Above config in the
package graph: config itself knows no algorithm."""
from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

from fednet.algorithms import dp_spec, registry, seam
from fednet.compress.codecs import REGISTERED
from fednet.config.declare import check_range
from fednet.config.privacy import DPConfig
from fednet.config.settings import (LATENCY_PRESETS, NetConfig, RunConfig, TrainConfig,
                                    declarations)
from fednet.errors import ConfigError
from fednet.privacy import EXTRA, missing


def eval_mode(cfg: RunConfig) -> str:
    """'clients' (personalized: every client tests its own model on its own split) or 'global'."""
    if cfg.algo.eval != "auto":
        return cfg.algo.eval
    personal = (cfg.data.permute or cfg.data.partition == "domain"
                or registry.personalized(cfg.algo.name))
    return "clients" if personal else "global"


def algorithms(personal: bool = False) -> tuple[str, ...]:
    """The registry's algorithm names (personal: the personalized ones)."""
    return tuple(n for n in registry.names() if not personal or registry.personalized(n))


def _need(ok: bool, msg: str) -> None:
    if not ok:
        raise ConfigError(msg)


def _value(cfg: RunConfig, key: str) -> Any:
    node: Any = cfg
    for part in key.split("."):
        node = getattr(node, part)
    return node


def check_ranges(cfg: RunConfig) -> None:
    """Every run setting within its declared range or choices (a ConfigError names the option,
    or the TOML key of a setting without one)."""
    for info in declarations():
        v = _value(cfg, info.key)
        if not isinstance(v, str) or info.type is str:  # (server_bandwidth: a rate's text)
            check_range(info, v)


def optimizer_problem(t: TrainConfig) -> str:
    """Why the [train] optimizer settings do not fit together (one line naming the option)."""
    if t.nesterov and (t.optimizer != "sgd" or t.momentum <= 0):
        return "--nesterov needs --optimizer sgd and a --momentum above 0"
    if t.optimizer == "sgd" and (t.beta1, t.beta2, t.eps) != (0.9, 0.999, 1e-8):
        return "--betas and --optimizer-eps are Adam's; add --optimizer adam (or adamw)"
    if t.optimizer != "sgd" and t.momentum:
        return f"--momentum is SGD's; {t.optimizer} has --betas B1,B2 instead: drop --momentum"
    return ""


def validate(cfg: RunConfig, given: Collection[str] = ()) -> RunConfig:
    """Check values that do not need the dataset; raise ConfigError naming the option. `given`:
    the dotted keys the command line set (cli/setting_options.given): a DP setting given at its
    default is refused where any other value of it is (--dp-sampling poisson under --dp
    distributed, local or none: the default, so its value alone cannot tell)."""
    check_ranges(cfg)
    registry.check_params(cfg.algo.name, dict(cfg.algo.params))  # the name, then each --param
    _data_rules(cfg)
    _need(not (why := optimizer_problem(cfg.train)), why)
    _codec_rules(cfg)
    _need(cfg.net.clients_per_process <= 1 or not cfg.latency.real,
          "--clients-per-process above 1 does not go with --real-time: the clients of one process "
          "would wait out each other's simulated delays; use one process per client")
    _latency_rules(cfg)
    _need(not (why := registry.robust_problem(cfg)), why)  # --attack, --malicious, --defense
    _secagg_rules(cfg)
    _dp_rules(cfg, given)
    return cfg


def _data_rules(cfg: RunConfig) -> None:
    d = cfg.data
    _need(d.dataset == "synthetic-fedprox" or (d.synthetic_alpha, d.synthetic_beta) == (1, 1),
          "--synthetic-alpha and --synthetic-beta are settings of --dataset synthetic-fedprox")
    _need(d.dataset != "synthetic-fedprox" or cfg.algo.name != "centralized", "--algo centralized "
          "needs a pooled training set, and synthetic-fedprox's clients generate theirs apart")


def _codec_rules(cfg: RunConfig) -> None:
    """Each codec's own settings (its error names its option), then where it applies: an
    algorithm that hands models between clients (Spec.handoffs) compresses that traffic with
    --compress-handoff, and one that does not has none to compress."""
    codecs = cfg.net.codecs()
    name, rings = cfg.algo.name, registry.get(cfg.algo.name).handoffs
    _need(not (codecs.up.on and rings), f"--compress {cfg.net.compress}: {name} hands models "
          "between clients, and a chain's last client trained from a model the server never "
          "saw; use --compress-handoff (and --compress-down) for its traffic")
    _need(not codecs.handoff.on or rings, f"--compress-handoff: {name} hands no models between "
          "clients; drop it (or use --compress / --compress-down)")


def _latency_rules(cfg: RunConfig) -> None:
    lat = cfg.latency
    _need(bool(lat.file) or lat.preset in LATENCY_PRESETS,
          f"--latency '{lat.preset}' is neither a preset ({', '.join(LATENCY_PRESETS)}) nor a file")
    _need(not lat.shaped or (lat.real and lat.time_scale == 1),
          "--shaped-links says the network itself runs the transfers at the profiles' rates, which "
          "only --real-time can use (at --time-scale 1); add --real-time, or drop --shaped-links")
    _need(lat.real or lat.time_scale == 1,
          f"--time-scale {lat.time_scale:g} scales the delays --real-time sleeps, and this run "
          "sleeps none; add --real-time, or drop --time-scale")
    _need(lat.over_select == 1 or cfg.algo.name != "fedseq_inter",
          "--over-select does not apply to fedseq_inter (its slots run on without waiting for "
          "the others); use --deadline, or --algo fedseq")


_SECAGG = ("secagg_neighbours", "secagg_dropout", "secagg_threshold", "secagg_clip",
           "secagg_bits", "secagg_field", "secagg_drop")  # the settings of --secagg full|plus


def _secagg_rules(cfg: RunConfig) -> None:
    """Secure aggregation's preconditions (docs/algorithms.md §12): its settings only with
    --secagg, SecAgg+'s neighbours even and within the round, a round of at least 2 clients,
    --secagg-drop's stages and rates."""
    from fednet.algorithms.robust_spec import round_size
    from fednet.secagg.server import parse_drops

    n, base = cfg.net, NetConfig()
    given = [f"--{k.replace('_', '-')}" for k in _SECAGG if getattr(n, k) != getattr(base, k)]
    if n.secagg == "off":
        _need(not given, f"{', '.join(given)}: settings of --secagg full|plus; add --secagg")
        return
    _need(not (why := secagg_problem(cfg)), f"--secagg {n.secagg}: {why}")
    k, size = n.secagg_neighbours, round_size(cfg)
    _need(n.secagg != "full" or k == 0, f"--secagg-neighbours {k}: full SecAgg shares with every "
          "other client of the round; use --secagg plus for a graph of k neighbours")
    _need(k % 2 == 0, f"--secagg-neighbours {k}: SecAgg+'s graph (a Harary graph) needs an even "
          f"number of neighbours; use {k - 1 if k > 1 else 2} or {k + 1}")
    _need(size >= 2, f"--secagg {n.secagg} needs at least 2 clients a round (a sum of one update "
          f"is that update, in the clear), and --clients {cfg.clients} --fraction "
          f"{cfg.algo.fraction:g} selects {size}; select more clients")
    _need(k <= size - 1, f"--secagg-neighbours {k}: a round of {size} clients gives each at most "
          f"{size - 1} neighbours (--clients {cfg.clients} --fraction {cfg.algo.fraction:g}); "
          f"give at most {size - 1 - (size - 1) % 2}, or 0 for the default")
    _need(n.secagg_dropout == base.secagg_dropout or (n.secagg == "plus" and k == 0),
          f"--secagg-dropout {n.secagg_dropout:g} sizes SecAgg+'s default neighbours, and "
          + ("full SecAgg has none" if n.secagg == "full" else f"--secagg-neighbours {k} "
             "sets them") + "; drop one of the two")
    grid = n.codecs().field
    _need(not grid.on or n.secagg_bits == base.secagg_bits, f"--secagg-bits {n.secagg_bits}: "
          f"--compress {n.compress} sets secure aggregation's grid ({_levels(n) // 2} steps a "
          "side of zero); drop one of the two")
    _need(n.secagg_field in (0, 32, 64), f"--secagg-field {n.secagg_field}: the modulus is 2^32 "
          "or 2^64 (32 or 64; 0: the smallest that holds the round's sum)")
    try:
        parse_drops(n.secagg_drop)
    except ValueError as e:
        raise ConfigError(f"--secagg-drop {n.secagg_drop}: {e}") from None


def secagg_problem(cfg: RunConfig) -> str:
    """Why secure aggregation cannot wrap this run ('' when it can), from the algorithm's
    declared facts (Spec.secagg) and the settings: its server must aggregate one weighted sum of
    the clients' models, and nothing else may need an individual update."""
    name = cfg.algo.name
    if not registry.get(name).secagg:
        summed = [a for a in registry.names() if registry.get(a).secagg]
        return f"{name}{_unsummed(registry.get(name))}; use {', '.join(summed)}"
    if eval_mode(cfg) == "clients":
        return ("each client evaluating its own model (--eval clients, --permute or a domain "
                "partition) reads its own update, which secure aggregation hides; use --eval "
                "global")
    if (why := codec_problem(cfg)):  # from the codec's facts (algorithms/seam.py)
        return why
    if (why := dp_spec.secagg_problem(cfg)):  # from the mechanism's facts (algorithms/seam.py)
        return why
    if cfg.dp.sgd_noise > 0:  # (with --dp distributed already given, not "use" it again)
        return ("--dp-sgd-noise's accounting reads each client's update, which secure "
                "aggregation hides; " + (
                    "drop --dp-sgd-noise (--dp distributed's noise shares already make each "
                    "round's sum user-level private against the server)"
                    if dp_spec.kind(cfg.dp.mode) == "distributed" else
                    "use --dp distributed (each client's share of the noise in the sum it "
                    "unmasks)"))
    if cfg.latency.over_select != 1:
        return ("--over-select keeps the first arrivals of a round, and secure aggregation "
                "needs the cohort's every stage; drop it")
    return ""


def _levels(n: NetConfig) -> int:
    """The steps of --compress's common grid under --secagg (compress/field.py), or 0."""
    from fednet.compress.field import grid_levels

    f = n.codecs().field
    return grid_levels(f.kind, f.arg) if f.on else 0


def codec_problem(cfg: RunConfig) -> str:
    """Why --compress does not go under the run's --secagg (one line), or '': the codec's
    declared facts (CodecSpec, its FieldGrid), seam.codec_secagg_problem."""
    from fednet.compress.field import FIELD_GRIDS

    f = cfg.net.codecs().field
    if not f.on:
        return ""
    gridded = ", ".join(n + ("" if REGISTERED[n].arg is None else f":{REGISTERED[n].arg_name}")
                        for n in FIELD_GRIDS if n in REGISTERED)
    return seam.codec_secagg_problem(REGISTERED[f.kind], FIELD_GRIDS.get(f.kind),
                                     cfg.net.compress, cfg.net.secagg, cfg.dp.mode, gridded)


def _unsummed(spec: registry.Spec) -> str:
    """Why an algorithm's server needs more than secure aggregation's sum, from its declared
    facts (Spec.arrivals, handoffs, personalized; else Spec.secagg alone)."""
    if spec.arrivals:
        return ("'s server takes each update as it arrives, weighted by its own staleness, so "
                "the clients of a sum are known only as their updates come, and secure "
                "aggregation agrees their keys before any update is sent")
    if spec.handoffs:
        return (" hands models between clients, and a ring's model is one client's update "
                "in the clear")
    if spec.personalized:
        return "'s clients keep personal models, which secure aggregation would hide"
    return ("'s server needs every client's own update, which secure aggregation hides (its "
            "Spec does not declare secagg=True)")


def check_data(cfg: RunConfig, num_classes: int, sizes: Callable[[], Any],
               shape: tuple[int, ...] = (0, 0)) -> None:
    """The rules that need the loaded dataset (Session calls it before anything is written):
    the backdoor's target is one of its labels; secure aggregation's field holds the largest
    sum a round can make (the round's clients with the most examples, each weighing its
    update by its examples). `sizes()`: every client's examples (asked only under --secagg);
    `shape`: an input's shape (the backdoor's trigger must fit its images)."""
    a = cfg.attack
    if a.name == "backdoor":
        from fednet.algorithms.robust_spec import attack_params

        p = attack_params(cfg)
        t, side = int(p.target), int(p.trigger_size)
        _need(t < num_classes, f"--param target={t}: --attack backdoor's target is a label, and "
              f"{cfg.data.dataset} has {num_classes} (0..{num_classes - 1})")
        _need(side <= min(shape[-2:]), f"--param trigger_size={side}: the trigger is a square "
              f"in the image's corner, and {cfg.data.dataset}'s images are "
              f"{shape[-2]}x{shape[-1]}; give at most {min(shape[-2:])}, or 0 for side / 8")
    n = cfg.net
    if n.secagg == "off":
        return
    import numpy as np

    from fednet.algorithms.robust_spec import round_size
    from fednet.secagg.field import field_bits

    worst = int(np.sort(np.asarray(sizes(), dtype=np.int64))[-round_size(cfg):].sum())
    try:
        field_bits(round_size(cfg) if _levels(n) else worst, n.secagg_bits, n.secagg_field,
                   _levels(n))  # (a codec's grid: each input counts 1, its weight in its values)
    except ValueError as e:
        raise ConfigError(
            (f"--compress {n.compress}" if _levels(n) else f"--secagg-bits {n.secagg_bits}")
            + (f" --secagg-field {n.secagg_field}"
                                                if n.secagg_field else "")
            + f": {e}: a round's sum weighs each update by its examples, up to {worst:,} here; "
            "use fewer --secagg-bits" + (", or --secagg-field 64 (or 0)" if n.secagg_field
                                         else "")) from None


_USER_LEVEL = ("clip", "noise", "epsilon", "delta", "sampling", "accountant", "adaptive",
               "quantile", "clip_lr", "count_noise")  # the settings of --dp central / local


def _changed(cfg: RunConfig, names: tuple[str, ...], given: Collection[str] = ()) -> list[str]:
    """The options of the dp settings `names` that differ from their defaults or were given
    (`given`: dotted keys the command line set)."""
    base = DPConfig()
    return [f"--dp-{n.replace('_', '-')}" for n in names
            if getattr(cfg.dp, n) != getattr(base, n) or f"dp.{n}" in given]


def _distributed_rules(cfg: RunConfig, given: Collection[str]) -> None:
    """--dp distributed (docs/algorithms.md §11.6): under secure aggregation only (the noise is
    in the sum it unmasks), with the RDP accountant (its events are zCDP), and none of central
    DP's sampling or adaptive clipping (the server knows who took part, and sees no norm)."""
    from fednet.privacy import distributed, plan

    dp = cfg.dp
    given = _changed(cfg, ("sampling", "adaptive", "quantile", "clip_lr", "count_noise"), given)
    reasons = (["each cohort is floor(fraction N) clients drawn without replacement, as its "
            "accounting takes them (amplified against the released models, not the server)"]
           if "--dp-sampling" in given else []) + (
        ["the server sees only the noisy sum, no update's norm to adapt the clip to"]
        if any(g != "--dp-sampling" for g in given) else [])
    _need(not given, f"{', '.join(given)}: settings of --dp central (under --dp distributed "
          f"{'; '.join(reasons)}); drop {'them' if len(given) > 1 else 'it'}")
    _need(dp.accountant == "rdp", "--dp distributed's rounds are zCDP events, which "
          "dp-accounting's PLD accountant does not take; use --dp-accountant rdp")
    _need(dp.sgd_noise == 0, "--dp-sgd-noise with --dp distributed is not built: use one")
    n = plan.cohort_size(cfg.algo.fraction, cfg.clients)
    _need(not (why := distributed.fits(n, dp.noise or 1.0, plan.ddg_threshold(cfg))),
          f"--dp distributed: {why}")


def _dp_rules(cfg: RunConfig, explicit: Collection[str] = ()) -> None:
    """Differential privacy (docs/algorithms.md §11): every number finite, what composes with
    what, and a --dp-epsilon the noise can be calibrated to (privacy/plan.py)."""
    from fednet.privacy import plan

    dp, algo = cfg.dp, cfg.algo.name
    _need(not (why := plan.settings_problem(cfg)), why)
    _need(not (why := dp_spec.problem(cfg)), why)  # its name, and the rules from its facts
    kind = dp_spec.kind(dp.mode)
    mechanisms = registry.get(algo).dp
    private = [n for n in registry.names() if registry.get(n).dp]
    where = f"differential privacy composes with {', '.join(private)} (docs/algorithms.md §11.1)"
    if dp.mode == "none":
        given = _changed(cfg, _USER_LEVEL, explicit)
        _need(not given, f"{', '.join(given)}: settings of --dp central|local|distributed; add --dp")
    else:
        _need(kind in mechanisms, f"--dp {dp.mode} does not apply to {algo}: {where}")
        _need(dp.noise > 0 or dp.epsilon > 0, f"--dp {dp.mode} needs --dp-noise Z, or "
              "--dp-epsilon E to calibrate the noise to")
    if dp.sgd_noise == 0:
        given = _changed(cfg, ("sgd_clip", "sgd_delta"))
        _need(not given, f"{', '.join(given)}: settings of DP-SGD; add --dp-sgd-noise Z")
    else:
        _need("sgd" in mechanisms, f"--dp-sgd-noise does not apply to {algo}: {where}")
        _need(not missing("opacus"), f"--dp-sgd-noise needs opacus: {EXTRA}")
    if kind == "local":
        given = _changed(cfg, ("sampling", "adaptive", "quantile", "clip_lr", "count_noise"),
                         explicit)
        _need(not given, f"{', '.join(given)}: settings of --dp central (a client alone has no "
              "sampling to amplify its privacy, nor a count of the others' norms)")
    if kind == "local" or dp.sgd_noise > 0:
        _need(eval_mode(cfg) == "global", "--eval clients does not go with --dp local or "
              "--dp-sgd-noise: each client would report its own model's accuracy, which no noise "
              "covers; use --eval global")
    if kind == "central":
        _central_rules(cfg)
    if kind == "distributed":
        _distributed_rules(cfg, explicit)
    _need(not (dp.mode != "none" or dp.sgd_noise > 0) or not missing("dp_accounting"),
          f"--dp and --dp-sgd-noise need Google's dp-accounting: {EXTRA}")
    _need(not (why := plan.calibration_problem(cfg)), why)  # (after: it needs dp-accounting)


def _central_rules(cfg: RunConfig) -> None:
    dp, lat = cfg.dp, cfg.latency
    _need(lat.over_select == 1, "--over-select does not go with --dp central: the first results "
          "to arrive are not a sample the accountant knows; drop it")
    _need(dp.sampling == "poisson" or not lat.availability or lat.availability == "always",
          "--dp-sampling fixed does not go with --availability: a fixed-size cohort of the clients "
          "online is a larger share of them than the accountant assumes; use --dp-sampling poisson")
    _need(dp.accountant == "rdp" or dp.sampling == "poisson", "--dp-accountant pld has no "
          "fixed-size sampling (dp-accounting's PLD accountant); use --dp-accountant rdp")
    if not dp.adaptive:
        given = _changed(cfg, ("quantile", "clip_lr", "count_noise"))
        _need(not given, f"{', '.join(given)}: settings of adaptive clipping; add --dp-adaptive")
        return
    from fednet.privacy.plan import count_noise

    std = count_noise(cfg)  # --dp-count-noise, or the expected cohort / 20
    _need(dp.noise == 0 or dp.noise < 2 * std, f"--dp-noise {dp.noise:g} needs a count noise above "
          f"{dp.noise / 2:g} with --dp-adaptive (the two releases share the noise multiplier), "
          f"and it is {std:g}" + ("" if dp.count_noise else " (the expected cohort / 20)")
          + "; raise --dp-count-noise or lower --dp-noise")
