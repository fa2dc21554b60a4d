"""Statistics over seeds for a sweep's table: a 95% confidence interval of a mean (Student's t,
clipped to the metric's possible range),
and a method against the baseline paired by seed (the seeds where both reached the metric): the
difference of accuracies, or the ratio baseline / method of a *_to metric (a speed-up), each with
its 95% interval and the two-sided paired t-test's p-value (on log ratios for a ratio)."""
from __future__ import annotations

import math
import statistics
from typing import Any

LEVEL = 0.95


def t_quantile(df: int, level: float = LEVEL) -> float:
    """The two-sided Student's t critical value (df >= 1)."""
    from scipy.stats import t

    return float(t.ppf(0.5 + level / 2, df))


def t_p_value(t_stat: float, df: int) -> float:
    """The two-sided p-value of a t statistic."""
    from scipy.stats import t

    return float(2 * t.sf(abs(t_stat), df))


def mean_ci(vals: list[float], level: float = LEVEL,
            bounds: tuple[float, float] = (-math.inf, math.inf)) -> tuple[float, float] | None:
    """The t interval of the mean, clipped to `bounds`, the values' possible range (an accuracy
    in [0, 1], a count of rounds >= 0: a t interval of few seeds can reach past it, and no mean
    can); None with fewer than 2 values."""
    if len(vals) < 2:
        return None
    m, sd = statistics.fmean(vals), statistics.stdev(vals)
    half = t_quantile(len(vals) - 1, level) * sd / math.sqrt(len(vals))
    return max(bounds[0], m - half), min(bounds[1], m + half)


def _paired(d: list[float], bounds: tuple[float, float] = (-math.inf, math.inf)
            ) -> tuple[float, tuple[float, float] | None, float | None]:
    """Mean of paired differences, its t interval (clipped to bounds) and the t-test's p (None:
    fewer than 2 pairs; p None as well when every difference is the same, where the test says
    nothing)."""
    m = statistics.fmean(d)
    if len(d) < 2:
        return m, None, None
    sd = statistics.stdev(d)
    if sd == 0:
        return m, (m, m), None
    return m, mean_ci(d, bounds=bounds), t_p_value(m / (sd / math.sqrt(len(d))), len(d) - 1)


def versus(mine: dict[Any, float | None], base: dict[Any, float | None], higher: bool
           ) -> dict[str, Any]:
    """A method's per-seed values against the baseline's, paired by seed. 'pairs': the seeds
    where both have a value; 'estimate': mean difference (higher=True: accuracies) or geometric
    mean of baseline / method (a *_to metric: > 1 means the method gets there sooner); 'lo',
    'hi': its 95% interval; 'p': the paired t-test (None where it cannot be computed)."""
    seeds = [s for s in mine if s in base and mine[s] is not None and base[s] is not None]
    out: dict[str, Any] = {"pairs": len(seeds), "seeds": len(set(mine) | set(base)),
                           "estimate": None, "lo": None, "hi": None, "p": None}
    if not seeds:
        return out
    if higher:
        d = [float(mine[s]) - float(base[s]) for s in seeds]  # type: ignore[arg-type]  # seeds: both have a number
        est, ci, p = _paired(d, (-1.0, 1.0))  # a difference of two rates
        out.update(estimate=est, p=p, lo=ci and ci[0], hi=ci and ci[1])
        return out
    if any(not (mine[s] > 0 and base[s] > 0) for s in seeds):  # type: ignore[operator]  # seeds: both have a number
        return out  # a ratio needs positive values
    d = [math.log(float(base[s]) / float(mine[s])) for s in seeds]  # type: ignore[arg-type]  # seeds: both have a number
    est, ci, p = _paired(d)
    out.update(estimate=math.exp(est), p=p, lo=ci and math.exp(ci[0]), hi=ci and math.exp(ci[1]))
    return out


def fmt_versus(v: dict[str, Any], higher: bool) -> str:
    """'+0.0123 [-0.0040, +0.0286]' or '1.79x [1.21, 2.65]'; '-' where no seed pairs;
    'baseline' on the baseline's own row."""
    if v.get("baseline"):
        return "baseline"
    if v["estimate"] is None:
        return "-"
    if higher:
        text = f"{v['estimate']:+.4f}"
        return text + (f" [{v['lo']:+.4f}, {v['hi']:+.4f}]" if v["lo"] is not None else "")
    text = f"{v['estimate']:.2f}x"
    return text + (f" [{v['lo']:.2f}, {v['hi']:.2f}]" if v["lo"] is not None else "")


def fmt_p(p: float | None) -> str:
    return "-" if p is None else "<0.001" if p < 0.001 else f"{p:.3f}"
