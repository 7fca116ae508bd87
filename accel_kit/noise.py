"""The noise of a throughput: its spread, the digits it supports, and whether two points differ.

A point's spread is the interquartile range of its timed trials turned into the rate's units
(the record keeps every trial's time, ``times_s``), widened to the range of the point's runs
where a records folder holds it more than once (a re-run with ``rerun``). A difference between
two points is called one only when it exceeds the spread of both; otherwise it is "within
noise", said with the spreads. This is the one place those rules live: the study tables, the
figures' error bars and the findings (notebook and report) all read them here.

This module imports nothing of accel-kit but ``results``: any layer may read it.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Iterable

import pandas as pd

from accel_kit import results

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


def iqr(values: Iterable[float]) -> tuple[float, float] | None:
    """The first and third quartiles of ``values`` (NaN left out); None for fewer than 2 values."""
    values = [float(v) for v in values if v is not None and not pd.isna(v)]
    if len(values) < 2:
        return None
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[0], q[2]


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


def with_spread(df: pd.DataFrame, keys: list[str], rates: Iterable[str] = RATES) -> pd.DataFrame:
    """The latest record per ``keys`` (``results.latest``), with, per rate it carries, ``<rate>_lo``,
    ``<rate>_hi`` (the band: trials' IQR, widened to every ok run's rate) and ``<rate>_spread``
    (hi - lo; NaN where noise was not measured), and ``runs`` (ok runs of the point).

    ``rates`` outside ``RATES`` (``tokens_per_j``) are not timed per trial: their band is the runs' range."""
    if df.empty:
        return df
    keys = [k for k in keys if k in df.columns]
    latest = results.latest(df, keys).copy()
    rates = [r for r in rates if r in df.columns]
    ok = df[df["status"] == "ok"] if "status" in df.columns else df
    groups = {_key(k if isinstance(k, tuple) else (k,)): g for k, g in ok.groupby(keys, dropna=False)} if keys else {}
    runs, cols = [], {f"{r}_{s}": [] for r in rates for s in ("lo", "hi", "spread")}
    for _, row in latest.iterrows():
        same = groups.get(_key(row[k] for k in keys), ok.iloc[0:0])
        runs.append(int(len(same)))
        for r in rates:
            lo = hi = math.nan
            value = row.get(r)
            if row.get("status", "ok") == "ok" and value is not None and not pd.isna(value):
                # Only a rate of the timed work has a trial spread; another (tokens/J: one energy
                # reading over all the trials) has only the range of its runs.
                band = _interval(float(value), row.get("times_s")) if r in RATES else None
                others = [float(v) for v in same[r] if v is not None and not pd.isna(v)] if r in same else []
                points = ([*band] if band else []) + (others if len(others) > 1 else [])
                if points:
                    lo, hi = min(points + [float(value)]), max(points + [float(value)])
            cols[f"{r}_lo"].append(lo)
            cols[f"{r}_hi"].append(hi)
            cols[f"{r}_spread"].append(hi - lo if not math.isnan(lo) else math.nan)
    latest["runs"] = runs
    for name, values in cols.items():
        latest[name] = values
    return latest


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
    """A rate with its spread (NaN: noise not measured)."""

    value: float
    spread: float = math.nan

    @classmethod
    def of(cls, row, rate: str) -> "Measured":
        spread = row.get(f"{rate}_spread", math.nan)
        return cls(float(row[rate]), math.nan if spread is None or pd.isna(spread) else float(spread))

    def text(self, unit: str = "") -> str:
        """``3,200 ± 120 tokens/s``: the value to the digits its spread supports, half the spread after ±."""
        places = decimals(self.spread, self.value)
        noise = f" ± {fmt(self.spread / 2, places)}" if not math.isnan(self.spread) else " (noise not measured)"
        return f"{fmt(self.value, places)}{noise}{' ' + unit if unit else ''}"


def differs(a: Measured, b: Measured) -> bool | None:
    """Whether ``a`` and ``b`` differ by more than the spread of each; None when either's noise is unknown."""
    if math.isnan(a.spread) or math.isnan(b.spread):
        return None
    return abs(a.value - b.value) > max(a.spread, b.spread)


def ratio_text(a: Measured, b: Measured) -> str:
    """``1.13x`` when a and b differ beyond both spreads, else ``within noise (1.02x; spreads ...)``."""
    ratio = a.value / b.value if b.value else math.nan
    verdict = differs(a, b)
    shown = f"{ratio:.2f}x"
    if verdict:
        return shown
    if verdict is None:
        return f"{shown}, not called a difference: noise not measured (one trial and one run)"
    return f"within noise ({shown}; spreads {_rel(a)} and {_rel(b)})"


def _rel(m: Measured) -> str:
    return f"±{100 * m.spread / 2 / m.value:.0f} %" if m.value else "?"
