"""The noise of a throughput: its spread, the digits it supports, and whether two points differ.

A point's spread is the interquartile range of its timed trials turned into the rate's units
(the record keeps every trial's time, ``times_s``), widened to the range of the point's runs
where a records folder holds it more than once (a re-run with ``rerun``): what a table's spread
column and a figure's error bar show. A difference between two points is stated with a confidence
interval of the ratio of their medians (``ratio_ci``: a seeded bootstrap over each point's trials
and runs) and called one only when that interval excludes 1; otherwise it is "within noise",
said with the interval. A point is its key (``results.point_key_of``). This is the one place those
rules live: the study tables, the figures' error bars and the findings (notebook and report) all
read them here.

This module imports nothing of accel-kit but ``results`` and ``timing``: any layer may read it.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Iterable

import pandas as pd

from accel_kit import results
from accel_kit.timing import iqr  # the one quartile rule (a record's time_iqr_s too)

#: The rates a record may carry (each ``<rate>_lo`` / ``<rate>_hi`` / ``<rate>_spread`` beside it).
RATES = ("tokens_per_s", "tokens_per_s_per_device", "samples_per_s", "samples_per_s_mean", "tflops",
         "tflops_per_device")

SPREAD_DOC = ("spread: the interquartile range of the point's timed trials, widened to the range of its runs "
              "where it was measured more than once; a blank spread: one trial and one run, noise not measured")


def trial_rates(rate: float, times_s: Iterable[float]) -> list[float]:
    """Each trial's rate, from the point's median rate and its trials' times (rate is work / time,
    and the record's rate is over the median time)."""
    times = [float(t) for t in (times_s or []) if t and t > 0]
    if rate is None or not times or not math.isfinite(rate):
        return []
    median = statistics.median(times)
    return [rate * median / t for t in times]


def _interval(rate: float, times_s) -> tuple[float, float] | None:
    """The trials' interquartile interval of the rate; None for fewer than 2 trials."""
    return iqr(trial_rates(rate, times_s))


def ratio_band(a_lo: float, a_hi: float, b_lo: float, b_hi: float) -> tuple[float, float]:
    """The range of a / b for a in [a_lo, a_hi] and b in [b_lo, b_hi] (positive): a_lo / b_hi to a_hi / b_lo;
    NaN where either band is unknown or b's reaches zero.

    The two bands' ends, not relative spreads added in quadrature: a spread here is an interquartile
    range widened to the range of runs, not a standard deviation of independent normal errors, which
    the quadrature rule assumes; the ratio of the ends bounds the ratio whatever the trials' distribution
    (and is the wider of the two, so a ratio is never shown surer than its parts)."""
    ends = [a_lo, a_hi, b_lo, b_hi]
    if any(v is None or pd.isna(v) for v in ends) or b_lo <= 0:
        return math.nan, math.nan
    return a_lo / b_hi, a_hi / b_lo


def with_spread(df: pd.DataFrame, rates: Iterable[str] = RATES) -> pd.DataFrame:
    """Each point's latest record (``results.latest``: a point is its key, ``results.POINT``), with, per rate
    it carries, ``<rate>_lo``, ``<rate>_hi`` (the band: trials' IQR, widened to every ok run's rate),
    ``<rate>_spread`` (hi - lo; NaN where noise was not measured) and ``<rate>_samples`` (every trial's
    rate of every ok run, what ``compare`` resamples), and ``runs`` (ok runs of the point).

    ``rates`` outside ``RATES`` (``tokens_per_j``) are not timed per trial: their band and samples are the runs'."""
    if df.empty:
        return df
    keys = results.point_columns(df)
    latest = results.latest(df).copy()
    rates = [r for r in rates if r in df.columns]
    ok = df[df["status"] == "ok"] if "status" in df.columns else df
    groups = {_key(k if isinstance(k, tuple) else (k,)): g for k, g in ok.groupby(keys, dropna=False)} if keys else {}
    runs, cols = [], {f"{r}_{s}": [] for r in rates for s in ("lo", "hi", "spread", "samples")}
    for _, row in latest.iterrows():
        same = groups.get(_key(row[k] for k in keys), ok.iloc[0:0])
        runs.append(int(len(same)))
        for r in rates:
            lo = hi = math.nan
            samples: tuple[float, ...] = ()
            value = row.get(r)
            if row.get("status", "ok") == "ok" and value is not None and not pd.isna(value):
                # Only a rate of the timed work has a trial spread; another (tokens/J: one energy
                # reading over all the trials) has only the range of its runs.
                band = _interval(float(value), row.get("times_s")) if r in RATES else None
                others = [float(v) for v in same[r] if v is not None and not pd.isna(v)] if r in same else []
                points = ([*band] if band else []) + (others if len(others) > 1 else [])
                if points:
                    lo, hi = min(points + [float(value)]), max(points + [float(value)])
                samples = _samples(same, r) or (float(value),)
            cols[f"{r}_lo"].append(lo)
            cols[f"{r}_hi"].append(hi)
            cols[f"{r}_spread"].append(hi - lo if not math.isnan(lo) else math.nan)
            cols[f"{r}_samples"].append(samples)
    latest["runs"] = runs
    for name, values in cols.items():
        latest[name] = values
    return latest


def _samples(runs: pd.DataFrame, rate: str) -> tuple[float, ...]:
    """Every trial's rate of every run of a point (a rate without trials: one value per run), sorted, so
    that the resampling does not depend on the order the records were read in."""
    out: list[float] = []
    for _, run in runs.iterrows():
        value = run.get(rate)
        if value is None or pd.isna(value):
            continue
        trials = trial_rates(float(value), run.get("times_s")) if rate in RATES else []
        out += trials or [float(value)]
    return tuple(sorted(out))


def _key(values) -> tuple:
    # A missing key part is None, however it was read (None, NaN: groupby turns None into NaN, and NaN
    # != NaN), so that a point finds its runs again.
    return tuple(None if v is None or (isinstance(v, float) and math.isnan(v)) else v for v in values)


def decimals(spread: float | None, value: float | None = None) -> int:
    """The decimals a value supports: to the spread's leading digit (two digits when it is a 1);
    without a spread, three significant digits of the value. Negative: round to tens, hundreds."""
    if spread is not None and not pd.isna(spread) and spread > 0:
        exp = math.floor(math.log10(spread))
        lead = int(spread / 10 ** exp)
        return -exp + (1 if lead == 1 else 0)
    if value is None or pd.isna(value) or value == 0:
        return 0
    return 2 - math.floor(math.log10(abs(value)))


def fmt(value: float | None, places: int) -> str:
    """``value`` rounded to ``places`` decimals (negative: tens, hundreds), thousands separated; "" for none."""
    if value is None or pd.isna(value):
        return ""
    rounded = round(float(value), places)
    return f"{rounded:,.{max(places, 0)}f}"


@dataclass(frozen=True)
class Measured:
    """A rate with its spread (NaN: noise not measured) and the samples it rests on (every trial of every
    run: what ``compare`` resamples; empty where the row carries none)."""

    value: float
    spread: float = math.nan
    samples: tuple[float, ...] = ()
    busy: bool = False  # measured while other work kept the machine busy (the record's ``machine_busy``)

    @classmethod
    def of(cls, row, rate: str) -> "Measured":
        spread = row.get(f"{rate}_spread", math.nan)
        samples = row.get(f"{rate}_samples")
        samples = tuple(samples) if isinstance(samples, (tuple, list)) else ()
        return cls(float(row[rate]), math.nan if spread is None or pd.isna(spread) else float(spread), samples,
                   _is_true(row.get("machine_busy")))

    def text(self, unit: str = "") -> str:
        """``3,200 ± 120 tokens/s``: the value to the digits its spread supports, half the spread after ±."""
        places = decimals(self.spread, self.value)
        noise = f" ± {fmt(self.spread / 2, places)}" if not math.isnan(self.spread) else " (noise not measured)"
        return f"{fmt(self.value, places)}{noise}{' ' + unit if unit else ''}"


def _is_true(value) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value)) and bool(value)


# The interval a difference is stated with: a percentile bootstrap of the ratio of the two medians, each
# point's samples resampled with replacement, a fixed seed and a fixed number of resamples: the same
# records give the same interval on every machine and every read.
CONFIDENCE = 0.95
RESAMPLES = 2000
SEED = 0
CI_DOC = (f"a difference is stated with the {CONFIDENCE:.0%} confidence interval of the ratio of the two "
          "medians (a seeded bootstrap over each point's trials and runs); it is called one only when the "
          "interval excludes 1")


def ratio_ci(a: Iterable[float], b: Iterable[float], *, confidence: float = CONFIDENCE,
             resamples: int = RESAMPLES, seed: int = SEED) -> tuple[float, float] | None:
    """The ``confidence`` percentile interval of median(a) / median(b), bootstrapped; None when either has
    fewer than 2 samples (one trial and one run: no variation to resample) or b's median can be 0."""
    import numpy as np

    a_values = np.sort(np.asarray([float(v) for v in a], dtype=float))
    b_values = np.sort(np.asarray([float(v) for v in b], dtype=float))
    if len(a_values) < 2 or len(b_values) < 2 or (b_values <= 0).any():
        return None
    rng = np.random.default_rng(seed)
    a_med = np.median(rng.choice(a_values, size=(resamples, len(a_values)), replace=True), axis=1)
    b_med = np.median(rng.choice(b_values, size=(resamples, len(b_values)), replace=True), axis=1)
    tail = 100 * (1 - confidence) / 2
    lo, hi = np.percentile(a_med / b_med, [tail, 100 - tail])
    return float(lo), float(hi)


@dataclass(frozen=True)
class Comparison:
    """a against b: the ratio of the values shown, the interval of the ratio of medians (None: not
    computable) and the verdict (True: the interval excludes 1; None: no interval)."""

    ratio: float
    ci: tuple[float, float] | None
    busy: bool = False

    @property
    def real(self) -> bool | None:
        if self.ci is None:
            return None
        return not (self.ci[0] <= 1.0 <= self.ci[1])

    @property
    def ci_text(self) -> str:
        return f"{CONFIDENCE:.0%} CI {self.ci[0]:.2f}-{self.ci[1]:.2f}".replace("%", " %") if self.ci else ""


def compare(a: Measured, b: Measured) -> Comparison:
    """``a`` against ``b`` (``ratio_ci`` over their samples)."""
    ci = ratio_ci(a.samples, b.samples)
    if ci is not None:  # the ratio printed is the quantity the interval is of: the ratio of the two medians
        ratio = statistics.median(a.samples) / statistics.median(b.samples)
    else:
        ratio = a.value / b.value if b.value else math.nan
    return Comparison(ratio, ci, a.busy or b.busy)


def differs(a: Measured, b: Measured) -> bool | None:
    """Whether the interval of a's median over b's excludes 1; None when it cannot be computed."""
    return compare(a, b).real


BUSY_NOTE = "(measured on a busy machine)"


def ratio_text(a: Measured, b: Measured) -> str:
    """``1.13x (95 % CI 1.05-1.21)`` when the interval excludes 1, ``within noise (1.02x; 95 % CI 0.90-1.10
    includes 1)`` when it does not; the verdict and the numbers printed are the same interval."""
    c = compare(a, b)
    shown = f"{c.ratio:.2f}x"
    busy = f" {BUSY_NOTE}" if c.busy else ""
    if c.real:
        return f"{shown} ({c.ci_text}){busy}"
    if c.real is None:
        return (f"{shown}, not called a difference: its confidence interval cannot be computed "
                f"(one trial and one run){busy}")
    return f"within noise ({shown}; {c.ci_text} includes 1){busy}"
