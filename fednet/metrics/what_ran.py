"""What a run ran beyond its algorithm, as the end-of-run table and `fednet report` show it:
the attack and defense with their parameters, secure aggregation (protocol, parameters, stages,
overhead against the clear update) and differential privacy."""
from __future__ import annotations

from typing import Any

from fednet.metrics.progress import human_bytes
from fednet.config import RunConfig


def adversary_info(cfg: RunConfig) -> dict[str, str]:
    """run_info's attack (with --malicious), defense and secure aggregation, where they ran."""
    out = {}
    if cfg.attack.name != "none":
        out["attack"] = with_params(cfg.attack.name, cfg.attack.params)
        out["malicious"] = str(cfg.attack.malicious)
    if cfg.defense.name != "none":
        out["defense"] = with_params(cfg.defense.name, cfg.defense.params)
    if cfg.net.secagg != "off":
        out["secagg"] = cfg.net.secagg
    return out


def robust_rows(s: dict[str, Any]) -> list[tuple[str, str]]:
    """--attack and --defense: the attack and its malicious clients, the defense, the
    backdoor's final success rate."""
    rows = []
    a, d = s.get("attack"), s.get("defense")
    if isinstance(a, dict):
        spec = f" (--malicious {a['malicious_spec']})" if a.get("malicious_spec") else ""
        rows.append(("attack", f"{with_params(a.get('name'), a.get('params'))}, "
                               f"{len(a.get('malicious') or [])} malicious{spec}"))
    if isinstance(d, dict):
        rows.append(("defense", with_params(d.get("name"), d.get("params"))))
    if "final_attack_success" in s:
        asr = s.get("final_attack_success")
        rows.append(("attack success (final)", "-" if asr is None else f"{100 * float(asr):.2f}%"))
    return rows


def short(v: object) -> str:
    """A value as a label shows it: floats to 3 significant digits (0.814), the rest as is."""
    if isinstance(v, float):
        return f"{v:.3g}"
    return str(v)


def with_params(name: Any, params: Any) -> str:
    """'median', 'ipm(eps=0.5)': a name and its --param values, rounded."""
    kv = ", ".join(f"{k}={short(v)}" for k, v in sorted((params or {}).items()))
    return f"{name}({kv})" if kv else str(name)


SECAGG_NAMES = {"full": "SecAgg (full)", "plus": "SecAgg+ (plus)"}


def _stages(d: dict[str, Any], fmt: Any) -> str:
    return ", ".join(f"{k} {fmt(v)}" for k, v in d.items())


def _quantization(sa: dict[str, Any]) -> str:
    """How a masked value was quantized: --secagg-bits, or the --compress codec's common grid
    sent packed in its wire bits (summary.json's secagg codec and wire_bits)."""
    if not sa.get("codec"):
        return f"--secagg-bits {sa.get('bits')}"
    wb = "/".join(str(b) for b in sa.get("wire_bits") or [])
    return f"--compress {sa['codec']} on a common grid" + (f", {wb} bits a value sent" if wb else "")


def _plus_options(sa: dict[str, Any]) -> str:
    """SecAgg+'s neighbours asked (else the dropout rate its k was sized for), --secagg-drop."""
    out = ""
    if sa.get("mode") == "plus":
        out = (f", --secagg-neighbours {sa['neighbours_asked']}" if sa.get("neighbours_asked")
               else f", --secagg-dropout {short(sa.get('dropout'))}")
    return out + (f", --secagg-drop {sa['drop']}" if sa.get("drop") else "")


def secagg_rows(sa: Any, rounds: Any = None) -> list[tuple[str, str]]:
    """--secagg's rows (summary.json's `secagg`): the protocol and its parameters, the clients
    after each stage, per-stage bytes and CPU seconds, failed rounds and the overhead of the
    update path against the clear float updates."""
    if not isinstance(sa, dict):
        return []
    ks = sa.get("neighbours") or []
    k = "-" if not ks else str(ks[0]) if len(ks) == 1 else f"{ks[0]}-{ks[-1]}"
    fb = sa.get("field_bits") or []
    field = "/".join(str(b) for b in fb) + "-bit field" if fb else "field not reached"
    n = max(1, int(sa.get("rounds") or rounds or 1))  # the rounds its rows describe
    by = sa.get("bytes_by_stage") or {}
    fail = sa.get("last_failure") or {}
    mode = str(sa.get("mode"))
    every = " (all the others)" if mode == "full" else ""
    rows = [("secure aggregation", f"{SECAGG_NAMES.get(mode, mode)}, "
                                   f"k = {k} neighbours per client{every}"),
            ("secagg parameters", f"{field}, {_quantization(sa)}, --secagg-clip "
                                  f"{short(sa.get('clip'))}, --secagg-threshold "
                                  f"{short(sa.get('threshold'))}"
                                  + _plus_options(sa)),
            ("secagg clients per round", " -> ".join(
                f"{k2} {v / n:.3g}" for k2, v in (sa.get("clients_by_stage") or {}).items())),
            ("secagg bytes by stage", _stages({k2: sum(v.values()) for k2, v in by.items()},
                                              lambda v: human_bytes(float(v)))),
            ("secagg simulated time", _stages(sa.get("sim_s") or {}, lambda v: f"{v:.3f}s")),
            ("secagg server CPU", _stages(sa.get("server_cpu_s") or {}, lambda v: f"{v:.3f}s")),
            ("secagg client CPU", _stages(sa.get("client_cpu_s") or {}, lambda v: f"{v:.3f}s")
             + " (input: training included)"),
            ("secagg failed rounds", f"{sa.get('failed_rounds', 0)} of {sa.get('rounds', 0)}"
             + (f" (last: round {int(fail.get('round', -1)) + 1}: {fail.get('why')})"
                if fail else ""))]
    ov = sa.get("overhead")
    rows.append(("secagg overhead", "-" if ov is None else (
        f"{ov:.3f} x the clear update ({human_bytes(float(sa.get('update_bytes', 0)))} for "
        f"{sa.get('uploads')} updates, {human_bytes(float(sa.get('clear_bytes', 0)))} in the "
        "clear)")))
    return rows


def _eps(v: object) -> str:
    return f"{float(v):.4g}" if isinstance(v, (int, float)) else "-"


def privacy_rows(dp: dict[str, Any]) -> list[tuple[str, str]]:
    """Differential privacy's rows (summary.json's `dp`): the user-level epsilon at its delta
    and how it was reached, DP-SGD's per-example epsilon."""
    rows = []
    if dp.get("mode"):
        how = (f"{dp['mode']}, {dp.get('sampling', '')} sampling" if dp["mode"] == "central"
               else dp["mode"])
        rows += [("privacy (user)", f"epsilon {_eps(dp.get('epsilon'))} at delta "
                  f"{dp.get('delta', 0):.3g} ({how}, {dp.get('accountant')}"
                  + (f"; neighbours: {dp['relation']}" if dp.get("relation") else "") + ")"),
                 ("noise multiplier", f"{dp.get('noise_multiplier', 0):.4g}"
                  + (" (calibrated)" if dp.get("noise_calibrated") else "")
                  + f", clip {dp.get('clip', 0):.4g}")]
    rows += _by_adversary(dp)
    if dp.get("budget"):
        rows.append(("privacy budget", f"epsilon {dp['budget']:g}"))
    rows += [("privacy remark", str(r)) for r in dp.get("remarks") or []]
    if dp.get("non_finite_results"):
        rows.append(("privacy: NaN/inf results", f"{dp['non_finite_results']} (the noise is the "
                                                  "likely cause: see the remark)"))
    sgd = dp.get("sgd")
    if sgd:
        rows.append(("privacy (example)", f"epsilon {_eps(sgd.get('epsilon'))} at delta "
                     f"{sgd.get('delta', 0):.3g} (DP-SGD, the most exposed client)"))
    return rows


ADVERSARY_LABEL = {"release": "released models", "server": "server"}


def _by_adversary(dp: dict[str, Any]) -> list[tuple[str, str]]:
    """--dp distributed: one row per adversary (summary.json's dp.epsilon_by_adversary), each
    with whom it holds against and its neighbouring relation (dp.relation_by_adversary), and
    why they differ (dp.relations_note) where the released models' epsilon exceeds the
    server's: the two relations differ, which reads as a bug unless said."""
    by, words = dp.get("epsilon_by_adversary") or {}, dp.get("relation_by_adversary") or {}
    rows = [(f"epsilon vs {ADVERSARY_LABEL.get(who, who)}", f"{_eps(by[who])} at delta "
             f"{dp.get('delta', 0):.3g}" + (f" ({words[who]})" if words.get(who) else ""))
            for who in ("release", "server") if who in by]
    rel, srv = by.get("release"), by.get("server")
    if (isinstance(rel, (int, float)) and isinstance(srv, (int, float)) and rel > srv
            and dp.get("relations_note")):
        rows.append(("epsilon: release > server", str(dp["relations_note"])))
    return rows
