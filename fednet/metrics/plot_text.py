"""The words on a plot: titles (what ran, attack and defense included), labels named by their
option and rounded (`--dp-noise 0.814`), the caption, and a legend kept inside the figure."""
from __future__ import annotations

from typing import Any

INFO = ("algorithm", "dataset", "partition", "clients")


ADVERSARY = ("attack", "defense", "secagg")  # run_info's keys named by their option


def info_text(key: str, v: object) -> str:
    """One run_info value as a title or label says it: '--attack signflip' (--malicious too),
    'partition shards', the algorithm's name as is."""
    if key in ADVERSARY:
        return f"--{key} {v or ('off' if key == 'secagg' else 'none')}"
    return str(v) if key == "algorithm" else f"{key} {v}"


def describe(info: dict[str, str], keys: tuple[str, ...] = ("algorithm", "dataset", "partition",
                                                           "clients", *ADVERSARY)) -> str:
    """'fedavg, digits shards, 100 clients, --attack signflip --malicious 0.2, --defense median'
    from run_info (the keys given)."""
    parts = []
    if "algorithm" in keys and info.get("algorithm"):
        parts.append(info["algorithm"])
    data = " ".join(info[k] for k in ("dataset", "partition") if k in keys and info.get(k))
    if data:
        parts.append(data)
    if "clients" in keys and info.get("clients"):
        parts.append(f"{info['clients']} clients")
    for k in ADVERSARY:
        if k in keys and info.get(k):
            more = f" --malicious {info['malicious']}" if k == "attack" and info.get(
                "malicious") else ""
            parts.append(info_text(k, info[k]) + more)
    return ", ".join(parts)


def wrap(text: str, width: int) -> str:
    """Lines of at most `width` characters, broken after '; ' or ', ' where it can."""
    import re
    import textwrap

    kept = re.sub(r"(--[\w-]+) ", "\\1\0", text)  # an option and its value stay on one line
    lines = textwrap.wrap(kept, width, break_on_hyphens=False) if text else [text]
    return "\n".join(lines).replace("\0", " ")


_WHERE = ("net.host", "net.port", "net.round_timeout", "net.register_timeout", "out", "track",
          "gpus", "train.threads", "plugins", "data.data_root", "data.download", "target",
          "population_file", "liveness.")
"""Settings that say where and how a run's processes ran or what it reports, not what it
computed: never a label (--target is its dashed line)."""


_BY_INFO = {"algo.name", "data.partition", "data.dataset", "clients", "tuned", "attack.name",
            "defense.name", "net.secagg"}
"""Config keys a label names through run_info (attack and defense with their parameters)."""


def _digits(values: list[Any]) -> int:
    """The fewest significant digits, at least 3, that tell these floats apart."""
    floats = {v for v in values if isinstance(v, float)}
    return next((d for d in range(3, 17) if len({f"{v:.{d}g}" for v in floats}) == len(floats)),
                17)


def option_text(key: str, v: object, digits: int = 3) -> str:
    """A setting as its option says it, rounded: 'train.lr' 0.05 -> '--lr 0.05', 'dp.noise'
    0.8137163970503462 -> '--dp-noise 0.814', 'algo.params.mu' -> '--param mu=0.01',
    'data.permute' True -> '--permute'."""
    from fednet.config import declaration

    val = f"{v:.{digits}g}" if isinstance(v, float) else str(v) if v not in ("", None) else "none"
    parts = key.split(".")
    if len(parts) > 2 and parts[-2] == "params":
        return f"--param {parts[-1]}={val}"
    try:
        names = declaration(key).names()
    except StopIteration:  # a key no setting declares (an older or newer fednet's)
        return f"{parts[-1]} {val}"
    if isinstance(v, bool) and names:
        return names[0] if v else names[1] if len(names) > 1 else f"no {names[0]}"
    return f"{names[0]} {val}" if names else f"{parts[-1]} {val}"


def label_curves(series: list[dict[str, Any]]) -> None:
    """Each label names what tells its curve apart: the settings that differ between the runs
    (by their option, rounded), the number of seeds, a status other than completed, seeds of
    unequal length."""
    if len({s["info"].get("eval", "global") for s in series}) > 1:
        for s in series:
            s["label"] += ", mean client accuracy" if s["info"].get("eval") == "clients" else ""
    differ = [k for k in (*INFO, *ADVERSARY) if len({s["info"].get(k) for s in series}) > 1]
    confs = [s["config"] for s in series if s["config"]]
    keys = sorted(k for k in {k for c in confs for k in c}
                  if len({repr(d.get(k)) for d in confs}) > 1 and k not in _BY_INFO
                  and not k.startswith(_WHERE + ("attack.params.", "defense.params.")))
    digits = {k: _digits([c.get(k) for c in confs]) for k in keys}
    for s in series:
        more = [t for k in differ if (t := info_text(k, s["info"].get(k))) not in s["label"]
                and str(s["info"].get(k)) not in s["label"]]
        more += [option_text(k, s["config"].get(k), digits[k]) for k in keys if s["config"]]
        s["label"] += f" [{', '.join(more)}]" if more else ""
        if len(s["runs"]) > 1:
            s["label"] += f", {len(s['runs'])} seeds"
        bad = [st for st in s["statuses"] if st != "completed"]
        bad += [f["kind"] for f in s.get("flags", []) if f]  # metrics/seed_health.py
        if bad:
            s["label"] += " (" + ", ".join(f"{bad.count(b)} {b}" if len(s["runs"]) > 1 else b
                                           for b in dict.fromkeys(bad)) + ")"
        n = min(len(r) for r in s["runs"])
        if n < max(len(r) for r in s["runs"]):  # seeds of unequal length: said, not hidden
            s["label"] += f", first {n} rounds (the shortest seed)"


def caption(fig: Any, title: str) -> None:
    """The suptitle: the shared description, then what the marks mean, wrapped to the figure."""
    width = int(fig.get_figwidth() * 72 / (10 * 0.6))  # characters of 10 pt across the figure
    head, _, rest = title.partition("; ")
    lines = [wrap(head, width), wrap(rest, width)] if rest else [wrap(head, width)]
    text = "\n".join(ln for ln in lines if ln)
    fig.set_figheight(fig.get_figheight() + 0.17 * text.count("\n"))
    fig.suptitle(text, fontsize=10)


def legend(fig: Any, ax: Any, n: int) -> Any:
    """The curves' legend below the panels, inside the figure: labels wrapped to their column
    and fewer columns until it fits the figure's width (measured once drawn)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)  # a renderer to measure the legend with
    handles, labels = ax.get_legend_handles_labels()
    height, leg = fig.get_figheight(), None
    for ncols in range(min(n, 3), 0, -1):
        width = int(fig.get_figwidth() * 72 / ncols / (8 * 0.6)) - 8  # 8 pt characters, handle
        wrapped = [wrap(lab, width) for lab in labels]
        lines = sum(max(w.count("\n") + 1 for w in wrapped[i:i + ncols])
                    for i in range(0, len(wrapped), ncols))
        if leg is not None:
            leg.remove()
        fig.set_figheight(height + 0.16 * lines)
        leg = fig.legend(handles, wrapped, fontsize=8, loc="outside lower center", ncols=ncols)
        fig.draw_without_rendering()
        if inside(leg.get_window_extent(), fig.bbox):
            break
    return leg


def inside(box: Any, outer: Any, slack: float = 1.0) -> bool:
    """A bounding box lies within another (display units, `slack` pixels of rounding)."""
    return (box.x0 >= outer.x0 - slack and box.y0 >= outer.y0 - slack
            and box.x1 <= outer.x1 + slack and box.y1 <= outer.y1 + slack)
