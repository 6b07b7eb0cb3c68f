"""Is a new series slower than its history, beyond the noise? Three verdicts, decided by an
interval suited to the repetitions at hand.

The data are two samples of throughput (samples/s): the new series' repetitions and its
baseline's (the last good run of the same configuration: dlscale.decisions.history). The
change is measured on the log scale, where a slowdown is a shift: d = log(new) - log(base), so
that exp(d) is the ratio new / base and 1 - exp(d) the slowdown.

- **Estimate**: the Hodges-Lehmann shift, the median of the n x m pairwise differences
  log(new_i) - log(base_j). Robust to one wild repetition, and as efficient as the difference
  of means under normal noise (95 %).
- **Interval**: the distribution-free interval that goes with it (the Mann-Whitney inversion):
  the k-th smallest and k-th largest pairwise differences, k from the exact null distribution
  of the Mann-Whitney U statistic (`mann_whitney_counts`; scipy.stats.mannwhitneyu's exact
  p-values are the same numbers), where n x m <= EXACT_PAIRS, else its normal approximation.
  Its coverage holds for any continuous noise, at any n: no normality, no bootstrap (which
  undercovers at n = 6). At LEVEL = 90 % two-sided, each bound is a one-sided 95 % confidence
  bound, as in an equivalence test (TOST).
- **Too few repetitions**: with 2 per side no such interval reaches 90 % (its widest one, the
  range of the differences, covers 67 %); then there is no interval, and the verdict says so.

Verdicts against a threshold t on the slowdown (default THRESHOLD, 5 %):

- PASS: the upper bound on the slowdown is below t (the new series is at most t slower);
- FAIL: the lower bound on the slowdown is above 0 and the estimate is above t (slower beyond
  the noise, and by more than t); the size of the change and its interval are reported;
- UNCERTAIN: neither; `needed_n` is the number of repetitions per side at which the interval,
  at the noise observed (pooled spread of the log values), would be narrow enough to decide
  (the normal approximation of the Hodges-Lehmann estimator's spread).

benchmarks/history_database.py measures the verdicts on synthetic series (2 % noise: 10 %
slower at n = 6 per side FAIL, unchanged PASS, each in >= 95 % of 200 seeded trials; n = 2
UNCERTAIN). Pure Python with numpy and scipy.stats (normal quantiles).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
from scipy.stats import norm

PASS, FAIL, UNCERTAIN = "PASS", "FAIL", "UNCERTAIN"
VERDICTS = (FAIL, UNCERTAIN, PASS)
THRESHOLD = 0.05  # slowdown, a fraction of the baseline's throughput
LEVEL = 0.90  # two-sided: each bound a one-sided 95 % bound
EXACT_PAIRS = 2500  # n x m up to which the exact Mann-Whitney distribution is used
MAX_NEEDED_N = 1000  # needed_n beyond this is reported as more than this
METHOD = (
    "Hodges-Lehmann shift of log throughput with its Mann-Whitney interval "
    f"({LEVEL:.0%} two-sided: one-sided 95 % bounds)"
)


@functools.lru_cache(maxsize=256)
def mann_whitney_counts(n: int, m: int) -> tuple[int, ...]:
    """How many of the C(n + m, n) equally likely orderings of two samples of sizes n and m
    give each value u = 0 .. n m of the Mann-Whitney statistic (no ties): the coefficients of
    the Gaussian binomial [n + m choose n]_q, as prod_i (1 - q^(m+i)) / (1 - q^i)."""
    coef = [1]
    for i in range(1, n + 1):
        step = m + i
        grown = coef + [0] * step
        for k, c in enumerate(coef):  # x (1 - q^(m+i))
            grown[k + step] -= c
        for k in range(i, len(grown)):  # / (1 - q^i), exact
            grown[k] += grown[k - i]
        while len(grown) > 1 and grown[-1] == 0:
            grown.pop()
        coef = grown
    return tuple(coef)


@functools.lru_cache(maxsize=4096)
def order_index(n: int, m: int, level: float = LEVEL) -> int | None:
    """The k (1-based) such that the k-th smallest and k-th largest of the n m pairwise
    differences bound the shift with coverage >= `level`; None when no such k exists (too few
    repetitions)."""
    alpha = (1 - level) / 2 + 1e-12  # 3 vs 3 reaches 90 % exactly: no float round-off
    pairs = n * m
    if pairs == 0:
        return None
    if pairs <= EXACT_PAIRS:
        counts = mann_whitney_counts(n, m)
        total = sum(counts)
        below, k = 0, 0
        for c in counts:  # the largest k with P(U <= k - 1) <= alpha
            if (below + c) / total > alpha:
                break
            below += c
            k += 1
        return k or None
    z = norm.ppf(1 - alpha)
    k = math.floor(pairs / 2 - z * math.sqrt(pairs * (n + m + 1) / 12))
    return k if k >= 1 else None


@dataclass(frozen=True)
class Shift:
    """A log-ratio shift: estimate and interval (None: too few repetitions for one)."""

    estimate: float
    low: float | None
    high: float | None
    n_new: int
    n_base: int
    coverage: float | None  # the interval's exact coverage (exact method), else the level

    @property
    def ratio(self) -> float:
        return math.exp(self.estimate)


def shift_interval(new, base, level: float = LEVEL) -> Shift:
    """The Hodges-Lehmann shift of log(new) against log(base) and its Mann-Whitney interval."""
    x = np.log(np.asarray([v for v in new if v and v > 0], dtype=float))
    y = np.log(np.asarray([v for v in base if v and v > 0], dtype=float))
    if not len(x) or not len(y):
        raise ValueError("both series need at least one positive value")
    diffs = np.sort((x[:, None] - y[None, :]).ravel())
    estimate = float(np.median(diffs))
    k = order_index(len(x), len(y), level)
    if k is None:
        return Shift(estimate, None, None, len(x), len(y), None)
    coverage = exact_coverage(len(x), len(y), k) if len(diffs) <= EXACT_PAIRS else level
    return Shift(estimate, float(diffs[k - 1]), float(diffs[-k]), len(x), len(y), coverage)


@functools.lru_cache(maxsize=4096)
def exact_coverage(n: int, m: int, k: int) -> float:
    """The coverage of the interval between the k-th smallest and k-th largest differences."""
    counts = mann_whitney_counts(n, m)
    return 1 - 2 * sum(counts[:k]) / sum(counts)


def pooled_log_sd(new, base) -> float | None:
    """The noise: the pooled standard deviation of the log values within each side (None
    where neither side has two values)."""
    parts = [np.log(np.asarray(s, dtype=float)) for s in (new, base)]
    dof = sum(len(p) - 1 for p in parts if len(p) > 1)
    if dof <= 0:
        return None
    ss = sum(float(((p - p.mean()) ** 2).sum()) for p in parts if len(p) > 1)
    return math.sqrt(ss / dof)


def needed_repetitions(shift: Shift, sd: float | None, threshold: float, level: float) -> int:
    """Repetitions per side at which the interval, at noise `sd`, would decide: its half-width
    (z x sd x sqrt(pi/3) x sqrt(2/k), the Hodges-Lehmann estimator's spread under normal
    noise) below the distance from the estimate to the bound that decides (PASS: the
    threshold, FAIL: no change). At least the smallest n with an interval at `level`."""
    smallest = next(k for k in range(2, 100) if order_index(k, k, level) is not None)
    bound = math.log(1 - threshold)  # the log ratio of a slowdown of exactly `threshold`
    margin = shift.estimate - bound if shift.estimate > bound else -shift.estimate
    if sd is None or sd == 0:
        return smallest
    if margin <= 0:
        return MAX_NEEDED_N + 1
    z = norm.ppf(1 - (1 - level) / 2)
    k = math.ceil(2 * (z * sd * math.sqrt(math.pi / 3) / margin) ** 2)
    return min(max(k, smallest), MAX_NEEDED_N + 1)


@dataclass(frozen=True)
class Verdict:
    """One comparison: the verdict, the slowdown (a fraction: 0.1 is 10 % slower, negative is
    faster) with its interval, the repetitions, and why."""

    verdict: str
    slowdown: float
    slowdown_low: float | None
    slowdown_high: float | None
    n_new: int
    n_base: int
    threshold: float
    needed_n: int | None
    reason: str

    def as_dict(self) -> dict:
        return {
            "verdict": self.verdict,
            "slowdown": self.slowdown,
            "slowdown_low": self.slowdown_low,
            "slowdown_high": self.slowdown_high,
            "n": self.n_new,
            "n_baseline": self.n_base,
            "threshold": self.threshold,
            "needed_n": self.needed_n,
            "reason": self.reason,
        }


def _pct(x: float) -> str:
    return f"{x * 100:.1f} %"


def slowdown_verdict(new, base, threshold: float = THRESHOLD, level: float = LEVEL) -> Verdict:
    """PASS, FAIL or UNCERTAIN for throughputs `new` against `base` (module docstring)."""
    if not 0 < threshold < 1:
        raise ValueError(f"threshold {threshold}: a fraction between 0 and 1")
    shift = shift_interval(new, base, level)
    slowdown = 1 - math.exp(shift.estimate)
    n = f"n = {shift.n_new} new vs {shift.n_base} baseline"
    if shift.low is None:
        sd = pooled_log_sd(new, base)
        needed = needed_repetitions(shift, sd, threshold, level)
        return Verdict(
            UNCERTAIN,
            slowdown,
            None,
            None,
            shift.n_new,
            shift.n_base,
            threshold,
            needed,
            f"{_change(slowdown)}, but {n} give no {level:.0%} interval; "
            f"{_needed_text(needed, sd)}",
        )
    low, high = 1 - math.exp(shift.high), 1 - math.exp(shift.low)  # slowdown bounds
    interval = f"{level:.0%} interval {_pct(low)} to {_pct(high)} slower, {n}"
    if high < threshold:
        return Verdict(
            PASS,
            slowdown,
            low,
            high,
            shift.n_new,
            shift.n_base,
            threshold,
            None,
            f"{_change(slowdown)} ({interval}): at most {_pct(high)} slower, below the "
            f"{_pct(threshold)} threshold",
        )
    if low > 0 and slowdown > threshold:
        return Verdict(
            FAIL,
            slowdown,
            low,
            high,
            shift.n_new,
            shift.n_base,
            threshold,
            None,
            f"{_change(slowdown)} ({interval}): slower beyond the noise and by more than "
            f"the {_pct(threshold)} threshold",
        )
    sd = pooled_log_sd(new, base)
    needed = needed_repetitions(shift, sd, threshold, level)
    return Verdict(
        UNCERTAIN,
        slowdown,
        low,
        high,
        shift.n_new,
        shift.n_base,
        threshold,
        needed,
        f"{_change(slowdown)} ({interval}): neither below the {_pct(threshold)} threshold nor "
        f"beyond it and the noise; {_needed_text(needed, sd)}",
    )


def _change(slowdown: float) -> str:
    if slowdown >= 0:
        return f"{_pct(slowdown)} slower"
    return f"{_pct(-slowdown)} faster"


def _needed_text(needed: int, sd: float | None) -> str:
    if not sd:
        return (
            f"the noise is unknown (one repetition per side): {needed} repetitions per side "
            "give an interval, how many decide depends on the noise they show"
        )
    noise = f"at the noise observed ({_pct(sd)})"
    if needed > MAX_NEEDED_N:
        return f"{noise}, more than {MAX_NEEDED_N} repetitions per side would decide"
    return f"{noise}, about {needed} repetitions per side would decide"
