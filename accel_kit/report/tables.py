"""The paper's tables: II (scaling with device count), III (sequence length), IV (GenSLM).

Each is a pivot (``accel_kit.report.pivot``) of the study's own table, one column per system,
one row per point and quantity; ratios (speedup, scaling efficiency) cite their base record too.
Each throughput has its spread in the row below (``cells.rate``), both rounded to what the spread supports.
"""
from __future__ import annotations

import pandas as pd

import accel_kit.report.render as R
from accel_kit import noise
from accel_kit.report.cells import MFU_DATASHEET, MFU_MEASURED, base_record, derived, energy, metric, rate
from accel_kit.report.context import Context, Section, study_table
from accel_kit.report.pivot import pivot
from accel_kit.report.render import Table, esc
from accel_kit.studies import scaling as scaling_study

SPREAD_NOTE = f"<p>Each throughput's {esc(noise.SPREAD_DOC)}.</p>"


def text_frame(table: Table) -> pd.DataFrame:
    """The table's text as a reader sees it (row names, each cell's text and its citation marks, a
    status cell's reason as shown): what ``accel_kit.tables.width_px`` estimates a width from."""
    notes = table.notes()

    def text(c: R.Cell) -> str:
        shown = c.text + (f" note {notes.get(c.reason, 'a')}" if not c.measured and not c.compact else "")
        shown += " [" + ", ".join(["999"] * len(c.records)) + "]" if c.records else ""
        # The page's style wraps a reason at 26em (td.why, 0.9em type) and a text value at 40em (td.v.txt):
        # about 47 and 80 characters of 8 px; a number never wraps.
        wrap = 47 if not c.measured else 80 if c.value is None else len(shown)
        return shown[:wrap]

    rows = [list(key) + [text(c) for c in cells] for key, cells in table.rows]
    width = len(table.row_headers) + len(table.columns)
    return pd.DataFrame([r + [""] * (width - len(r)) for r in rows], columns=table.row_headers + table.columns)


def table_ii_scaling(ctx: Context) -> Section:
    """Table II: throughput, speedup and scaling efficiency against device count."""
    s = Section("table-2", "Table II: scaling with the number of devices")
    t = study_table(ctx, "scaling")
    def base(row: pd.Series) -> list[str]:  # each configuration (layout included) against its fewest devices
        return base_record(t, row, scaling_study.AXIS)

    s.text("<p>Speedup is throughput over that of the smallest device count measured in the same layout "
           "(engine, tensor and pipeline parallel degrees), scaling efficiency is speedup / (N / N<sub>0</sub>) "
           "(<code>accel_kit.studies.scaling.table</code>); both cite the base record too.</p>" + SPREAD_NOTE)
    return s.table(pivot(ctx, "table-2-scaling", t, study="scaling", base=["preset", "layout", "devices"],
                         extra=["global_batch_size"], quantities=[
                             *rate("scaling", "tokens/s", "tokens_per_s"),
                             *rate("scaling", "tokens/s per device", "tokens_per_s_per_device"),
                             ("tokens/J", energy()),
                             ("speedup", derived("speedup", R.fmt_ratio, also=base,
                                                 reason="no ok record at a smaller device count to compare with")),
                             ("scaling efficiency", derived("scaling_efficiency_pct", R.fmt_pct, also=base,
                                                            reason="no ok base record")),
                             MFU_DATASHEET, MFU_MEASURED]))


def table_iii_seq_length(ctx: Context) -> Section:
    """Table III: the sequence lengths that fit, their throughput and memory."""
    s = Section("table-3", "Table III: sequence length")
    s.text("<p>Lengths that did not fit are part of the result: their cells give the status and why "
           "(an estimate above the device's memory, an out-of-memory, or beyond the memory frontier).</p>"
           + SPREAD_NOTE)
    t = study_table(ctx, "seq_length")
    return s.table(pivot(ctx, "table-3-seq-length", t, study="seq_length",
                         base=["preset", "layout", "devices", "seq_len"],
                         extra=["micro_batch_size"], quantities=[
                             *rate("seq_length", "tokens/s", "tokens_per_s"),
                             ("tokens/J", energy()),
                             ("peak memory (GiB)", metric("mem_peak_gib", default_reason="the device reports no "
                                                          "peak memory")),
                             MFU_DATASHEET, MFU_MEASURED]))


def table_iv_genslm(ctx: Context) -> Section:
    """Table IV: GenSLM throughput per model and length."""
    s = Section("table-4", "Table IV: GenSLM")
    s.text("<p>Samples/s is GenSLM's own measure: the global batch over the mean step time, warm-up "
           "excluded.</p>" + SPREAD_NOTE)
    t = study_table(ctx, "genslm")
    return s.table(pivot(ctx, "table-4-genslm", t, study="genslm", base=["preset", "seq_len"],
                         extra=["vocab_size", "micro_batch_size", "activation_checkpointing", "attention_kernel",
                                "steps"],
                         quantities=[
                             *rate("genslm", "samples/s", "samples_per_s_mean"),
                             *rate("genslm", "tokens/s", "tokens_per_s"),
                             ("tokens/J", energy()),
                             MFU_DATASHEET, MFU_MEASURED,
                             ("peak memory (GiB)", metric("mem_peak_gib", default_reason="the device reports no "
                                                          "peak memory")),
                             ("last loss (nats)", metric("loss_last", R.fmt_loss))]))
