"""What-if figures: predicted throughput against device count, and predicted against measured."""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots


def scaling_prediction(table: pd.DataFrame) -> go.Figure:
    """Predicted tokens/s and scaling efficiency against device count."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("predicted tokens/s", "predicted scaling efficiency"))
    for system, g in table.groupby("system"):
        g = g.sort_values("devices")
        hover = [f"compute {c:.3g} s, exposed comm {e:.3g} s, {m:.3g} GiB/device, basis {b}"
                 for c, e, m, b in zip(g["compute_s"], g["exposed_comm_s"], g["memory_per_device_gib"], g["basis"])]
        fig.add_trace(go.Scatter(x=g["devices"], y=g["tokens_per_s"], mode="lines+markers", name=str(system),
                                 text=hover, hovertemplate="%{x} devices: %{y:.4g} tokens/s<br>%{text}"), 1, 1)
        fig.add_trace(go.Scatter(x=g["devices"], y=g["scaling_efficiency"], mode="lines+markers",
                                 name=f"{system} efficiency", showlegend=False), 1, 2)
    fig.update_xaxes(title_text="devices", type="log", dtick=0.30103)
    fig.update_yaxes(title_text="tokens/s", row=1, col=1)
    fig.update_yaxes(title_text="efficiency", range=[0, 1.05], row=1, col=2)
    fig.update_layout(template="plotly_white", title="What-if: predicted throughput (data parallel)", height=420)
    return fig


def predicted_vs_measured(df: pd.DataFrame) -> go.Figure:
    """Held-out step times: predicted against measured, one marker per record, the diagonal for reference."""
    ok = df.dropna(subset=["predicted_step_s"])
    fig = go.Figure()
    for (system, study), g in ok.groupby(["system", "study"]):
        text = [f"record {rid[:8]}: {d} dev, seq {s}, mb {b}, GAS {k}; error {100 * e:+.1f} %"
                for rid, d, s, b, k, e in zip(g["record_id"], g["devices"], g["seq_len"], g["micro_batch_size"],
                                              g["gas"], g["step_error"])]
        fig.add_trace(go.Scatter(x=g["measured_step_s"], y=g["predicted_step_s"], mode="markers",
                                 name=f"{system} · {study}", text=text,
                                 hovertemplate="measured %{x:.3g} s, predicted %{y:.3g} s<br>%{text}"))
    lo, hi = ok[["measured_step_s", "predicted_step_s"]].min().min(), ok[["measured_step_s", "predicted_step_s"]].max().max()
    fig.add_trace(go.Scatter(x=[lo, hi], y=[lo, hi], mode="lines", line={"dash": "dot", "color": "grey"},
                             name="predicted = measured"))
    fig.update_xaxes(title_text="measured step time (s)", type="log")
    fig.update_yaxes(title_text="predicted step time (s, held out)", type="log")
    fig.update_layout(template="plotly_white", title="Held-out step time: predicted against measured", height=460)
    return fig
