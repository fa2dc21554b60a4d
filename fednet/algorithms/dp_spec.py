"""The user-level DP mechanisms, declared (--dp NAME; docs/algorithms.md §11): each one a
seam.DPSpec registered in the table a plugin adds to (fednet.api.register_dp), with the facts
the composition rules read (algorithms/seam.dp_problems). No torch and no numpy: the CLI and
config.validate read this before anything heavy is imported.

- central (DP-FedAvg): the server clips every update and noises their sum; it reads each
  update, so it cannot run under secure aggregation.
- local: each client clips and noises its own update (algorithms/dp_client.py), in the client
  half after training; the server accounts per client, for every task it sent.
- distributed: each client's share of discrete Gaussian noise inside secure aggregation's sum
  (privacy/distributed.py); the server unmasks only the noisy sum, one event a round.

The server's side of every mechanism is algorithms/private.py; a plugin's (kind central) brings
its own noise and its own accounting event (docs/extending.md).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from fednet.algorithms import seam
from fednet.algorithms.seam import MECHANISMS, DPSpec, Facts, register_dp
from fednet.errors import ConfigError

if TYPE_CHECKING:
    from fednet.config import RunConfig

NONE = DPSpec("none", kind="none", facts=Facts())
_OWN = (NONE,
        DPSpec("central", facts=Facts(spends_privacy=True, needs_each=True, summable=False),
               doc="the server clips every update and noises their sum (DP-FedAvg)"),
        DPSpec("local", kind="local", samplings=(),
               facts=Facts(spends_privacy=True, needs_each=True, summable=False, on_client=True),
               doc="each client clips and noises its own update before it leaves"),
        # (its share is added in secure aggregation's input stage, after an attacker's training
        # on poisoned data as after an honest one's; a forgery is refused by --secagg itself)
        DPSpec("distributed", kind="distributed", samplings=(), accountants=("rdp",),
               facts=Facts(spends_privacy=True, summable=True, needs_secagg=True),
               doc="each client's share of discrete Gaussian noise in the secure sum"))
with seam.built_in():  # (no plugin provides them, whoever imports this module first)
    for _m in _OWN:
        register_dp(_m)
BUILTIN = tuple(MECHANISMS)


def mechanism(name: str) -> DPSpec:
    """The mechanism called `name` (a plugin's too), or a ConfigError naming --dp and the
    choices."""
    return seam.lookup(MECHANISMS, name, "dp")


def kind(name: str) -> str:
    """Where the mechanism `name` adds its noise: none, central, local or distributed (a name
    that is not registered: itself, for the checks to refuse)."""
    m = MECHANISMS.get(name)
    return m.kind if m is not None else name


def plugin(name: str) -> DPSpec | None:
    """The mechanism `name` when it brings its own noise (a plugin's), else None."""
    m = MECHANISMS.get(name)
    return m if m is not None and m.noise is not None else None


def secagg_problem(cfg: RunConfig) -> str:
    """Why --dp's mechanism does not go with the run's --secagg (one line), or '' (an unknown
    name: '' here, refused by problem())."""
    m = MECHANISMS.get(cfg.dp.mode)
    return seam.dp_secagg_problem(m, cfg.net.secagg) if m is not None else ""


def problem(cfg: RunConfig) -> str:
    """Why --dp's mechanism does not fit the run (one line), or '': its name, then the rules
    derived from its facts and the other pieces' (seam.dp_problems), then what its accounting
    takes (--dp-sampling, --dp-accountant). The attack and the defense were checked before
    (robust_spec.problem)."""
    from fednet.algorithms import robust_spec

    try:
        m = mechanism(cfg.dp.mode)
    except ConfigError as e:
        return str(e)
    d = robust_spec.defense_spec(cfg.defense.name)
    p = robust_spec.defense_params(cfg) if d.name != "none" else None
    why = seam.dp_problems(m, d, robust_spec.attack_spec(cfg.attack.name), cfg.net.secagg,
                           cfg.dp, p)
    if why or m.noise is None:
        return why
    if cfg.dp.sampling not in m.samplings:
        return (f"--dp-sampling {cfg.dp.sampling}: --dp {m.name} accounts for "
                f"{' or '.join(m.samplings) or 'no'} sampling")
    if cfg.dp.accountant not in m.accountants:
        return (f"--dp-accountant {cfg.dp.accountant}: --dp {m.name}'s event is taken by "
                f"dp-accounting's {' or '.join(m.accountants)} accountant; use "
                f"--dp-accountant {m.accountants[0]}")
    if cfg.dp.adaptive:
        return f"--dp-adaptive: --dp {m.name} clips to a fixed norm (adaptive clipping is central's)"
    return _probe(m, cfg)


def _probe(m: DPSpec, cfg: RunConfig) -> str:
    """Why a plugin mechanism's noise or event does not work (one line), or '': its noise on a
    small shape, and one round of its event in the run's accountant, tried before any data
    loads (a plugin's code: whatever it raises is its failure, said in one line)."""
    import numpy as np

    from fednet.privacy import missing, plan
    from fednet.privacy.accountant import Accountant

    try:
        got = m.noised({"probe": (2, 3)}, 1.0, np.random.default_rng(0))
        ok = isinstance(got, dict) and set(got) == {"probe"}
        arr = np.asarray(got["probe"], dtype=np.float64) if ok else None
    except Exception as e:  # noqa: BLE001 - a plugin's function, reported in one line
        return f"--dp {m.name}: its noise(shapes, scale, gen) failed: {type(e).__name__}: {e}"
    if arr is None or arr.shape != (2, 3) or not np.isfinite(arr).all():
        return (f"--dp {m.name}: its noise(shapes, scale, gen) must give one finite array per "
                "name of `shapes`, of its shape")
    if missing("dp_accounting"):
        return ""  # (refused next, naming the extra)
    key = plan.piece_key(m.name, cfg.dp.noise or 1.0, cfg.algo.fraction)
    try:
        Accountant(cfg.dp.accountant, plan.delta(cfg)).epsilon([(key, 1)])
    except Exception as e:  # noqa: BLE001 - a plugin's event, reported in one line
        return (f"--dp {m.name}: dp-accounting's {cfg.dp.accountant} accountant does not take "
                f"its event(z, q): {type(e).__name__}: {str(e)[:200]}")
    return ""
