"""The paper's figures: 3 and 4 (the transformer-block microbenchmark), 5 (scaling), 6 (gradient
accumulation), 7 and 8 (weight sparsity: throughput and loss).

Each draws the study's own figure (its declaration's ``Study.figures``) over every system's records,
one bar group or line per system, or says why there is none; most are followed by their numbers as
the pivot table the study declares (``Study.report``).
"""
from __future__ import annotations

from collections import Counter
from typing import Callable

import pandas as pd

from accel_kit.report.context import Context, Section
from accel_kit.report.pivot import declared_pivot
from accel_kit.report.render import esc


def figure(ctx: Context, section: Section, study: str, key: str, div_id: str,
            select: Callable[[pd.DataFrame], pd.DataFrame] | None = None) -> None:
    """The study's own figure ``key`` over every system's records, or a line saying why there is none."""
    from accel_kit import studies

    df = ctx.study(study)
    if not df.empty and select is not None:
        df = select(df)
    figs = studies.get_study(study).figures(df) if not df.empty else {}
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
    figure(ctx, s, "microbenchmark", f"microbenchmark_{direction}", f"figure-{number}-plot")
    return s.table(declared_pivot(ctx, "microbenchmark", f"figure-{number}-data"))


def figure_3_forward(ctx: Context) -> Section:
    """Figure 3: one GPT-2 XL block, forward TFLOP/s by batch size and precision."""
    return _microbenchmark(ctx, 3, "forward", "transformer block, forward pass")


def figure_4_backward(ctx: Context) -> Section:
    """Figure 4: the same block, forward and backward."""
    return _microbenchmark(ctx, 4, "forward_backward", "transformer block, forward and backward pass")


def figure_5_scaling(ctx: Context) -> Section:
    """Figure 5: tokens/s against device count, one line per system (numbers: Table II)."""
    s = Section("figure-5", "Figure 5: training throughput against device count")
    figure(ctx, s, "scaling", "scaling_throughput", "figure-5-plot")
    return s.text('<p>The numbers, with the points that did not run and why, are in '
                  '<a href="#table-2">Table II</a>.</p>')


def figure_6_gas(ctx: Context) -> Section:
    """Figure 6: tokens/s against gradient accumulation steps."""
    s = Section("figure-6", "Figure 6: gradient accumulation")
    figure(ctx, s, "gas", "gas_tokens_per_s", "figure-6-plot")
    return s.table(declared_pivot(ctx, "gas", "figure-6-data"))


def figure_7_sparsity_throughput(ctx: Context) -> Section:
    """Figure 7: throughput of sparse models relative to dense."""
    s = Section("figure-7", "Figure 7: weight sparsity, throughput relative to dense")
    figure(ctx, s, "sparsity", "sparsity_throughput", "figure-7-plot")
    return s.table(declared_pivot(ctx, "sparsity", "figure-7-data"))


def figure_8_sparsity_loss(ctx: Context) -> Section:
    """Figure 8: training loss of sparse models against dense, and the final gap."""
    s = Section("figure-8", "Figure 8: weight sparsity, training loss")
    figure(ctx, s, "sparsity", "sparsity_loss_curves", "figure-8-plot")
    figure(ctx, s, "sparsity", "sparsity_loss_gap", "figure-8-gap")
    return s.table(declared_pivot(ctx, "sparsity", "figure-8-data"))
