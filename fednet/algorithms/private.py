"""Differential privacy on the server (docs/algorithms.md §11): Privacy, a piece that a
FedAvg-family Strategy holds (`strategy.privacy`, contract.ServerPiece; halves.build_bare adds
it, built from the run's DPSpec), whatever its server rule (FedAvg, FedAvgM, FedAdam, ...). It
acts only through the Strategy's declared hooks: the cohort (select), the round's tasks
(configured), the round's mean (sum_of), the row (closed), the budget (stop_before), the
summary (report), --resume (resume_problem), and its fields of the state (Fields).

- `--dp central` (DP-FedAvg, McMahan et al. 2018): the round's cohort is drawn as the
  accountant assumes (Poisson with rate q = --fraction from the stream (seed, "dp-select",
  round), or fixed-size: Strategy.select), the round's mean is dp_mean.PrivateMean's noised mean
  of clipped updates, the server rule steps on it, and with --dp-adaptive the clip norm follows
  a quantile through a noised count (Andrew et al. 2021).
- `--dp local`: the clients privatize their own updates (dp_client.py); the server only
  accounts, per client, for every task it sent.
- `--dp distributed` (under --secagg, Kairouz et al. 2021): the clients clip, round and noise
  their own updates (privacy/distributed.py, in algorithms/secagg.py's input stage); the server
  unmasks only the noisy sum and accounts one zCDP event a round from the clients it holds.
- `--dp-sgd-noise`: DP-SGD inside the clients (training/dpsgd.py); the server accounts each
  client's per-example privacy from its partition's size and the tasks it sent it.

Every round's event goes into the state (DPFields: `dp`, JSON; `dp_counts`: tasks per client,
counted when the round is aggregated), so a --resume continues the accounting (checked first:
resume_problem); the rows carry epsilon after each round and the summary a
`dp` section. A round that would exceed --dp-epsilon is not started: the run stops as
`budget_spent` (stop_before).
"""
from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fednet import rng, types as roster
from fednet.algorithms import dp_spec, private_resume
from fednet.algorithms.contract import ServerInfo, ServerPiece, Strategy
from fednet.algorithms.dp_mean import PrivateMean, PrivateRuleMean
from fednet.algorithms.fedavg import FedAvg
from fednet.algorithms.seam import DPSpec
from fednet.errors import ConfigError
from fednet.privacy import plan
from fednet.privacy.accountant import Accountant
from fednet.privacy.mechanisms import next_clip
from fednet.types import Arrays, ClientInfo, Failure, Result, Task
from fednet.config import RunConfig

log = logging.getLogger("fednet.server")

GUARANTEE = {
    "central": "user-level (epsilon, delta)-DP of the sequence of global models, against anyone "
               "who sees them (clients, the world); not against the server, which sees every "
               "update",
    "local": "user-level (epsilon, delta)-DP of each client's updates, against the server and "
             "everyone after it (epsilon of the client that took part most often)",
    "distributed": "user-level (epsilon, delta)-DP of each round's unmasked sum, and so of the "
                   "global models, made by the clients' own noise shares, not the server; "
                   "epsilon_by_adversary gives it against the server (secure aggregation shows "
                   "it only the noisy sum; it knows who took part, so no amplification by "
                   "sampling) and against whoever sees only the released models (amplified by "
                   "the sampling of each cohort); epsilon is the one --dp-against names",
    "sgd": "example-level (epsilon, delta)-DP of each client's updates, against the server, the "
           "other clients and the released models (epsilon of the most exposed client)",
}


@dataclass
class DPFields:
    """The accountant's fields of a DP run's server state (Privacy.Fields: after the Strategy's
    own, checkpointed with them): its JSON record (the clip norm, the events, DP-SGD's worst
    epsilon, ...) and, under --dp local and DP-SGD, the tasks each client was sent."""

    dp: dict[str, Any] = field(default_factory=dict)
    dp_counts: np.ndarray | None = None


class Privacy(ServerPiece):
    """The server's part of differential privacy; see the module's docstring."""

    name = "Private"
    Fields = DPFields

    def __init__(self, cfg: RunConfig, spec: DPSpec) -> None:
        dp = cfg.dp
        if dp.mode != "none" and dp.noise <= 0:
            raise ConfigError("--dp: the noise multiplier must be calibrated before the algorithm "
                              "is built (core/session.py does it from --dp-epsilon)")
        self.cfg = cfg
        kind, self.piece = spec.kind, spec if spec.noise is not None else None  # (a plugin's)
        self.central, self.local, self.sgd = kind == "central", kind == "local", dp.sgd_noise > 0
        self.distributed = kind == "distributed"
        self.ddg_t = plan.ddg_threshold(cfg) if self.distributed else 0
        self.delta = plan.delta(cfg)
        self.acc = Accountant(dp.accountant, self.delta) if dp.mode != "none" else None
        self.sgd_acc = Accountant("rdp", dp.sgd_delta, remember=False) if self.sgd else None
        self.count_std = plan.count_noise(cfg) if dp.adaptive else 0.0
        self.z_update = plan.update_noise(dp.noise, self.count_std) if dp.adaptive else dp.noise
        self._round, self._denom = -1, plan.expected_cohort(cfg)
        self._key: tuple | None = None  # --dp central: the round's event
        self._mean: PrivateMean | None = None
        self._pending: list[int] = []  # the round's clients, counted when it is aggregated
        self.remarks: list[str] = []  # said before the first round (plan.remarks)
        self._said_end = False

    @classmethod
    def of(cls, cfg: RunConfig) -> Privacy:
        """The piece for the run's --dp mechanism (its DPSpec: a plugin's too) and DP-SGD."""
        return cls(cfg, dp_spec.mechanism(cfg.dp.mode))

    def attach(self, srv: Strategy) -> None:
        """Join a FedAvg-family Strategy (its streamed mean is what the noise goes on), as its
        `privacy`."""
        if not isinstance(srv, FedAvg):
            raise TypeError(f"{type(srv).__name__} is no FedAvg-family Strategy: differential "
                            "privacy needs FedAvg's streamed mean (docs/algorithms.md §11.1)")
        super().attach(srv)
        srv.privacy = self

    @property
    def state(self) -> Any:
        """The Strategy's state (with DPFields)."""
        return self.srv.state

    @property
    def info(self) -> ServerInfo:
        """The Strategy's ServerInfo (the clients' sizes, for DP-SGD's accountant)."""
        return self.srv.info

    # ---- the state ----------------------------------------------------------------------------
    def init_state(self, st: Any) -> None:
        """The clip norm, the events so far and the tasks per client (the session says whether
        it calibrated the noise: the Strategy's `calibrated`)."""
        st.dp = {"clip": float(self.cfg.dp.clip), "events": [], "sgd_epsilon": 0.0,
                 "calibrated": self.srv.calibrated, "non_finite": 0}
        if self.local or self.sgd:
            st.dp_counts = np.zeros(self.cfg.clients, dtype=np.int64)
        self.remarks = plan.remarks(self.cfg, _noised_values(st.model))
        for line in self.remarks:  # before the first round: the delta, a noise that swamps
            log.warning("%s", line)

    def _history(self, extra: tuple | None = None) -> list[tuple[tuple, int]]:
        """[(event key, count), ...] so far, with one more `extra`."""
        h = [(tuple(k), int(c)) for k, c in self.state.dp["events"]]
        if extra is not None:
            h = _plus(h, extra)
        return h

    def epsilon(self, more: bool = False, key: tuple | None = None) -> float:
        """Epsilon at the run's delta now (more: after one more round, of `key` for central)."""
        if not (self.central or self.distributed or self.local):
            return 0.0
        assert self.acc is not None, "each --dp mode has its accountant"
        if self.local:
            worst = int(self.state.dp_counts.max(initial=0)) + int(more)
            return self.acc.epsilon([(plan.local_key(self.cfg.dp.noise), worst)])
        if self.distributed:  # (the adversary --dp-against names)
            return self.acc.epsilon(plan.ddg_histories(
                self.cfg, self._history(key if more else None))[self.cfg.dp.against])
        return self.acc.epsilon(self._history(key if more else None))

    # ---- a round ------------------------------------------------------------------------------
    def stop_before(self, rnd: int, clients: Sequence[ClientInfo]) -> tuple[str, str] | None:
        """budget_spent when round `rnd` would take epsilon past --dp-epsilon."""
        budget = self.cfg.dp.epsilon
        if self.acc is None or budget <= 0:
            return None
        nxt = self.epsilon(True, self._round_key(clients) if self.central else
                           self._ddg_key(self.ddg_t) if self.distributed else None)
        if nxt <= budget * (1 + 1e-9):
            return None
        why = (f"the privacy budget is spent: round {rnd + 1} would reach epsilon {nxt:.4g} > "
               f"--dp-epsilon {budget:g}; stopped after {rnd} rounds at epsilon "
               f"{self.epsilon():.4g} (delta {self.delta:.3g}; {plan.relation_words(self.cfg)})")
        self.state.dp["stopped"] = why
        return "budget_spent", why

    def _ddg_key(self, k: int) -> tuple:
        """--dp distributed: the event of a round whose sum holds k clients' noise shares (at
        least ddg_t: secure aggregation unmasks no fewer)."""
        return plan.ddg_key(self.cfg.dp.noise, self.ddg_t, max(k, self.ddg_t),
                            _noised_values(self.state.model))

    def _round_key(self, clients: Sequence[ClientInfo]) -> tuple:
        dp = self.cfg.dp
        return plan.round_key(dp.mode, dp.sampling, dp.noise, self.cfg.algo.fraction,
                              len(clients))

    def configured(self, rnd: int, clients: Sequence[ClientInfo], tasks: list[Task]) -> None:
        """The round's event and denominator (central); its tasks' clients, counted when the
        round is aggregated (local, sgd: _count)."""
        self._round, self._mean = rnd, None
        if self.central:
            self._key = self._round_key(clients)
            if self.cfg.dp.sampling == "fixed":
                self._denom = float(plan.cohort_size(self.cfg.algo.fraction, len(clients)))
        if self.local or self.sgd:
            self._pending = sorted({c for t in tasks for c in t.route})

    def select(self, rnd: int, clients: Sequence[ClientInfo]) -> list[ClientInfo] | None:
        """--dp central with Poisson sampling: every client independently with probability q,
        from one uniform per client id of the population (seed, "dp-select", round); otherwise
        None (the Strategy's own draw: fixed-size sampling)."""
        if not (self.central and self.cfg.dp.sampling == "poisson"):
            return None
        u = rng.generator(self.cfg.seed, "dp-select", rnd).random(self.cfg.clients)
        q = self.cfg.algo.fraction
        return [c for c in roster.ordered(clients) if u[c.cid] < q]

    def sum_of(self, part: str) -> Any:
        """The round's model sum under --dp central: a PrivateMean (with --defense: a
        PrivateRuleMean); otherwise None."""
        if not (self.central and part == "model"):
            return None
        seed, rnd, clip = self.cfg.seed, self._round, self.state.dp["clip"]
        gen = functools.partial(rng.generator, seed, "dp-central", rnd)
        if self.cfg.defense.name != "none":  # clip, the rule, then the noise
            self._mean = self._rule_mean(clip, gen)
        else:
            self._mean = PrivateMean(
                self.state.model, clip, self.z_update * clip, self._denom, gen,
                *((self.piece.noised, self.piece.norm) if self.piece else ()))
        return self._mean

    def _rule_mean(self, clip: float, gen: Callable[[], np.random.Generator]) -> PrivateRuleMean:
        """--dp central with --defense: the rule on the m clipped updates (a fixed cohort), the
        noise z S / 2 for its declared sensitivity S (algorithms/seam.DefenseSpec)."""
        from fednet.algorithms import robust, robust_spec

        cfg, m = self.cfg, int(self._denom)
        spec, p = robust_spec.defense_spec(cfg.defense.name), robust_spec.defense_params(cfg)
        share = robust_spec.assumed_share(cfg)
        f = robust_spec.byzantine_count(robust_spec.assumed_f(spec, p), share, m)
        sens = spec.sensitivity(clip, m, f, p) if spec.sensitivity is not None else None
        assert isinstance(sens, float), "validate refuses a rule without a sensitivity bound"

        def rule(x: np.ndarray) -> tuple[np.ndarray | None, dict[str, float], str]:
            out = robust.apply(cfg.defense.name, p, share, x, np.ones(len(x)))
            return out.update, {**out.metrics, "dp_sensitivity": sens}, out.why

        return PrivateRuleMean(self.state.model, clip, self.cfg.dp.noise * sens / 2, m, gen, rule)

    def closed(self, rnd: int, results: list[Result], failures: list[Failure],
               metrics: dict[str, Any]) -> dict[str, Any]:
        """After the server rule stepped (on the noised mean): the accountant's row."""
        if self.local or self.sgd:
            self._count(self._pending)
        self.state.dp["non_finite"] = self.state.dp.get("non_finite", 0) + sum(
            plan.DP_CAUSE in f.reason for f in failures)  # (core/replies.py names the noise)
        extra = self._central_round(rnd) if self.central else {}
        if self.distributed:  # one event a round: the clients whose shares the sum holds
            k = results[0].num_examples if results else self.ddg_t  # (secagg: the count)
            self.state.dp["events"] = [[list(key), c] for key, c in
                                       self._history(self._ddg_key(k))]
            extra["dp_cohort"] = k if results else 0
        t0 = time.perf_counter()
        if self.local or self.sgd or self.distributed:  # no client's loss travels (it would leak)
            metrics.pop("train_loss", None)
        if self.acc is not None:
            extra["epsilon"] = self.epsilon()
        if self.sgd:
            extra["dp_sgd_epsilon"] = self.state.dp["sgd_epsilon"]
        extra["dp_account_s"] = time.perf_counter() - t0
        return {**metrics, **extra}

    def _central_round(self, rnd: int) -> dict[str, float]:
        """Record the round's event; the clip norm's next value (adaptive); the row's numbers."""
        st, mean = self.state, self._mean
        clip = st.dp["clip"]
        st.dp["events"] = [[list(k), c] for k, c in self._history(self._key)]
        folded = mean.count if mean is not None else 0
        sigma = mean.std if mean is not None else self.z_update * clip
        out = {"dp_clip": clip, "dp_sigma": sigma, "dp_cohort": folded,
               "dp_clipped": mean.clipped / folded if mean is not None and folded else 0.0,
               "dp_s": mean.seconds if mean is not None else 0.0,  # clipping and noise
               "dp_fold_s": mean.fold_seconds if mean is not None else 0.0}  # the sums
        if isinstance(mean, PrivateRuleMean):  # the rule's own row metrics
            out.update(mean.metrics)
        if self.cfg.dp.adaptive and mean is not None and folded:
            t0 = time.perf_counter()
            gen = rng.generator(self.cfg.seed, "dp-count", rnd)
            below = (folded - mean.clipped) - folded / 2 + gen.standard_normal() * self.count_std
            out["dp_unclipped"] = below / self._denom + 0.5
            st.dp["clip"] = next_clip(clip, out["dp_unclipped"], self.cfg.dp.quantile,
                                      self.cfg.dp.clip_lr)
            out["dp_s"] += time.perf_counter() - t0
        return out

    def _count(self, cids: list[int]) -> None:
        """One more task for each of the round's clients (every client on its tasks' routes),
        counted once the round is aggregated, so that a checkpoint written when a round is
        interrupted holds the rounds done, as the participants' counts do; DP-SGD's worst
        epsilon."""
        st, self._pending = self.state, []
        for cid in cids:
            st.dp_counts[cid] += 1
            if self.sgd:
                st.dp["sgd_epsilon"] = max(st.dp["sgd_epsilon"], self.sgd_epsilon(cid))

    def sgd_epsilon(self, cid: int, tasks: int | None = None) -> float:
        """Client cid's per-example epsilon (at --dp-sgd-delta) after the tasks it was sent
        (`tasks`, or its count in the state)."""
        if self.info.sizes is None:
            raise RuntimeError("DP-SGD's accountant needs the clients' sizes (ServerInfo.sizes)")
        q, steps = plan.sgd_steps(self.info.sizes(cid), self.cfg.train.batch_size)
        n = int(self.state.dp_counts[cid]) if tasks is None else tasks
        total = n * self.cfg.train.epochs * steps
        assert self.sgd_acc is not None, "DP-SGD (--dp-sgd-noise) has its accountant"
        return self.sgd_acc.epsilon([(plan.sgd_key(self.cfg.dp.sgd_noise, q), total)])

    # ---- --resume --------------------------------------------------------------------------------
    def resume_problem(self, st: Any, rounds_done: int, participants: Any,
                       last_row: dict[str, Any] | None) -> tuple[str, str] | None:
        """Why a checkpointed state cannot go on ('json' or 'npz', one line), or None: the
        accountant's record is checked against the run's configuration, the rounds done, the
        tasks each client was given and the last row, so that a resumed run never reports an
        epsilon below the truth (the server rule's own checks come after: FedAvg.resume_problem)."""
        return private_resume.resume_problem(self, st, rounds_done, participants, last_row)

    # ---- the summary ----------------------------------------------------------------------------
    def report(self) -> dict[str, Any]:
        """summary.json's `dp`: the mechanisms, their parameters, epsilon and the guarantee."""
        dp, st = self.cfg.dp, self.state.dp
        out: dict[str, Any] = {"delta": self.delta} if self.acc is not None else {}
        if self.acc is not None:
            out.update(mode=dp.mode, accountant=dp.accountant, noise_multiplier=dp.noise,
                       noise_calibrated=bool(st.get("calibrated")), clip=st["clip"],
                       epsilon=self.epsilon(), budget=dp.epsilon or None,
                       relation=plan.relation_words(self.cfg), guarantee=self._guarantee())
        if self.distributed:
            assert self.acc is not None, "--dp distributed has its accountant"
            hist = plan.ddg_histories(self.cfg, self._history())
            by = {who: self.acc.epsilon(h) for who, h in hist.items()}
            out.update(against=dp.against, epsilon_by_adversary=by,
                       **plan.adversary_relations(by))
            out.update(threshold=self.ddg_t, events=st["events"], mechanism=(
                "distributed discrete Gaussian (Kairouz, Liu and Steinke 2021), each client's "
                f"share of multiplier {dp.noise:.6g} over sqrt({self.ddg_t})"),
                rounds_accounted=sum(c for _, c in st["events"]))
        if self.central:
            out.update(sampling=dp.sampling, adaptive=dp.adaptive, clip_start=dp.clip,
                       update_noise_multiplier=self.z_update, events=st["events"],
                       rounds_accounted=sum(c for _, c in st["events"]))
        if self.local:
            out["most_tasks"] = int(self.state.dp_counts.max(initial=0))
        if "stopped" in st:
            out["stopped"] = st["stopped"]
        if self.sgd:
            out["sgd"] = self._sgd_report()
        if st.get("non_finite"):
            out["non_finite_results"] = int(st["non_finite"])
        remarks = [*self.remarks, *self._end_remarks(out.get("epsilon"))]
        if remarks:
            out["remarks"] = remarks
        return {"dp": out}

    def _guarantee(self) -> str:
        """The guarantee in words, with the neighbouring relation its epsilon holds for."""
        own = self.piece.guarantee if self.piece is not None and self.piece.guarantee else ""
        words = (f"{own or GUARANTEE[dp_spec.kind(self.cfg.dp.mode)]}; neighbouring datasets: "
                 f"{plan.relation_words(self.cfg)}")
        if self.central and self.cfg.dp.sampling == "fixed":
            words += (" (fixed-size sampling: not comparable with an add-or-remove-one epsilon of "
                      "Poisson sampling, which is smaller at the same noise)")
        return words

    def _end_remarks(self, eps: float | None) -> list[str]:
        """What the end of the run adds (said once, and kept in summary.json): an epsilon near 0
        or not finite, results that the noise made NaN/inf."""
        out = [plan.epsilon_remark(eps, self.delta)] if eps is not None else []
        bad = int(self.state.dp.get("non_finite", 0))
        if bad:
            out.append(f"{bad} client results held NaN/inf and were left out: "
                       f"{plan.DP_CAUSE} (the failures name the noise)")
        out = [line for line in out if line]
        if not self._said_end:
            for line in out:
                log.warning("%s", line)
            self._said_end = True
        return out

    def _sgd_report(self) -> dict[str, Any]:
        dp = self.cfg.dp
        seen = np.flatnonzero(self.state.dp_counts)
        per = {int(c): self.sgd_epsilon(int(c)) for c in seen[:1000]}
        return {"noise_multiplier": dp.sgd_noise, "clip": dp.sgd_clip, "delta": dp.sgd_delta,
                "accountant": "rdp", "epsilon": self.state.dp["sgd_epsilon"],
                "clients": int(len(seen)), "per_client": per if len(seen) <= 1000 else None,
                "relation": "add or remove one example", "guarantee": GUARANTEE["sgd"]}


def _noised_values(model: Arrays) -> int:
    """How many values the mechanisms noise: the model's floating entries."""
    return int(sum(np.asarray(a).size for a in model.values() if np.asarray(a).dtype.kind == "f"))


def _plus(history: list[tuple[tuple, int]], key: tuple) -> list[tuple[tuple, int]]:
    """The history with one more event `key`."""
    key = tuple(key)
    for i, (k, c) in enumerate(history):
        if k == key:
            return [*history[:i], (k, c + 1), *history[i + 1:]]
    return [*history, (key, 1)]
