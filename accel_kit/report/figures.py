"""The paper's figures: 3 and 4 (the transformer-block microbenchmark), 5 (scaling), 6 (gradient
accumulation), 7 and 8 (weight sparsity: throughput and loss).

Each draws the study module's own figure (``accel_kit.studies.<study>.figures``) over every
system's records, one bar group or line per system, or says why there is none; most are
followed by their numbers as a pivot table.
"""
from __future__ import annotations

from collections import Counter
from typing import Callable

import pandas as pd

import accel_kit.report.render as R
from accel_kit.report.cells import MFU_DATASHEET, MFU_MEASURED, base_record, derived, energy, metric, rate
from accel_kit.report.context import Context, Section, study_table
from accel_kit.report.pivot import pivot
from accel_kit.report.render import esc


def _figure(ctx: Context, section: Section, study: str, key: str, div_id: str,
            select: Callable[[pd.DataFrame], pd.DataFrame] | None = None) -> None:
    """The study's own figure ``key`` over every system's records, or a line saying why there is none."""
    from accel_kit import studies

    df = ctx.study(study)
    if not df.empty and select is not None:
        df = select(df)
    figs = studies.study_module(study).figures(df) if not df.empty else {}
    if key in figs:
        section.figure(div_id, figs[key])
        return
    if df.empty:
        why = f"no system in this report has {study} records"
    else:
        counts = Counter(df["status"])
        why = (f"none of its {len(df)} records has status ok ("
               + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) + ")" if "ok" not in counts
               else "its ok records lack the values this figure draws")
    section.text(f'<p class="nofig" id="{esc(div_id)}-missing">No figure: {esc(why)}.</p>')


def _microbenchmark(ctx: Context, number: int, direction: str, title: str) -> Section:
    s = Section(f"figure-{number}", f"Figure {number}: {title}")
    _figure(ctx, s, "microbenchmark", f"microbenchmark_{direction}", f"figure-{number}-plot")
    t = study_table(ctx, "microbenchmark")
    if not t.empty:
        t = t[t["direction"] == direction]
    return s.table(pivot(ctx, f"figure-{number}-data", t, study="microbenchmark", base=["precision", "batch_size"],
                         extra=["impl"], split_precision=False, quantities=[
                             *rate("microbenchmark", "TFLOP/s", "tflops"), MFU_DATASHEET, MFU_MEASURED,
                             ("FLOP/J", energy("flops"))]))


def figure_3_forward(ctx: Context) -> Section:
    """Figure 3: one GPT-2 XL block, forward TFLOP/s by batch size and precision."""
    return _microbenchmark(ctx, 3, "forward", "transformer block, forward pass")


def figure_4_backward(ctx: Context) -> Section:
    """Figure 4: the same block, forward and backward."""
    return _microbenchmark(ctx, 4, "forward_backward", "transformer block, forward and backward pass")


def figure_5_scaling(ctx: Context) -> Section:
    """Figure 5: tokens/s against device count, one line per system (numbers: Table II)."""
    s = Section("figure-5", "Figure 5: training throughput against device count")
    _figure(ctx, s, "scaling", "scaling_throughput", "figure-5-plot")
    return s.text('<p>The numbers, with the points that did not run and why, are in '
                  '<a href="#table-2">Table II</a>.</p>')


def figure_6_gas(ctx: Context) -> Section:
    """Figure 6: tokens/s against gradient accumulation steps."""
    s = Section("figure-6", "Figure 6: gradient accumulation")
    _figure(ctx, s, "gas", "gas_tokens_per_s", "figure-6-plot")
    t = study_table(ctx, "gas")
    return s.table(pivot(ctx, "figure-6-data", t, study="gas", base=["micro_batch_size", "gas"],
                         extra=["preset", "seq_len", "devices", "global_batch_size"], quantities=[
                             *rate("gas", "tokens/s", "tokens_per_s"),
                             *rate("gas", "samples/s", "samples_per_s"),
                             ("gain over the smallest GAS", derived(
                                 "gain_vs_smallest_gas", R.fmt_ratio, also=lambda r: base_record(t, r, "gas"),
                                 reason="no ok record at the smallest GAS of this micro-batch")),
                             ("tokens/J", energy())]))


def _sparsity_table(ctx: Context) -> pd.DataFrame:
    t = study_table(ctx, "sparsity")
    return t.assign(_config_order=t["config"].map(lambda c: (c != "dense", c == "2:4", c))) if not t.empty else t


def figure_7_sparsity_throughput(ctx: Context) -> Section:
    """Figure 7: throughput of sparse models relative to dense."""
    from accel_kit.studies import sparsity

    s = Section("figure-7", "Figure 7: weight sparsity, throughput relative to dense")
    _figure(ctx, s, "sparsity", "sparsity_throughput", "figure-7-plot")
    t = _sparsity_table(ctx)
    if not t.empty:
        presets = sparsity._throughput_presets(ctx.study("sparsity"))
        t = t[~t["loss_curve_run"] | t["preset"].isin(presets)]

    def dense(row: pd.Series) -> list[str]:
        same = t[(t["system"] == row["system"]) & (t["preset"] == row["preset"]) & (t["config"] == "dense")
                 & (t["status"] == "ok")]
        return list(same["record_id"][:1])

    return s.table(pivot(ctx, "figure-7-data", t, study="sparsity", base=["preset", "config"],
                         extra=["micro_batch_size", "seq_len", "steps", "sparse_kernels"], quantities=[
                             *rate("sparsity", "tokens/s", "tokens_per_s"),
                             ("relative to dense", derived("speedup_vs_dense", R.fmt_ratio, also=dense,
                                                           reason="no ok dense record of this preset")),
                             ("FLOP-proportional ideal", derived("ideal_speedup", R.fmt_ratio,
                                                                 reason="effective FLOPs not recorded")),
                             ("how it ran", lambda c, row, rec: R.text_cell(row.get("execution"),
                                                                            [rec.record_id])),
                             ("tokens/J", energy())]))


def figure_8_sparsity_loss(ctx: Context) -> Section:
    """Figure 8: training loss of sparse models against dense, and the final gap."""
    s = Section("figure-8", "Figure 8: weight sparsity, training loss")
    _figure(ctx, s, "sparsity", "sparsity_loss_curves", "figure-8-plot")
    _figure(ctx, s, "sparsity", "sparsity_loss_gap", "figure-8-gap")
    t = _sparsity_table(ctx)
    if not t.empty:
        t = t[t["loss_curve_run"]]
    return s.table(pivot(ctx, "figure-8-data", t, study="sparsity", base=["preset", "config"],
                         extra=["micro_batch_size", "seq_len", "steps", "dense_finetune_steps"], quantities=[
                             ("final loss (nats)", derived("loss_final", R.fmt_loss,
                                                           reason="fewer than two windows of 10 steps")),
                             ("above dense", derived("loss_gap_pct", R.fmt_pct, reason="no dense run to compare")),
                             ("above dense after dense fine-tuning", derived(
                                 "finetune_gap_pct", R.fmt_pct, reason="this run had no dense fine-tuning steps"))]))
