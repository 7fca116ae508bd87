"""GPT-2 XL pre-training throughput against device count (paper Figure 5, Table II).

One point per device count, in the layout the parameters give (``engine`` ddp, fsdp or deepspeed;
``tp``, ``pp``, ``cp``, ``ep``: the data-parallel degree is devices / (tp x pp x cp), which ep divides;
``accel_kit.mesh.ParallelLayout``), and in each layout of ``also``.
Speedup and scaling efficiency compare like with like: each layout against the smallest device
count that ran it, speedup = T_N / T_N0, efficiency = speedup / (N / N0), i.e. the per-device
throughput at N over that at N0. On a CPU the "devices" are gloo processes sharing its cores.
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

NAME = "scaling"
# The columns a table names first (with them, every key field that varies among its rows).
KEYS = ["system", "preset", "precision", *LAYOUT_FIELDS, "devices"]
# A ratio's base: the smallest device count of the same configuration (every key field but the device
# count: ``identity.config_key(df, AXIS)``), layout included.
AXIS = "devices"
# The columns a reader sees: the layout as one label (``layout``), not its fields one by one.
SHOWN = ("system", "preset", "precision", "layout", "devices", "dp", "status", "global_batch_size", "tokens_per_s",
         "tokens_per_s_per_device", "speedup", "scaling_efficiency_pct", "mfu_measured_pct", "tokens_per_j",
         "energy_j", "power_avg_w", "reason")


class Params(AxesParams):
    AXES: ClassVar[dict[str, str]] = {"device_counts": "devices"}
    REPLACED_BY: ClassVar[dict[str, str]] = {"devices": "device_counts (a list)"}
    device_counts: list[PositiveInt] = Field(default=[1, 2, 4, 8], min_length=1)


run = study_runner(NAME)


def table(df: pd.DataFrame) -> pd.DataFrame:
    """Table II: throughput, speedup and scaling efficiency per system and device count."""
    if df.empty:
        return df
    df = results.latest(identity.with_point_key(with_layout(df)))
    keys = identity.with_varying(KEYS, df)
    df = df.sort_values(keys).assign(_config=lambda d: identity.config_key(d, AXIS))
    energy_cols = energy.table_columns(df)
    rows = []
    for _, g in sorted(df.groupby("_config", sort=False), key=lambda kv: identity.order(kv[0])):
        ok = g[g["status"] == "ok"]
        base = ok.iloc[0] if not ok.empty else None
        for _, r in g.iterrows():
            row = {k: r.get(k) for k in keys} | {"layout": r["layout"], "dp": r.get("dp"), "status": r["status"],
                                            "global_batch_size": r.get("global_batch_size"),
                                            "tokens_per_s": r.get("tokens_per_s"),
                                            "tokens_per_s_per_device": r.get("tokens_per_s_per_device"),
                                            "mfu_measured_pct": r.get("mfu_measured_pct"),
                                            **{c: r.get(c) for c in energy_cols},
                                            "reason": r.get("reason"), "record_id": r.get("record_id")}
            if base is not None and r["status"] == "ok":
                speedup = r["tokens_per_s"] / base["tokens_per_s"]
                row["speedup"] = speedup
                row["scaling_efficiency_pct"] = 100 * speedup / (r["devices"] / base["devices"])
            rows.append(row)
    return pd.DataFrame(rows)


def figures(df: pd.DataFrame) -> dict:
    """Figure 5: tokens/s against device count, log-log, one line per system, model and layout."""
    from accel_kit import plots

    # Each point's latest record, with its spread.
    ok = noise.with_spread(identity.with_point_key(with_layout(df))) if not df.empty else df
    ok = ok[ok["status"] == "ok"] if not ok.empty else ok
    if ok.empty:
        return {}
    group = ["system", "preset", "precision", "layout"]
    group += [f for f in identity.varying(ok) if f not in group + [AXIS, *LAYOUT_FIELDS]]
    fig = plots.line(ok, x="devices", y="tokens_per_s", group=group,
                     title="Training throughput against device count", x_title="devices",
                     y_title="tokens / s", log_x=True, log_y=True,
                     hover=["tokens_per_s_per_device", "mfu_measured_pct", "global_batch_size"])
    figs = {"scaling_throughput": fig}
    per_j = plots.energy_line(ok, x="devices", group=group, log_x=True,
                              title="Training energy efficiency against device count (all devices' energy)",
                              x_title="devices")
    if per_j is not None:
        figs["scaling_energy"] = per_j
    return figs


STUDY = Study(
    NAME, Params, table, figures, run=run, keys=tuple(KEYS), shown=SHOWN, axis=AXIS,
    headline=Headline("tokens_per_s", "tokens/s", ("preset", "seq_len", "micro_batch_size", "gas", *LAYOUT_FIELDS,
                                                    "devices")),
    # Table II: each layout against its fewest devices; ratios cite their base record too.
    report=(ReportTable("table-2-scaling", ("preset", "layout", "devices"), extra=("global_batch_size",), rows=(
        Row("tokens_per_s"), Row("tokens_per_s_per_device", "tokens/s per device"), Row("tokens_per_j"),
        Row("speedup", "speedup", "ratio", derived=True, base=True,
            reason="no ok record at a smaller device count to compare with"),
        Row("scaling_efficiency_pct", "scaling efficiency", "pct", derived=True, base=True,
            reason="no ok base record"),
        Row("mfu_pct"), Row("mfu_measured_pct"))),))
