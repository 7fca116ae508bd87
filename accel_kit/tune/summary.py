"""What one tune run leaves behind: its table (predicted against measured, one row per configuration, its columns
here), its figure, and its summary record (``accel_kit.tune.measure.summary_record``).

The measured configurations are training records like any study's; what only tune knows (each one's predicted
rank and tokens/s, the chosen layout, Kendall's tau) is one more record, of kind ``tune_summary``, appended to the
same ``outputs/tune/<system>.jsonl`` after the measuring, so that the report (``accel_kit.report.tune_section``)
shows a tune run from the records alone, from any machine's folder or archive. Its point key is a hash of what
was tuned (model, devices, sequence length, global batch, precision, top K): a later run of the same question
supersedes it in the report, as a point measured again does.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

if TYPE_CHECKING:
    import plotly.graph_objects as go

KIND = "tune_summary"
# The columns of one row per configuration: the table's, and the summary record's ``tune_rows`` (its metrics are
# declared in accel_kit.metrics, with every other record's).
COLUMNS = ("predicted_rank", "measured_rank", "layout", "default", "predicted_tokens_per_s",
           "measured_tokens_per_s", "error_pct", "status", "reason", "record_id")


def figure(rows: pd.DataFrame, title: str) -> go.Figure:
    """Measured against predicted tokens/s, one marker per configuration measured ok, labelled with its predicted
    rank (its hover names its layout, and the default as such), the diagonal for reference."""
    import plotly.graph_objects as go

    ok = rows.dropna(subset=["measured_tokens_per_s"])
    fig = go.Figure()
    text = [f"{layout}{' (default)' if default else ''}: predicted rank {p}, measured rank {m}"
            for layout, default, p, m in zip(ok["layout"], ok["default"], ok["predicted_rank"], ok["measured_rank"])]
    fig.add_trace(go.Scatter(x=ok["predicted_tokens_per_s"], y=ok["measured_tokens_per_s"], mode="markers+text",
                             text=["-" if pd.isna(p) else f"{p:.0f}" for p in ok["predicted_rank"]],
                             textposition="top center", hovertext=text, name="configuration (predicted rank)",
                             hovertemplate="predicted %{x:.4g}, measured %{y:.4g} tokens/s<br>%{hovertext}"))
    if not ok.empty:
        lo = float(ok[["predicted_tokens_per_s", "measured_tokens_per_s"]].min().min())
        hi = float(ok[["predicted_tokens_per_s", "measured_tokens_per_s"]].max().max())
        fig.add_trace(go.Scatter(x=[lo, hi], y=[lo, hi], mode="lines", line={"dash": "dot", "color": "grey"},
                                 name="measured = predicted"))
    fig.update_xaxes(title_text="predicted tokens/s")
    fig.update_yaxes(title_text="measured tokens/s")
    fig.update_layout(template="plotly_white", title=title, height=440)
    return fig
