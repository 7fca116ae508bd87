"""The paper's tables: II (scaling with device count), III (sequence length), IV (GenSLM).

Each is the pivot its study declares (``Study.report``: ``accel_kit.report.pivot.declared_pivot``) of the
study's own table, one column per system, one row per point and quantity; ratios (speedup, scaling
efficiency) cite their base record too.
Each throughput has its spread in the row below (``cells.rate``), both rounded to what the spread supports.
"""
from __future__ import annotations

import pandas as pd

import accel_kit.report.render as R
from accel_kit import noise
from accel_kit.report.context import Context, Section
from accel_kit.report.pivot import declared_pivot
from accel_kit.report.render import Table, esc

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
    s.text("<p>Speedup is throughput over that of the smallest device count measured in the same layout "
           "(engine, tensor and pipeline parallel degrees), scaling efficiency is speedup / (N / N<sub>0</sub>) "
           "(<code>accel_kit.studies.scaling.table</code>); both cite the base record too.</p>" + SPREAD_NOTE)
    return s.table(declared_pivot(ctx, "scaling", "table-2-scaling"))


def table_iii_seq_length(ctx: Context) -> Section:
    """Table III: the sequence lengths that fit, their throughput and memory."""
    s = Section("table-3", "Table III: sequence length")
    s.text("<p>Lengths that did not fit are part of the result: their cells give the status and why "
           "(an estimate above the device's memory, an out-of-memory, or beyond the memory frontier).</p>"
           + SPREAD_NOTE)
    return s.table(declared_pivot(ctx, "seq_length", "table-3-seq-length"))


def table_iv_genslm(ctx: Context) -> Section:
    """Table IV: GenSLM throughput per model and length."""
    s = Section("table-4", "Table IV: GenSLM")
    s.text("<p>Samples/s is GenSLM's own measure: the global batch over the mean step time, warm-up "
           "excluded.</p>" + SPREAD_NOTE)
    return s.table(declared_pivot(ctx, "genslm", "table-4-genslm"))
