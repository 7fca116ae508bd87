"""Gradient accumulation (paper Figure 6): throughput against GAS at several micro-batch sizes.

GAS k runs k micro-batches per optimizer step with one gradient all-reduce, so larger GAS
amortises communication and the optimizer step over more tokens.
"""
from __future__ import annotations

from typing import ClassVar

import pandas as pd
from pydantic import Field, PositiveInt

from accel_kit import energy, noise, results
from accel_kit import identity
from accel_kit.studies.study import Headline, ReportTable, Row, Study
from accel_kit.studies.training import AxesParams, study_runner, with_layout

NAME = "gas"
# The columns a table names first (with them, every key field that varies among its rows: identity.with_varying).
KEYS = ["system", "preset", "precision", "devices", "micro_batch_size", "gas"]


class Params(AxesParams):
    AXES: ClassVar[dict[str, str]] = {"micro_batch_sizes": "micro_batch_size", "gas_values": "gas"}
    REPLACED_BY: ClassVar[dict[str, str]] = {"gas": "gas_values (a list)",
                                             "micro_batch_size": "micro_batch_sizes (a list)"}
    gas_values: list[PositiveInt] = Field(default=[1, 4], min_length=1)
    micro_batch_sizes: list[PositiveInt] = Field(default=[16], min_length=1)


run = study_runner(NAME)


def table(df: pd.DataFrame) -> pd.DataFrame:
    """Throughput per point (its latest record) and the gain over the smallest GAS of its configuration
    (every key field but GAS: the same preset, sequence length, layout and micro-batch)."""
    if df.empty:
        return df
    df = results.latest(identity.with_point_key(with_layout(df)))
    keys = identity.with_varying(KEYS, df)
    df = df.sort_values([k for k in keys if k in df.columns]).copy()
    config = identity.config_key(df, "gas")
    cols = keys + ["status", "global_batch_size", "tokens_per_s", "samples_per_s", *energy.table_columns(df),
                   "mfu_measured_pct", "reason", "record_id"]
    out = df[[c for c in dict.fromkeys(cols) if c in df.columns]].reset_index(drop=True)
    config = config.reset_index(drop=True)
    if "tokens_per_s" not in out.columns:  # no point measured (every one failed): no gain to compute
        out["gain_vs_smallest_gas"] = float("nan")
        return out
    ok = out["status"] == "ok"
    base: dict = {}
    for i in out[ok].sort_values("gas", kind="stable").index:
        base.setdefault(config[i], out.at[i, "tokens_per_s"])
    out["gain_vs_smallest_gas"] = [out.at[i, "tokens_per_s"] / base.get(config[i], float("nan")) if ok[i]
                                   else float("nan") for i in out.index]
    return out


def figures(df: pd.DataFrame) -> dict:
    """Figure 6: tokens/s and samples/s against GAS, one line per configuration (micro-batch size, and any
    other key field that varies: a second preset or sequence length is a line of its own)."""
    from accel_kit import plots

    if df.empty:
        return {}
    ok = noise.with_spread(identity.with_point_key(with_layout(df)))  # each point's latest record, with its spread
    ok = ok[ok["status"] == "ok"]
    if ok.empty:
        return {}
    group = ["system", "precision", "micro_batch_size"]
    group += [f for f in identity.varying(ok) if f not in group + ["gas"]]
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
    """Per configuration (every key field but GAS): each larger GAS against the smallest, with the
    confidence interval of the ratio of their medians (``accel_kit.noise.ratio_text``): a gain or a loss
    only when the interval excludes 1, else "within noise".

    Each finding is ``{"text", "record_ids"}`` (the notebook prints the text; the report cites the records).
    """
    t = noise.with_spread(identity.with_point_key(with_layout(df))) if not df.empty else df
    if t.empty or "tokens_per_s" not in t.columns:
        return []
    t = t[(t["status"] == "ok") & t["tokens_per_s"].notna()]
    if t.empty:
        return []
    t = t.assign(_config=identity.config_key(t, "gas"))
    named = ["preset", "precision"] + [f for f in identity.varying(t) if f not in ("system", "preset", "precision",
                                                                                   "micro_batch_size", "gas")]
    out = []
    for _, g in sorted(t.groupby("_config", sort=False), key=lambda kv: identity.order(kv[0])):
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
            where = identity.config_label(base, named)
            out.append({"text": f"{base['system']} ({where}, micro-batch {int(base['micro_batch_size'])}): {said} "
                                f"({m.text()} against {b.text()} tokens/s)",
                        "record_ids": [base["record_id"], row["record_id"]]})
    return out


STUDY = Study(
    NAME, Params, table, figures, run=run, keys=tuple(KEYS), findings=findings, axis="gas",
    headline=Headline("tokens_per_s", "tokens/s", ("preset", "seq_len", "devices", "micro_batch_size", "gas")),
    # Figure 6's numbers: each GAS against the smallest of its micro-batch.
    report=(ReportTable("figure-6-data", ("micro_batch_size", "gas"),
                        extra=("preset", "seq_len", "devices", "global_batch_size"), rows=(
                            Row("tokens_per_s"), Row("samples_per_s"),
                            Row("gain_vs_smallest_gas", "gain over the smallest GAS", "ratio", derived=True, base=True,
                                reason="no ok record at the smallest GAS of this micro-batch"),
                            Row("tokens_per_j"))),))
