"""A deployment's stack, composed (issue 58 item 5): each client clips its update, rounds it and
adds its share of the distributed discrete Gaussian noise, SecAgg+ masks it, and the server
unmasks only the noisy sum and steps with FedAdam -- against central DP-FedAvg (the server clips
and noises) and non-private FedAvg, at each --epsilons, for each --cohorts a round; and central
DP with the stack's FedAdam (dp-central-fedadam), which sets the privacy mechanism apart from
the optimizer.

    python3 benchmarks/bench_stack.py [--population 1400] [--cohorts 100 1000] [--rounds 5]
        [--epsilons 1 3 8] [--seeds 0 1 2] [--server-lr 0.1] [--parity-cohort 100 [1000]]
        [--parity-only]
        [--against release|server] [--central-sampling fixed|poisson] [--survivors 1]
        [--model mclr] [--methods fedavg dp-central dp-central-fedadam stack stack-tolerant]
        [--reuse F] [--json F]

Like with like: by default every epsilon compared holds against the same adversary, whoever
sees only the released models (not who took part), for the same neighbouring relation (replace
one user) and the same sampling (cohorts of m drawn without replacement from N): central DP with
--dp-sampling fixed, the stack with --dp-against release (its rounds amplified by that sampling,
docs/algorithms.md 11.9). The stack's noise is scaled for --survivors of the cohort
(--dp-survivors; 1: the whole cohort, the sum's noise z C as central's, as the paper's
experiments); stack-tolerant keeps the default scaling (--secagg-threshold's survivors, which
tolerates dropouts at sqrt(m / t) times the noise).

Every cell is one `fednet local` process on digits (--model, default mclr; iid, the DP rows'
task: benchmarks/bench_dp.py), --rounds rounds, epochs 1, batch 8, lr 0.5, clip 2.0, delta
1e-6, --dp-epsilon calibrated over the run. Per cell: final accuracy, the epsilon the run
reports (and the stack's against both adversaries), uplink bytes per client (the round's
client-to-server bytes over the cohort; the stack's per stage too), wall seconds. The stack's
checks: (1) both its epsilons recomputed here from the run's recorded events: against the
server with dp-accounting's RDP accountant (ZCDpEvent(rho) per round, rho from
fednet.privacy.distributed.rho of the event's z, t, k, d), against the released models from
distributed.sampled_rdp of rho at span 2 converted by dp-accounting (and, as a reference,
dp-accounting's own sampled Gaussian of the same zCDP curve), each equal to the reported one;
(2) uplink per surviving client over its masked input (the same quantized vector in the clear:
d field elements), per stage; (3) --parity-cohort: seed 0 at the middle epsilon run again under
`fednet launch`: the same final model, bit for bit, and the same bytes; (4) accuracy at epsilon
3 against central DP-FedAvg at epsilon 3, paired by seed, with its 95% t interval. Each
--parity-cohort is recorded under "parities" (a cohort's former record kept unless run again;
an older file's "parity" read as its cohort's); --parity-only runs the launch parity alone, every
cell and fingerprint of --reuse kept as they were (their command under "reused"). The parity
row holds when every recorded cohort gives the same model, bytes and both epsilons under both
runtimes, each epsilon equal to the one recomputed from its run's events (check 1). With a
--model other than mclr only the uplink row is written (a deployment's model, whose update
dominates SecAgg+'s fixed per-client bytes; mclr's uplink is said in the launch row).

Fingerprints (issue 55 item 1, benchlib/fingerprint.py, CLOCKLESS): seed 0's cells at epsilon 3
(the stack, central DP-FedAvg, central DP-FedAdam) at FP_COHORTS, their first 2 rounds, the
noise multiplier given (--dp-noise: the one the cell's whole run was calibrated to). Their first
2 rounds' accuracies must equal the cell's own, else nothing is recorded. `--fingerprints-only
--json F` adds them to an existing F (and its rows' names) without re-running the cells.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib.runner import fednet_module, metrics, run, same_model, summary  # noqa: E402
from benchlib.util import (  # noqa: E402
    command_line, headline_row, machine, measured, table, write_json)

METHODS = ("fedavg", "dp-central", "dp-central-fedadam", "stack", "stack-tolerant")
STACKS = ("stack", "stack-tolerant")  # --dp-survivors --survivors; the default (dropouts kept)
FP_EPSILON = 3.0  # the headline rows' epsilon
# The fingerprinted cells' cohorts, per method the headline rows compare: the stack's 2 rounds
# at 1,000 a round cost 19 s here (2.1 s at 100, central DP's 1.7-1.9 s at 1,000): at 100 only.
FP_COHORTS = {"stack": (100,), "dp-central": (100, 1000), "dp-central-fedadam": (100, 1000)}


def base_args(a: argparse.Namespace, cohort: int, seed: int) -> list[str]:
    return ["--dataset", "digits", "--model", a.model, "--partition", "iid", "--clients",
            str(a.population), "--fraction", repr(cohort / a.population), "--rounds",
            str(a.rounds), "--epochs", "1", "--batch-size", "8", "--lr", "0.5", "--seed",
            str(seed), "--batch-clients", str(cohort)]


def method_args(a: argparse.Namespace, method: str, eps: float | None) -> list[str]:
    dp = ["--dp-epsilon", str(eps), "--dp-delta", str(a.delta), "--dp-clip", str(a.clip)]
    central = ["--dp", "central", "--dp-sampling", a.central_sampling, *dp]
    if method == "dp-central":
        return central
    if method == "dp-central-fedadam":  # the stack's optimizer, central DP: the mechanism apart
        return ["--algo", "fedadam", "--server-lr", str(a.server_lr), *central]
    if method in STACKS:
        return ["--algo", "fedadam", "--server-lr", str(a.server_lr), "--secagg", "plus",
                "--dp", "distributed", "--dp-against", a.against, *dp,
                *(["--dp-survivors", str(a.survivors)] if method == "stack" else [])]
    return []


def cell_kwargs(a: argparse.Namespace, method: str, cohort: int, seed: int, noise: float | None
                ) -> dict[str, Any]:
    """A cell as fednet.api.run keywords (what base_args and method_args say), its noise
    multiplier given (--dp-noise) in place of --dp-epsilon's calibration."""
    kw: dict[str, Any] = {"dataset": "digits", "model": a.model, "partition": "iid",
                          "clients": a.population, "fraction": cohort / a.population,
                          "rounds": a.rounds, "epochs": 1, "batch_size": 8, "lr": 0.5,
                          "seed": seed, "batch_clients": cohort}
    if method != "fedavg":
        kw.update(dp="distributed" if method in STACKS else "central", dp_delta=a.delta,
                  dp_clip=a.clip, dp_noise=noise)
        kw.update({"dp_against": a.against} if method in STACKS else
                  {"dp_sampling": a.central_sampling})
    if method in (*STACKS, "dp-central-fedadam"):
        kw.update(algo="fedadam", server_lr=a.server_lr)
    if method in STACKS:
        kw["secagg"] = "plus"
    if method == "stack":
        kw["dp_survivors"] = a.survivors
    return kw


def fingerprint_recipes(a: argparse.Namespace, cells: list[dict[str, Any]]
                        ) -> dict[str, dict[str, Any]]:
    """The seed-0 cells at FP_EPSILON of FP_COHORTS, 2 rounds, each with the noise multiplier its
    run was calibrated to; named METHOD-EPSILON-COHORT."""
    from benchlib.fingerprint import fingerprint_of

    out = {}
    for method, cohorts in FP_COHORTS.items():
        for cohort in cohorts:
            got = _cells(cells, method, cohort, FP_EPSILON)
            c = next((c for c in got if c["seed"] == min(a.seeds) and c.get("noise")), None)
            if c is not None:
                out[f"{method}-{FP_EPSILON:g}-{cohort}"] = fingerprint_of(
                    cell_kwargs(a, method, cohort, c["seed"], c["noise"]))
    return out


def fingerprints(a: argparse.Namespace, cells: list[dict[str, Any]]) -> dict[str, Any]:
    """take() of each recipe; refused (SystemExit) where its rounds' accuracies are not the first
    rounds of the cell it stands for (then it is not that cell's training path)."""
    from benchlib.fingerprint import CLOCKLESS, takes

    fps = takes(fingerprint_recipes(a, cells), CLOCKLESS)
    for name, fp in fps.items():
        method, _, cohort = name.rsplit("-", 2)
        c = next(c for c in _cells(cells, method, int(cohort), FP_EPSILON)
                 if c["seed"] == fp["recipe"]["seed"])
        got = [r["accuracy"] for r in fp["rounds"]]
        if got != c["curve"][:len(got)]:
            raise SystemExit(f"fingerprint {name}: accuracies {got}, its cell's first rounds "
                             f"{c['curve'][:len(got)]}: not the cell's training path")
    return fps


def fingerprints_only(a: argparse.Namespace) -> None:
    """--fingerprints-only: add the fingerprints of --json's own cells to it (and the names to its
    rows), its command, commit and date kept (the cells' own)."""
    path = Path(a.json)
    data = json.loads(path.read_text())
    a = argparse.Namespace(**{**vars(a), **{k: data["args"][k] for k in (
        "population", "rounds", "seeds", "server_lr", "clip", "delta")},
        "against": data["args"].get("against", "server"),
        "central_sampling": data["args"].get("central_sampling", "poisson"),
        "survivors": data["args"].get("survivors", 0.0),
        "model": data["args"].get("model", "mclr")})
    data["fingerprints"] = fingerprints(a, data["results"])
    data["fingerprinted"] = {"commit": machine().get("git"), "command": command_line()}
    data["headline"] = headline(data)
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")
    print(f"wrote {path}")


def cell(a: argparse.Namespace, out: Path, method: str, cohort: int, seed: int,
         eps: float | None, runtime: str = "local") -> dict[str, Any]:
    argv = [*base_args(a, cohort, seed), *method_args(a, method, eps), "-q", "--out", str(out)]
    r = run(fednet_module(runtime, *argv))
    rec: dict[str, Any] = {"method": method, "cohort": cohort, "seed": seed, "target": eps,
                           "runtime": runtime, "argv": argv, "wall_s": r.wall_s}
    if r.rc != 0 or not (out / "summary.json").is_file():
        return {**rec, "status": f"rc {r.rc}", "error": r.stderr[-800:]}
    s, rows = summary(out), metrics(out)
    dp = s.get("dp") or {}
    up = s["bytes"]["client_to_server"]
    rec.update(status=s["status"], accuracy=s["final_accuracy"], epsilon=dp.get("epsilon"),
               epsilon_by_adversary=dp.get("epsilon_by_adversary"), against=dp.get("against"),
               sampling=dp.get("sampling"),
               noise=dp.get("noise_multiplier"), events=dp.get("events"),
               up_per_client=up / (cohort * a.rounds), curve=[x.get("accuracy") for x in rows],
               bytes=s["bytes"])
    if method in STACKS:
        rec["stack"] = stack_checks(rows, dp, a.delta, a.population, cohort)
    return rec


def stack_checks(rows: list[dict[str, Any]], dp: dict[str, Any], delta: float,
                 population: int, cohort: int) -> dict[str, Any]:
    """Uplink over the masked vector, per surviving client and round, and each stage's bytes
    per surviving client (mean over rounds); both epsilons from the events."""
    ratios, stages = [], []
    for row in rows:
        st = row.get("bytes_by_stage") or {}
        survivors = max(1, (row.get("secagg_clients") or [0, 0, 0, 1])[3])
        if "input" in st:
            up = sum(v["client_to_server"] for v in st.values()) / survivors
            ratios.append(up / (st["input"]["client_to_server"] / survivors))
            stages.append({k: v["client_to_server"] / survivors for k, v in st.items()})
    per_stage = ({k: statistics.mean(s.get(k, 0) for s in stages) for k in stages[0]}
                 if stages else {})
    events = dp.get("events") or []
    return {"up_over_clear": max(ratios) if ratios else None, "up_per_stage": per_stage,
            "epsilon_recomputed": recomputed_epsilon(events, delta),
            "epsilon_release_recomputed": release_epsilon(events, delta, population, cohort),
            "epsilon_release_gaussian_reference": release_epsilon(
                events, delta, population, cohort, gaussian=True),
            "field_bits": rows[-1].get("secagg_field_bits") if rows else None}


def recomputed_epsilon(events: list[Any], delta: float) -> float | None:
    """Against the server: dp-accounting's epsilon at delta for the run's recorded
    distributed-DP events, composed here: ZCDpEvent(rho(z, t, k, d)) `count` times each, in an
    RDP accountant."""
    if not events:
        return None
    import dp_accounting

    from fednet.privacy import distributed

    acc = dp_accounting.rdp.RdpAccountant()  # (its default orders; add-or-remove-one)
    for (kind, z, t, k, d), count in events:
        assert kind == "ddg", kind
        ev = dp_accounting.ZCDpEvent(distributed.rho(float(z), int(t), int(k), int(d)))
        acc.compose(dp_accounting.SelfComposedDpEvent(ev, int(count)))
    return float(acc.get_epsilon(delta))


def release_epsilon(events: list[Any], delta: float, population: int, cohort: int,
                    gaussian: bool = False) -> float | None:
    """Against whoever sees only the released models (each cohort of `cohort` drawn without
    replacement from `population`; replace one user): composed here from the events, the
    sampled bound's Renyi divergences (distributed.sampled_rdp of rho at span 2) at
    dp-accounting's orders, summed, then dp-accounting's conversion. gaussian: dp-accounting's
    own SampledWithoutReplacementDpEvent of a Gaussian of the same zCDP curve (its Theorem-27
    bound, tighter, shown as a reference: not a bound shown for the discrete Gaussian's sum)."""
    if not events:
        return None
    import dp_accounting
    import numpy as np

    from fednet.privacy import distributed

    rel = dp_accounting.NeighboringRelation.REPLACE_ONE
    acc = dp_accounting.rdp.RdpAccountant(neighboring_relation=rel)
    orders, total = np.asarray(acc.orders, dtype=np.float64), 0.0
    for (kind, z, t, k, d), count in events:
        assert kind == "ddg", kind
        r = distributed.rho(float(z), int(t), int(k), int(d), span=2)
        if gaussian:
            acc.compose(dp_accounting.SampledWithoutReplacementDpEvent(
                population, cohort, dp_accounting.GaussianDpEvent((2 * r) ** -0.5)), int(count))
        else:
            total = total + int(count) * distributed.sampled_rdp(r, cohort / population, orders)
    if gaussian:
        return float(acc.get_epsilon(delta))
    conv = dp_accounting.rdp.rdp_privacy_accountant.compute_epsilon
    return float(conv(orders, total, delta)[0])


def parity(a: argparse.Namespace, tmp: Path, cohort: int) -> dict[str, Any]:
    """The stack under fednet launch and fednet local (seed 0, the middle epsilon), `cohort` a
    round: the same final model bit for bit, the same data bytes, the same epsilons (against
    both adversaries), and the largest gap of a reported epsilon to dp-accounting's recomputed
    from the run's events (stack_checks)."""
    eps = a.epsilons[len(a.epsilons) // 2]
    got = {rt: cell(a, tmp / f"parity-{cohort}-{rt}", "stack", cohort, a.seeds[0], eps, rt)
           for rt in ("local", "launch")}
    ok = all(g.get("status") == "completed" for g in got.values())
    gaps = [abs(g["epsilon_by_adversary"][who] - g["stack"][f"epsilon{sfx}_recomputed"])
            for g in got.values() if ok
            for who, sfx in (("server", ""), ("release", "_release"))]
    return {"cohort": cohort, "epsilon": eps, "runtimes": got, "commit": machine().get("git"),
            "same_model": ok and same_model(tmp / f"parity-{cohort}-local",
                                            tmp / f"parity-{cohort}-launch"),
            "same_bytes": ok and _data(got["local"]["bytes"]) == _data(got["launch"]["bytes"]),
            "same_epsilon": ok and got["local"]["epsilon"] == got["launch"]["epsilon"] and
            got["local"]["epsilon_by_adversary"] == got["launch"]["epsilon_by_adversary"],
            "epsilon_max_abs_gap": max(gaps) if gaps else None}


def parities_of(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A file's launch parities by cohort ("parities"; an older file's one "parity")."""
    if data.get("parities"):
        return dict(data["parities"])
    p = data.get("parity") or {}
    return {str(p["cohort"]): p} if p else {}


def parity_holds(p: dict[str, Any]) -> bool:
    """The same model, bytes and epsilons under both runtimes, and (where the record has it) the
    reported epsilons dp-accounting's recomputed from the events (to 1e-9)."""
    gap = p.get("epsilon_max_abs_gap")
    return bool(p.get("same_model") and p.get("same_bytes") and p.get("same_epsilon")
                and (gap is None or gap <= 1e-9))


def _data(b: dict[str, Any]) -> dict[str, Any]:
    """A run's byte counts but `control` (a launch's own hellos and heartbeats)."""
    return {k: v for k, v in b.items() if k != "control"}


def _ci(xs: list[float]) -> str:
    from fednet.metrics.intervals import mean_ci

    if not xs:
        return "-"
    ci = mean_ci(xs, bounds=(0.0, 1.0))
    return f"{statistics.mean(xs):.3f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")


def _cells(cells: list[dict[str, Any]], method: str, cohort: int, eps: float | None
           ) -> list[dict[str, Any]]:
    return [c for c in cells if (c["method"], c["cohort"], c["target"]) == (method, cohort, eps)
            and c.get("status") == "completed"]


def analysis(cells: list[dict[str, Any]], a: argparse.Namespace) -> dict[str, Any]:
    """Per cohort: accuracy per method and epsilon, the stack against central at epsilon 3
    (paired by seed), the epsilon check and the uplink ratio."""
    from fednet.metrics.intervals import versus

    out: dict[str, Any] = {}
    for cohort in a.cohorts:
        stack = [c for c in cells if c["method"] in STACKS and c["cohort"] == cohort
                 and c.get("status") == "completed"]
        eps_gap = [abs(c["epsilon_by_adversary"][who] - c["stack"][f"epsilon{sfx}_recomputed"])
                   for c in stack for who, sfx in (("server", ""), ("release", "_release"))
                   if c["stack"][f"epsilon{sfx}_recomputed"] is not None]
        ups = [c["stack"]["up_over_clear"] for c in stack if c["stack"]["up_over_clear"]]
        worst = max(stack, key=lambda c: c["stack"]["up_over_clear"] or 0, default=None)
        per = {"epsilon_max_abs_gap": max(eps_gap) if eps_gap else None,
               "up_over_clear_max": max(ups) if ups else None,
               "up_per_stage_worst": worst["stack"].get("up_per_stage") if worst else None}
        for eps in a.epsilons:
            for method, sfx in (("stack", ""), ("stack-tolerant", "_tolerant")):
                mine = {c["seed"]: c["accuracy"] for c in _cells(cells, method, cohort, eps)}
                for base, key in (("dp-central", "central"), ("dp-central-fedadam",
                                                               "central_fedadam")):
                    theirs = {c["seed"]: c["accuracy"] for c in _cells(cells, base, cohort, eps)}
                    if mine and theirs:
                        per[f"stack{sfx}_minus_{key}_eps_{eps:g}"] = versus(mine, theirs,
                                                                             higher=True)
        out[str(cohort)] = per
    return out


def report(cells: list[dict[str, Any]], a: argparse.Namespace) -> str:
    rows = []
    for cohort in a.cohorts:
        for method in METHODS:
            for eps in ([None] if method == "fedavg" else a.epsilons):
                cs = _cells(cells, method, cohort, eps)
                if not cs:
                    continue
                rows.append([cohort, method, "-" if eps is None else eps, len(cs),
                             _ci([c["accuracy"] for c in cs]),
                             statistics.mean(c["epsilon"] for c in cs) if eps else float("nan"),
                             statistics.mean(c["up_per_client"] for c in cs),
                             statistics.mean(c["wall_s"] for c in cs)])
    return table(["cohort", "method", "eps", "seeds", "accuracy [95% t]", "eps reported",
                  "uplink B/client/round", "wall s"], rows)


def headline(data: dict[str, Any]) -> list[dict[str, Any]]:
    """Four rows: the stack's accuracy against central DP-FedAvg's at epsilon 3 per cohort, its
    uplink over the vector in the clear (with the epsilon check), fednet launch = local."""
    an, a = data.get("analysis", {}), data.get("args", {})
    fps = sorted(data.get("fingerprints") or {})  # (METHOD-EPSILON-COHORT: seed 0's cells)
    a = {"against": "server", "central_sampling": "poisson", "survivors": 0.0, **a}  # (older)
    rows: list[dict[str, Any] | None] = []
    model = a.get("model", "mclr")
    if model != "mclr":  # (a deployment's model: the uplink row alone, CLOCKLESS fingerprints
        return measured(_uplink_row(an, fps, model, a))  # being mclr's)
    where = (f"digits mclr, {a.get('population'):,} clients, {a.get('rounds')} rounds, "
             f"{len(a.get('seeds', []))} seeds; {_adversary(a)}")
    for cohort, per in an.items():
        v = per.get("stack_minus_central_eps_3") or {}
        w = per.get("stack_minus_central_fedadam_eps_3") or {}
        tol = per.get("stack_tolerant_minus_central_eps_3") or {}
        tolerant = (f"; the stack with noise for --secagg-threshold's survivors (tolerating "
                    f"dropouts): {_ci_text(tol, True)}" if tol else "")
        mine = [n for n in fps if n.endswith(f"-{cohort}")]
        other = [] if any(n.startswith("stack-") for n in mine) else [  # (FP_COHORTS' why)
            n for n in fps if n.startswith("stack-")]
        at = "".join(f"; the stack's fingerprint at {n.rsplit('-', 1)[1]} a round" for n in other)
        mine += other
        rows.append(_fingerprinted(sorted(mine), headline_row(
            "secure aggregation", f"stack (clip, distributed noise, SecAgg+, FedAdam) accuracy "
            f"- central DP-FedAvg's at epsilon 3 ({int(cohort):,} a round)", v.get("estimate"),
            "", ">= -0.02", f"{_ci_text(v)}; against central DP with FedAdam: "
            f"{_ci_text(w, True)}{tolerant}; {where}{at}")))
    small = _uplink_row(an, fps, "mclr", a)
    if a.get("against") != "release":  # (older files: the uplink row was this file's)
        rows.append(small)
    ps = sorted(parities_of(data).values(), key=lambda p: p["cohort"])
    if ps:  # (mclr's uplink, SecAgg+'s fixed bytes dominating, is said here: the uplink row is
        rows.append(headline_row(  # the deployment's model's, bench_stack --model digits_cnn)
            "secure aggregation", "stack under fednet launch = fednet local ("
            + " and ".join(f"{p['cohort']:,}" for p in ps) + " a round: model bit for bit, "
            "bytes, epsilon)", int(all(parity_holds(p) for p in ps)), "", "1",
            "; ".join(_parity_note(p) for p in ps)
            + ("" if small is None or a.get("against") != "release" else
               f"; on mclr the uplink is {small['value']:.2f}x its vector in the clear: "
               + small["note"])))
    return measured(*rows)


def _parity_note(p: dict[str, Any]) -> str:
    """One cohort's launch parity in words: its epsilons, wall seconds and commit."""
    r = p.get("runtimes") or {}
    lo, la = r.get("local") or {}, r.get("launch") or {}
    by = lo.get("epsilon_by_adversary") or {}
    gap = p.get("epsilon_max_abs_gap")
    return (f"{p['cohort']:,} a round: " + ", ".join(
        f"{k} {v}" for k, v in (("model", p.get("same_model")), ("bytes", p.get("same_bytes")),
                                ("epsilons", p.get("same_epsilon"))))
        + (f" (released models {by['release']:.4f}, server {by['server']:.4f}"
           if {"release", "server"} <= set(by) else " (")
        + (f"; reported - dp-accounting's from the events: {gap:.2g} at most" if gap is not None
           else "") + ")"
        + (f", wall {lo['wall_s']:.0f} s local, {la['wall_s']:.0f} s launch"
           if lo.get("wall_s") and la.get("wall_s") else "")
        + (f", at {p['commit']}" if p.get("commit") else ""))


def _uplink_row(an: dict[str, Any], fps: list[str], model: str, a: dict[str, Any]
                ) -> dict[str, Any] | None:
    """The stack's uplink over its masked vector in the clear (worst cell), with the epsilon
    check and each stage's bytes. On mclr (650 values) SecAgg+'s per-client keys and shares
    dominate: that row is kept as a fingerprint without the target, which a deployment's model
    (--model digits_cnn) carries."""
    ups = [p["up_over_clear_max"] for p in an.values() if p.get("up_over_clear_max")]
    gaps = [p["epsilon_max_abs_gap"] for p in an.values()
            if p.get("epsilon_max_abs_gap") is not None]
    small = model == "mclr" and a.get("against") == "release"  # (this file's choice, stated)
    return _fingerprinted([n for n in fps if n.startswith("stack-")], headline_row(
        "secure aggregation", "stack uplink per client over its quantized vector in the clear "
        + (f"({model}, " if model != "mclr" else "(") +
        f"worst cell of {', '.join(f'{int(c):,}' for c in an)} a round)",
        max(ups) if ups else None, "x", "" if small else "<= 1.2",
        (f"reported epsilons (server, released models) - recomputed from the events: "
         f"{max(gaps):.2g} at most" if gaps else "") + _stages(an, model)
        + (f"; {a.get('rounds')} round(s), {len(a.get('seeds', []))} seed(s), "
           f"{a.get('population'):,} clients" if model != "mclr" else "")
        + ("; the uplink target is the digits_cnn row's (a deployment's model, whose update "
           "dominates the fixed per-client cost)" if small else "")))


def _stages(an: dict[str, Any], model: str = "mclr") -> str:
    """Each stage's uplink bytes per surviving client a round (the worst cell of each cohort)."""
    out = []
    for cohort, per in an.items():
        st = per.get("up_per_stage_worst") or {}
        if st:
            out.append(f"{int(cohort):,} a round: " + ", ".join(
                f"{k} {v:,.0f} B" for k, v in st.items()))
    return ("; per stage and surviving client: " + "; ".join(out)
            + (" (mclr's 650 values: SecAgg+'s per-client keys and shares dominate)"
               if model == "mclr" else "")) if out else ""


def _adversary(a: dict[str, Any]) -> str:
    """Whom the compared epsilons hold against, in words (for the rows)."""
    against, samp = a.get("against", "server"), a.get("central_sampling", "poisson")
    f = a.get("survivors") or 0
    noise = ("; the stack's noise for the whole cohort (--dp-survivors 1: z C on the sum, as "
             "central's; a round that loses a client fails)" if f == 1 else
             f"; the stack's noise for floor({f:g} m) + 1 survivors" if f else "")
    if against == "release" and samp == "fixed":
        return ("same adversary: whoever sees only the released models, replace one user, "
                "cohorts drawn without replacement on both sides (the stack's epsilon amplified "
                "by that sampling, Wang-Balle-Kasiviswanathan's general bound)" + noise)
    return (f"the stack's epsilon against the {against}"
            + (" (no amplification)" if against == "server" else "")
            + f", central's against the released models ({samp} sampling)" + noise)


def _fingerprinted(names: list[str], row: dict[str, Any] | None) -> dict[str, Any] | None:
    """The row naming the fingerprints it rests on (when it has any)."""
    return {**row, "fingerprint": names} if row and names else row


def _ci_text(v: dict[str, Any], estimate: bool = False) -> str:
    """'95% t [lo, hi]' of a versus() result (with its estimate first when asked)."""
    if v.get("estimate") is None:
        return "-"
    head = f"{v['estimate']:+.3f} " if estimate else ""
    return head + (f"95% t [{v['lo']:+.3f}, {v['hi']:+.3f}]" if v.get("lo") is not None
                   else f"{v.get('pairs')} seed")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--population", type=int, default=1400)
    ap.add_argument("--cohorts", type=int, nargs="+", default=[100, 1000])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 3.0, 8.0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--server-lr", type=float, default=0.1, help="the stack's FedAdam")
    ap.add_argument("--clip", type=float, default=2.0)
    ap.add_argument("--delta", type=float, default=1e-6)
    ap.add_argument("--against", default="release", choices=("release", "server"),
                    help="the stack's --dp-against: whom its --dp-epsilon holds against")
    ap.add_argument("--survivors", type=float, default=1.0, help="the stack's --dp-survivors "
                    "(1: noise for the whole cohort, as the paper's experiments; stack-tolerant "
                    "takes the default, --secagg-threshold's)")
    ap.add_argument("--central-sampling", default="fixed", choices=("fixed", "poisson"),
                    help="central DP's --dp-sampling (fixed: the stack's own cohorts, drawn "
                    "without replacement; replace-one epsilons on both sides)")
    ap.add_argument("--parity-cohort", type=int, nargs="+", default=[100],
                    help="the cohorts of the launch parity runs (0: none)")
    ap.add_argument("--parity-only", action="store_true", help="run the launch parity alone: "
                    "--reuse's cells and fingerprints are kept as they were")
    ap.add_argument("--model", default="mclr", help="digits' model (not mclr: the uplink row "
                    "alone, no fingerprints)")
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    ap.add_argument("--reuse", default="", help="a JSON of this script: its cells that this "
                    "run does not run again are kept (and its launch run, with --parity-cohort "
                    "0); its command is recorded under 'reused'")
    ap.add_argument("--json", default="")
    ap.add_argument("--fingerprints-only", action="store_true", help="add the fingerprints of "
                    "--json's own cells to it, its rows and their command kept (no cell re-run)")
    a = ap.parse_args()
    if a.fingerprints_only:
        if not a.json:
            raise SystemExit("--fingerprints-only needs --json F (the file to add them to)")
        return fingerprints_only(a)
    if a.parity_only and not (a.reuse and any(a.parity_cohort)):
        raise SystemExit("--parity-only needs --reuse F (the cells kept) and --parity-cohort N")
    old = json.loads(Path(a.reuse).read_text()) if a.reuse else {}
    plan = [] if a.parity_only else [
        (method, cohort, seed, eps) for cohort in a.cohorts for seed in a.seeds
        for method in a.methods for eps in ([None] if method == "fedavg" else a.epsilons)]
    cells: list[dict[str, Any]] = [c for c in old.get("results", []) if (
        c["method"], c["cohort"], c["seed"], c["target"]) not in set(plan)]
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        for method, cohort, seed, eps in plan:
            c = cell(a, tmp / f"{method}-{cohort}-{seed}-{eps}", method, cohort, seed, eps)
            print(f"{method} cohort {cohort} seed {seed} eps {eps}: {c.get('status')} acc "
                  f"{c.get('accuracy')} eps {c.get('epsilon')} {c['wall_s']:.0f}s", flush=True)
            cells.append(c)
        pars = parities_of(old)
        for cohort in (c for c in a.parity_cohort if c):
            pars[str(cohort)] = parity(a, tmp, cohort)
    a.seeds = sorted({c["seed"] for c in cells})  # (with --reuse: the seeds of every cell,
    a.cohorts = sorted({c["cohort"] for c in cells})  # its cohorts and epsilons)
    a.epsilons = sorted({c["target"] for c in cells if c["target"] is not None})
    data: dict[str, Any] = {"args": vars(a), "machine": machine(), "results": cells,
                            "parities": pars, "analysis": analysis(cells, a),
                            "fingerprints": old.get("fingerprints", {}) if a.parity_only else
                            fingerprints(a, cells) if a.model == "mclr" else {}}
    if a.parity_only and old.get("fingerprinted"):  # (the kept fingerprints' own record)
        data["fingerprinted"] = old["fingerprinted"]
    if old:  # where the reused cells came from (their own command, commit and date)
        data["reused"] = {k: old.get(k) for k in ("command", "commit", "date", "reused")}
    print(report(cells, a))
    for p in pars.values():
        print({k: v for k, v in p.items() if k != "runtimes"})
    for cohort, per in data["analysis"].items():
        print(cohort, {k: v for k, v in per.items()})
    write_json(a.json, data, headline)


if __name__ == "__main__":
    main()
