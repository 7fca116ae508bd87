"""Throughput and memory against sequence length, 1K to 64K (paper Table III).

Points that do not fit are part of the result: a configuration that runs out of memory
(or is estimated not to fit) at some length has its longer lengths recorded as skipped. A layout
(``tp``, ``pp``, ``engine``; the A100 row of the full profile runs tensor parallel over 4 devices,
as the paper's A100 needed 4 for the shorter lengths) is part of the configuration: its rows and
lines stay apart from the others'.
"""
from __future__ import annotations

from typing import ClassVar

import pandas as pd
from pydantic import Field, PositiveInt

from accel_kit import energy, noise, results
from accel_kit import identity
from accel_kit.mesh import LAYOUT_FIELDS
from accel_kit.studies.study import Headline, ReportTable, Row, Study
from accel_kit.studies.training import AxesParams, study_runner, with_layout

NAME = "seq_length"
# The columns a table names first (with them, every key field that varies among its rows).
KEYS = ["system", "preset", "precision", *LAYOUT_FIELDS, "devices", "seq_len"]
# The columns a reader sees: the layout as one label (``layout``), not its fields one by one.
SHOWN = ("system", "preset", "precision", "layout", "devices", "seq_len", "status", "tokens_per_s",
         "tokens_per_s_per_device", "tokens_per_j", "energy_j", "power_avg_w", "mem_peak_gib", "mem_estimate_gib",
         "mfu_measured_pct", "reason")


class Params(AxesParams):
    AXES: ClassVar[dict[str, str]] = {"seq_lens": "seq_len"}
    REPLACED_BY: ClassVar[dict[str, str]] = {"seq_len": "seq_lens (a list)"}
    seq_lens: list[PositiveInt] = Field(default=[1024, 2048, 4096, 8192, 16384, 32768, 65536], min_length=1)


run = study_runner(NAME)


def table(df: pd.DataFrame) -> pd.DataFrame:
    """Table III: one row per length, with what did not fit and why."""
    if df.empty:
        return df
    df = results.latest(identity.with_point_key(with_layout(df)))
    keys = identity.with_varying(KEYS, df)
    df = df.sort_values(keys)
    cols = keys + ["layout", "status", "tokens_per_s", "tokens_per_s_per_device", *energy.table_columns(df), "mem_peak_gib",
                   "mem_estimate_gib", "mfu_measured_pct", "reason", "record_id"]
    return df[[c for c in dict.fromkeys(cols) if c in df.columns]].reset_index(drop=True)


def figures(df: pd.DataFrame) -> dict:
    """Throughput and peak memory against sequence length; lengths that did not fit marked on the axis."""
    import plotly.graph_objects as go

    from accel_kit import plots

    if df.empty:
        return {}
    latest = noise.with_spread(identity.with_point_key(with_layout(df)))  # latest per point, with its spread
    ok = latest[latest["status"] == "ok"]
    group = ["system", "preset", "layout", "devices"]
    group += [f for f in identity.varying(ok) if f not in group + ["seq_len", *LAYOUT_FIELDS]]
    figs = {}
    if not ok.empty:
        fig = plots.line(ok, x="seq_len", y="tokens_per_s", group=group,
                         title="Training throughput against sequence length", x_title="sequence length (tokens)",
                         y_title="tokens / s", log_x=True, hover=["mem_peak_gib", "mfu_measured_pct"])
        failed = latest[latest["status"] != "ok"]
        if not failed.empty:
            fig.add_trace(go.Scatter(
                x=failed["seq_len"], y=[0] * len(failed), mode="markers", name="did not run",
                marker=dict(symbol="x", size=12, color="crimson"), text=failed["status"] + ": " + failed["reason"],
                hovertemplate="seq_len=%{x}<br>%{text}<extra></extra>"))
        plots.swept_ticks(fig, latest["seq_len"])  # the failed lengths too
        figs["seq_length_throughput"] = fig
        if ok["mem_peak_gib"].notna().any():
            mem = plots.line(ok, x="seq_len", y="mem_peak_gib", group=group,
                             title="Peak memory per device against sequence length",
                             x_title="sequence length (tokens)", y_title="GiB", log_x=True)
            plots.swept_ticks(mem, latest["seq_len"])
            figs["seq_length_memory"] = mem
        per_j = plots.energy_line(ok, x="seq_len", group=group, log_x=True,
                                  title="Training energy efficiency against sequence length",
                                  x_title="sequence length (tokens)")
        if per_j is not None:
            plots.swept_ticks(per_j, latest["seq_len"])
            figs["seq_length_energy"] = per_j
    return figs


STUDY = Study(
    NAME, Params, table, figures, run=run, keys=tuple(KEYS), shown=SHOWN,
    headline=Headline("tokens_per_s", "tokens/s", ("preset", "micro_batch_size", *LAYOUT_FIELDS, "devices", "seq_len")),
    # Table III: lengths that did not fit are part of the result (their cells give the status and why).
    report=(ReportTable("table-3-seq-length", ("preset", "layout", "devices", "seq_len"), extra=("micro_batch_size",),
                        rows=(Row("tokens_per_s"), Row("tokens_per_j"),
                              Row("mem_peak_gib", reason="the device reports no peak memory"),
                              Row("mfu_pct"), Row("mfu_measured_pct"))),))
