"""The Tune section, where the records hold a tune run (``accel-kit tune``): for each question tuned (system,
model, devices, sequence length, global batch, precision), the configurations measured against their predictions,
the chosen layout against the default, and Kendall's tau between the two rankings.

It reads the run's summary record (``accel_kit.tune.summary``: kind ``tune_summary``, the latest of each question)
and cites each configuration's own training record.
"""
from __future__ import annotations

import html

import accel_kit.report.render as R
from accel_kit.report.context import Context, Section
from accel_kit.report.render import Cell, Table

COLUMNS = ["predicted tokens/s", "measured tokens/s", "error", "status"]


def tune_section(ctx: Context) -> Section | None:
    """None where the records hold no tune run (the page leaves the section out)."""
    from accel_kit.tune.summary import KIND

    runs = [r for r in ctx.records.records if r.study == "tune" and r.kind == KIND]
    if not runs:
        return None
    s = Section("tune", "Tune: the fastest layout that fits, predicted, then measured")
    s.text("<p>Every layout of the model on the devices was predicted by the what-if predictor, those predicted not "
           "to fit (with the memory model's measured error as a margin) removed, and the predicted-best and the "
           "system's default layout measured (<code>accel-kit tune</code>, <code>docs/tune.md</code>). Kendall's "
           "tau compares the predicted order with the measured tokens/s (1: the same order).</p>")
    for rec in sorted(runs, key=lambda r: (r.system, str(r.params.get("preset")), int(r.params.get("devices", 0)))):
        s.text(_summary_html(rec))
        s.table(_rows_table(ctx, rec))
    return s


def _summary_html(rec) -> str:
    p, m = rec.params, rec.metrics
    head = (f"{p['preset']} on {p['devices']} x {rec.system}, sequence {p['seq_len']}, global batch "
            f"{p['global_batch']}, {p['precision']}")
    if rec.status != "ok":
        return f"<p><b>{html.escape(head)}</b>: nothing measured ({html.escape(rec.reason or '')}).</p>"
    parts = [f"chosen: {m['tune_chosen']}, {R.fmt_num(m['tune_chosen_tokens_per_s'])} tokens/s measured"]
    if m.get("tune_chosen_vs_default") is not None:
        parts.append(f"{m['tune_chosen_vs_default']:.2f}x the default's "
                     f"{R.fmt_num(m['tune_default_tokens_per_s'])}")
    tau = m.get("tune_tau")
    parts.append(f"Kendall's tau {tau:.2f} over {m['tune_compared']} configurations" if tau is not None
                 else "fewer than 2 configurations measured: no tau")
    parts.append(f"{m['tune_predicted']} configurations predicted to fit; removed: {m['tune_pruned'] or 'none'}")
    return f"<p><b>{html.escape(head)}</b>: {html.escape('; '.join(parts))}.</p>"


def _rows_table(ctx: Context, rec) -> Table:
    """One row per configuration measured, in predicted order; each cell cites its training record (the summary
    where that record is not in the report)."""
    t = Table(f"tune-{rec.record_id[:12]}", ["predicted rank", "measured rank", "layout"], COLUMNS,
              caption="predicted against measured tokens/s; error = (predicted - measured) / measured")
    for row in rec.metrics.get("tune_rows") or []:
        rid = row.get("record_id")
        cite = (rid,) if rid in ctx.records.by_id else (rec.record_id,)
        measured = row.get("measured_tokens_per_s")
        status = row.get("status") or "not measured"
        cells = [Cell(R.fmt_num(row["predicted_tokens_per_s"]), (rec.record_id,),
                      value=float(row["predicted_tokens_per_s"])),
                 R.value_cell(measured, cite, reason=row.get("reason") or status),
                 R.value_cell(row.get("error_pct"), cite, R.fmt_pct, reason="not measured"),
                 R.text_cell(status, cite)]
        layout = row["layout"] + (" (default)" if row.get("default") else "")
        t.add([row.get("predicted_rank") or "removed", row.get("measured_rank") or "-", layout], cells)
    return t
