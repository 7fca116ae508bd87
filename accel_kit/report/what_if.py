"""The what-if section: the predictor's held-out error on the report's records (``accel_kit.predict``),
predicted against measured: a figure, and a table with one column per system."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

import accel_kit.report.render as R
from accel_kit.report.context import Context, Section
from accel_kit.report.render import Cell, Table


def what_if_held_out(ctx: Context) -> Section:
    """The what-if predictor's held-out error on these records: each dense training point, and each
    offline-generation point, predicted from a fit on the same system's other points (accel_kit.predict),
    predicted against measured."""
    from accel_kit.predict import inference
    from accel_kit.predict.heldout import held_out
    from accel_kit.predict.plots import predicted_vs_measured

    s = Section("what-if", "What-if: held-out prediction error (predicted against measured)")
    # No link probe here: the report reads records, it does not measure (a link probed by the
    # what-if notebook beside the records is used).
    first = next((src.path for src in ctx.records.sources if Path(src.path).is_dir()), None)
    df = held_out(ctx.records.records, link_root=first, probe=False)
    generate = inference.held_out(ctx.records.records, ctx.systems)
    if df.empty and generate.empty:
        return s.text('<p class="nofig" id="what-if-missing">No figure: no system in this report has dense '
                      "training records (scaling, seq_length, gas) or offline-generation records to predict.</p>")
    s.text("<p>Each point is predicted from a fit on the same system's other points "
           "(leave-one-out; <code>accel_kit/predict/predictor.py</code> for training, "
           "<code>accel_kit/predict/inference.py</code> for generation), then compared with what was measured "
           "(the median of its runs, where the report keeps several). "
           "The error is relative: (predicted &minus; measured) / measured.</p>")
    if not df.empty:
        if df["predicted_step_s"].notna().any():
            s.figure("what-if-plot", predicted_vs_measured(df))
        s.table(_errors_table(ctx, df, "what-if-errors", TRAINING_KEYS, TRAINING_QUANTITIES,
                              "step time and peak memory: measured, predicted from the others, error"))
    if not generate.empty:
        s.table(_errors_table(ctx, generate, "what-if-inference-errors", GENERATE_KEYS, GENERATE_QUANTITIES,
                              "greedy generation, TTFT and TPOT: measured, predicted from the others, error"))
    return s


# (column, header) of a point's shape, and (label, measured, predicted, error column) of each quantity
TRAINING_KEYS = (("study", "study"), ("devices", "devices"), ("seq_len", "seq"), ("micro_batch_size", "micro-batch"),
                 ("gas", "GAS"))
TRAINING_QUANTITIES = (("step time", "measured_step_s", "predicted_step_s", "step_error"),
                       ("peak memory", "measured_mem_gib", "predicted_mem_gib", "mem_error"))
GENERATE_KEYS = (("preset", "preset"), ("precision", "precision"), ("batch_size", "batch"),
                 ("input_len", "input (tokens)"), ("output_len", "output (tokens)"))
GENERATE_QUANTITIES = (("TTFT (s)", "measured_ttft_s", "predicted_ttft_s", "ttft_error"),
                       ("TPOT (s)", "measured_tpot_s", "predicted_tpot_s", "tpot_error"))


def _errors_table(ctx: Context, df: pd.DataFrame, table_id: str, keys: tuple, quantities: tuple,
                  caption: str) -> Table:
    """Per shape (``keys``) and quantity: measured / predicted (error) for each system."""
    t = Table(table_id, [header for _, header in keys] + ["quantity"], ctx.systems, caption=caption)
    for key, g in df.groupby([column for column, _ in keys], sort=True):
        for what, measured, predicted, error in quantities:
            cells = []
            for system in ctx.systems:
                rows = g[g["system"] == system]
                if rows.empty:
                    cells.append(R.not_run(f"no record of {system} at this shape"))
                    continue
                r = rows.iloc[0]
                if R.is_missing(r[predicted]):
                    cells.append(Cell("not predicted", (r["record_id"],), R.NOT_MEASURED,
                                      r["why_not"] or "no prediction"))
                    continue
                text = f"{R.fmt_num(r[measured])} / {R.fmt_num(r[predicted])} ({100 * r[error]:+.1f} %)" \
                    if not R.is_missing(r[measured]) else f"not measured / {R.fmt_num(r[predicted])}"
                cells.append(Cell(text, (r["record_id"],), value=float(r[predicted])))
            t.add(list(key) + [what], cells)
    return t
