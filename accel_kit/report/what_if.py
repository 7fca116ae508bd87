"""The what-if section: the predictor's held-out error on the report's records (``accel_kit.predict``),
predicted against measured: a figure, and a table with one column per system."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

import accel_kit.report.render as R
from accel_kit.report.context import Context, Section
from accel_kit.report.render import Cell, Table


def what_if_held_out(ctx: Context) -> Section:
    """The what-if predictor's held-out error on these records: each dense training point predicted
    from a fit on the same system's other points (accel_kit.predict), predicted against measured."""
    from accel_kit.predict.heldout import held_out
    from accel_kit.predict.plots import predicted_vs_measured

    s = Section("what-if", "What-if: held-out prediction error (predicted against measured)")
    # No link probe here: the report reads records, it does not measure (a link probed by the
    # what-if notebook beside the records is used).
    first = next((src.path for src in ctx.records.sources if Path(src.path).is_dir()), None)
    df = held_out(ctx.records.records, link_root=first, probe=False)
    if df.empty:
        return s.text('<p class="nofig" id="what-if-missing">No figure: no system in this report has dense '
                      "training records (scaling, seq_length, gas) to predict.</p>")
    s.text("<p>Each dense training point is predicted from a fit on the same system's other points "
           "(leave-one-out; <code>accel_kit/predict/predictor.py</code>), then compared with what was measured "
           "(the median of its runs, where the report keeps several). "
           "The error is relative: (predicted &minus; measured) / measured.</p>")
    if df["predicted_step_s"].notna().any():
        s.figure("what-if-plot", predicted_vs_measured(df))
    return s.table(_errors_table(ctx, df))


def _errors_table(ctx: Context, df: pd.DataFrame) -> Table:
    """Per shape, step time and peak memory: measured / predicted (error) for each system."""
    t = Table("what-if-errors", ["study", "devices", "seq", "micro-batch", "GAS", "quantity"], ctx.systems,
              caption="step time and peak memory: measured, predicted from the others, error")
    for key, g in df.groupby(["study", "devices", "seq_len", "micro_batch_size", "gas"], sort=True):
        for what, measured, predicted, error, fmt in (
                ("step time", "measured_step_s", "predicted_step_s", "step_error", R.fmt_num),
                ("peak memory", "measured_mem_gib", "predicted_mem_gib", "mem_error", R.fmt_num)):
            cells = []
            for system in ctx.systems:
                rows = g[g["system"] == system]
                if rows.empty:
                    cells.append(R.not_run(f"no {key[0]} record of {system} at this shape"))
                    continue
                r = rows.iloc[0]
                if R.is_missing(r[predicted]):
                    cells.append(Cell("not predicted", (r["record_id"],), R.NOT_MEASURED,
                                      r["why_not"] or "no prediction"))
                    continue
                text = f"{fmt(r[measured])} / {fmt(r[predicted])} ({100 * r[error]:+.1f} %)" \
                    if not R.is_missing(r[measured]) else f"not measured / {fmt(r[predicted])}"
                cells.append(Cell(text, (r["record_id"],), value=float(r[predicted])))
            t.add(list(key) + [what], cells)
    return t
