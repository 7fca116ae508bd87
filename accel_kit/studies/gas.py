"""Gradient accumulation (paper Figure 6): throughput against GAS at several micro-batch sizes.

GAS k runs k micro-batches per optimizer step with one gradient all-reduce, so larger GAS
amortises communication and the optimizer step over more tokens.
"""
from __future__ import annotations

from typing import ClassVar

import pandas as pd
from pydantic import Field, PositiveInt

from accel_kit import energy, noise, results
from accel_kit.studies._training import AxesParams, study_runner

STUDY = "gas"
KEYS = ["system", "preset", "precision", "devices", "micro_batch_size", "gas"]


class Params(AxesParams):
    AXES: ClassVar[dict[str, str]] = {"micro_batch_sizes": "micro_batch_size", "gas_values": "gas"}
    REPLACED_BY: ClassVar[dict[str, str]] = {"gas": "gas_values (a list)",
                                             "micro_batch_size": "micro_batch_sizes (a list)"}
    gas_values: list[PositiveInt] = Field(default=[1, 4], min_length=1)
    micro_batch_sizes: list[PositiveInt] = Field(default=[16], min_length=1)


run = study_runner(STUDY)


def table(df: pd.DataFrame) -> pd.DataFrame:
    """Throughput per (micro-batch, GAS) and the gain over GAS 1 at the same micro-batch."""
    if df.empty:
        return df
    df = results.latest(df, KEYS).sort_values(KEYS).copy()
    cols = KEYS + ["status", "global_batch_size", "tokens_per_s", "samples_per_s", *energy.table_columns(df),
                   "mfu_measured_pct", "reason", "record_id"]
    df = df[[c for c in cols if c in df.columns]].reset_index(drop=True)
    if "tokens_per_s" not in df.columns:  # no point measured (every one failed): no gain to compute
        df["gain_vs_smallest_gas"] = float("nan")
        return df
    base = df[(df["gas"] == df.groupby(KEYS[:-1])["gas"].transform("min")) & (df["status"] == "ok")]
    base = base.set_index(KEYS[:-1])["tokens_per_s"]
    df["gain_vs_smallest_gas"] = [r.tokens_per_s / base.get(tuple(getattr(r, k) for k in KEYS[:-1]), float("nan"))
                                  if r.status == "ok" else float("nan") for r in df.itertuples()]
    return df


def figures(df: pd.DataFrame) -> dict:
    """Figure 6: tokens/s and samples/s against GAS, one line per micro-batch size."""
    from accel_kit import plots

    if df.empty:
        return {}
    ok = noise.with_spread(df, KEYS)  # the latest record per point, with its trials' and runs' spread
    ok = ok[ok["status"] == "ok"]
    if ok.empty:
        return {}
    group = ["system", "precision", "micro_batch_size"]
    figs = {
        "gas_tokens_per_s": plots.line(ok, x="gas", y="tokens_per_s", group=group, log_x=True,
                                       title="Training throughput against gradient accumulation steps",
                                       x_title="GAS", y_title="tokens / s", hover=["global_batch_size"]),
        "gas_samples_per_s": plots.line(ok, x="gas", y="samples_per_s", group=group, log_x=True,
                                        title="Samples per second against gradient accumulation steps",
                                        x_title="GAS", y_title="samples / s", hover=["global_batch_size"]),
    }
    per_j = plots.energy_line(ok, x="gas", group=group, log_x=True, x_title="GAS",
                              title="Training energy efficiency against gradient accumulation steps")
    if per_j is not None:
        figs["gas_energy"] = per_j
    return figs


def findings(df: pd.DataFrame) -> list[dict]:
    """Per system, preset, precision and micro-batch: each larger GAS against the smallest, called a gain or
    a loss only when the difference exceeds both points' spread (``accel_kit.noise``), else "within noise".

    Each finding is ``{"text", "record_ids"}`` (the notebook prints the text; the report cites the records).
    """
    t = noise.with_spread(df, KEYS) if not df.empty else df
    if t.empty:
        return []
    t = t[(t["status"] == "ok") & t["tokens_per_s"].notna()]
    out = []
    for key, g in t.groupby(KEYS[:-1], sort=True):
        if g["gas"].nunique() < 2:
            continue
        g = g.sort_values("gas")
        base = g.iloc[0]
        b = noise.Measured.of(base, "tokens_per_s")
        for _, row in g.iloc[1:].iterrows():
            m = noise.Measured.of(row, "tokens_per_s")
            verdict = noise.ratio_text(m, b)
            said = (f"GAS {int(row['gas'])} gives {verdict} the tokens/s of GAS {int(base['gas'])}"
                    if noise.differs(m, b) else f"GAS {int(row['gas'])} against GAS {int(base['gas'])}: {verdict}")
            out.append({"text": f"{key[0]} ({key[1]}, {key[2]}, micro-batch {int(key[4])}): {said} "
                                f"({m.text()} against {b.text()} tokens/s)",
                        "record_ids": [base["record_id"], row["record_id"]]})
    return out
