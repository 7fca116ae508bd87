"""Weight sparsity (paper Figures 7 and 8): throughput and loss, dense against sparse.

The paper could run this only on a Cerebras CS-2, whose hardware skips zero weights. Here
it runs wherever accel-kit runs, so every record says how the pruned layers really executed
(``sparse_execution``): a sparse kernel where one exists for the device and measured faster
than dense, otherwise zeros multiplied in a dense matmul. Pruning, masks and kernels are in
``accel_kit.sparsity``.

Two kinds of runs, from one set of parameters:

- **Throughput (Figure 7):** each of ``presets`` at each sparsity (the dense model, s = 0,
  always included) and, with pattern ``2:4``, at 2:4; a few timed steps each. Reported
  relative to the dense model of the same preset, beside the FLOP-proportional ideal
  (dense-equivalent / effective FLOPs): the speedup a device that skips every zero would get.
- **Loss curves (Figure 8):** ``preset`` trained ``loss_steps`` steps at each sparsity on
  the same tokens from the same seed (same initial weights before pruning); the final loss
  gap to dense in percent (losses averaged over the last ``LOSS_WINDOW`` steps). With
  ``dense_finetune_steps``, every run continues that many steps with all weights trainable
  (the dense run simply trains on, so all are compared at equal tokens): the paper's
  "sparse pre-train, dense fine-tune", and how much of the gap it closes.
"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, ClassVar, Literal

import pandas as pd
from pydantic import Field

from accel_kit import energy, noise, results
from accel_kit.models import check_preset
from accel_kit import identity
from accel_kit.studies.study import Headline, ReportTable, Row, Study
from accel_kit.studies.training import TrainingParams, make_point, resolve_precision, run_points
from accel_kit.systems import System

NAME = "sparsity"
# The columns a table names (with them, every key field that varies among its rows); a sparse point's
# dense baseline shares every key field but the sparsity's (``identity.config_key``).
GROUP = ["system", "preset", "precision", "micro_batch_size", "seq_len", "steps", "warmup_steps", "sparse_kernels",
         "dense_finetune_steps", "data"]
KEYS = GROUP + ["sparsity_pattern", "sparsity"]
LOSS_WINDOW = 10  # a run's final loss: the mean over its last LOSS_WINDOW steps (one batch is noisy)

Sparsity = Annotated[float, Field(ge=0, lt=1)]


class Params(TrainingParams):
    """Weight-sparsity study parameters (plus every training parameter).

    ``preset`` is the model of the loss curves (Figure 8); ``presets`` are the models of the
    throughput comparison (Figure 7).
    """

    REPLACED_BY: ClassVar[dict[str, str]] = {"sparsity": "sparsities (a list)",
                                             "sparsity_pattern": "sparsity_patterns (a list)"}
    presets: list[str] = Field(default=["gpt2-xl", "gpt3-6.7b", "gpt3-30b"], min_length=1)
    sparsities: list[Sparsity] = Field(default=[0.0, 0.6, 0.8, 0.9], min_length=1)  # unstructured; 0 = dense
    sparsity_patterns: list[Literal["unstructured", "2:4"]] = Field(default=["unstructured", "2:4"], min_length=1)
    # (sparse_kernels defaults to auto here: a sparse kernel where one exists and beats dense)
    sparse_kernels: Literal["dense", "auto"] = "auto"
    loss_steps: int = Field(default=0, ge=0)  # optimizer steps of each loss-curve run; 0: no loss curves
    loss_warmup_steps: int = Field(default=10, ge=0)  # learning-rate warm-up of the loss-curve runs
    # (dense_finetune_steps, from the training spec, applies to the loss-curve runs only)

    def check(self, system: System) -> None:
        super().check(system)
        for preset in self.presets:
            check_preset(preset, "presets")


def configurations(params: Params) -> list[tuple[str, float]]:
    """(pattern, sparsity) pairs to run: the dense model first, then unstructured levels, then 2:4."""
    configs = [("unstructured", 0.0)]
    if "unstructured" in params.sparsity_patterns:
        configs += [("unstructured", s) for s in sorted(set(params.sparsities)) if s > 0]
    if "2:4" in params.sparsity_patterns:
        configs.append(("2:4", 0.5))
    return configs


def run(params: Params, system: System, *, records_path: Path, run_id: str, profile: str | None = None,
        progress: bool = True, rerun: bool = False) -> list[results.Record]:
    configs = configurations(params)
    choice = resolve_precision(params, system)
    points = [make_point(params, system, choice, preset=preset, sparsity=s, sparsity_pattern=pattern,
                         dense_finetune_steps=0)
              for preset in dict.fromkeys(params.presets) for pattern, s in configs]
    if params.loss_steps:
        points += [make_point(params, system, choice, sparsity=s, sparsity_pattern=pattern, steps=params.loss_steps,
                              warmup_steps=params.loss_warmup_steps)
                   for pattern, s in configs]
    points = list({p.key(): p for p in points}.values())  # a loss-curve run may equal a throughput run
    return run_points(NAME, params, system, points, records_path=records_path, run_id=run_id, profile=profile,
                      progress=progress, rerun=rerun)


# --------------------------------------------------------------------------- tables

def config_label(pattern: str, sparsity: float) -> str:
    """How a configuration is named in tables and figures: 'dense', 's=0.9', '2:4'."""
    if pattern == "2:4":
        return "2:4"
    return "dense" if sparsity == 0 else f"s={sparsity:g}"


def execution_label(kind: str | None, execution: str | None = None) -> str:
    """A short name for the execution path: from the record's ``sparse_execution_kind``.

    Records from before that column have only the text (``sparse_execution``): named by how it starts.
    """
    from accel_kit.sparsity import EXECUTION_LABELS

    if isinstance(kind, str) and kind in EXECUTION_LABELS:  # not NaN: a column the older records lack
        return EXECUTION_LABELS[kind]
    text = str(execution or "")
    if text.startswith("dense (no sparsity)"):
        return "dense model"
    if text.startswith("dense"):
        return "zeros in dense matmul"
    if text.startswith("CSR"):
        return "CSR sparse matmul"
    if text.startswith("2:4"):
        return "2:4 sparse tensor cores"
    return text or "?"


def final_loss(losses) -> float:
    """Mean of the last ``LOSS_WINDOW`` losses (NaN for a run shorter than two windows: too few to compare)."""
    if not isinstance(losses, list) or len(losses) < 2 * LOSS_WINDOW:
        return float("nan")
    return sum(losses[-LOSS_WINDOW:]) / LOSS_WINDOW


def _filled(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with the key columns older records lack, at their defaults."""
    df = df.copy()
    for col, default in (("sparsity", 0.0), ("sparsity_pattern", "unstructured"), ("sparse_kernels", "dense"),
                         ("dense_finetune_steps", 0), ("data", None)):
        if col not in df.columns:
            df[col] = default
    return df


def _latest(df: pd.DataFrame) -> pd.DataFrame:
    return results.latest(identity.with_point_key(_filled(df)))


def gap_band(losses, dense, gap: float) -> tuple[float, float]:
    """The error bar of a final loss gap (percent): the interquartile range of the per-step gap over the
    last ``LOSS_WINDOW`` steps, widened to take in ``gap``; NaN where either run is too short.

    A loss is not timed, so no trial spread applies; both runs saw the same batches, so the step-to-step
    spread of their gap is what the window's mean smooths over."""
    if pd.isna(gap) or not isinstance(losses, list) or not isinstance(dense, list) \
            or min(len(losses), len(dense)) < 2 * LOSS_WINDOW:
        return float("nan"), float("nan")
    band = noise.iqr(100 * (a / b - 1) for a, b in zip(losses[-LOSS_WINDOW:], dense[-LOSS_WINDOW:]) if b)
    return (min(band[0], gap), max(band[1], gap)) if band else (float("nan"), float("nan"))


def _bands(r: pd.Series, base: pd.Series | None, row: dict) -> dict:
    """A row's error bars: tokens/s and tokens/J (``accel_kit.noise``), the speedup over dense from both
    points' bands (``noise.ratio_band``), the loss gaps from their last window (``gap_band``)."""
    out = {f"{m}_{s}": r.get(f"{m}_{s}") for m in ("tokens_per_s", "tokens_per_j") for s in ("lo", "hi", "spread")}
    lo = hi = float("nan")
    # The dense point against itself is exactly 1: its noise is in every sparse point's bar instead.
    if base is not None and r["status"] == "ok" and r.get("record_id") != base.get("record_id"):
        lo, hi = noise.ratio_band(r.get("tokens_per_s_lo"), r.get("tokens_per_s_hi"), base.get("tokens_per_s_lo"),
                                  base.get("tokens_per_s_hi"))
    out |= {"speedup_vs_dense_lo": lo, "speedup_vs_dense_hi": hi, "speedup_vs_dense_spread": hi - lo}
    if base is not None and "loss_gap_pct" in row:
        for gap, key in (("loss_gap_pct", "losses"), ("finetune_gap_pct", "finetune_losses")):
            out[f"{gap}_lo"], out[f"{gap}_hi"] = gap_band(r.get(key), base.get(key), row[gap])
    return out


def loss_curve_rows(df: pd.DataFrame) -> pd.Series:
    """Which records are loss-curve runs (the study's ``loss_steps``, ``loss_warmup_steps``)."""
    if "loss_steps" not in df.columns:
        return pd.Series(False, index=df.index)
    return (df["loss_steps"].fillna(0) > 0) & (df["steps"] == df["loss_steps"]) & \
        (df["warmup_steps"] == df["loss_warmup_steps"])


# What the notebook's table shows (the rest is in ``table``): the paper's Figures 7 and 8 as numbers.
SHOWN = ("system", "preset", "precision", "micro_batch_size", "seq_len", "status", "config", "execution",
         "sparsity_measured", "tokens_per_s", "speedup_vs_dense", "ideal_speedup", "mfu_measured_pct", "loss_gap_pct",
         "loss_curve_run", "steps", "reason")


def table(df: pd.DataFrame) -> pd.DataFrame:
    """One row per point: throughput against dense, the FLOP-proportional ideal, how it ran, the loss gap.

    ``speedup_vs_dense``: tokens/s over the dense model's (same preset, shape and steps).
    ``ideal_speedup``: dense-equivalent over effective FLOPs, what skipping every zero would give.
    ``loss_gap_pct``: final loss (mean of the last 10 steps) over dense's, minus 1, in percent;
    ``finetune_gap_pct``: the same after the dense fine-tuning steps.
    """
    if df.empty:
        return df
    # Each point's latest record, with its spread.
    df = noise.with_spread(identity.with_point_key(_filled(df)), ["tokens_per_s", "tokens_per_j"])
    df = df.sort_values(GROUP + ["sparsity_pattern", "sparsity"], na_position="first")
    df["_loss_curve_run"] = loss_curve_rows(df)
    # A sparse point's dense baseline: the same configuration, every key field but the sparsity's.
    df["_config"] = identity.config_key(df, ["sparsity", "sparsity_pattern"])
    keys = identity.with_varying(KEYS, df)
    energy_cols = energy.table_columns(df)
    rows = []
    for _, g in df.groupby("_config", dropna=False, sort=False):
        dense = g[(g["sparsity"] == 0) & (g["status"] == "ok")]
        base = dense.iloc[0] if not dense.empty else None
        for _, r in g.iterrows():
            ok = r["status"] == "ok"
            row = {k: r.get(k) for k in keys} | {
                "config": config_label(r["sparsity_pattern"], r["sparsity"]),
                "status": r["status"],
                "sparsity_measured": r.get("sparsity_measured"),
                "execution": execution_label(r.get("sparse_execution_kind"), r.get("sparse_execution"))
                if ok else None,
                "tokens_per_s": r.get("tokens_per_s"),
                **{c: r.get(c) for c in energy_cols},
                "speedup_vs_dense": r["tokens_per_s"] / base["tokens_per_s"] if ok and base is not None else None,
                "ideal_speedup": r.get("flops_dense_equivalent") / r.get("flops_effective")
                if ok and r.get("flops_effective") else None,
                "tflops_per_device": r.get("tflops_per_device"),
                "tflops_effective_per_device": r.get("tflops_effective_per_device"),
                "mfu_pct": r.get("mfu_pct"),
                "mfu_measured_pct": r.get("mfu_measured_pct"),
                "loss_final": final_loss(r.get("losses")) if ok else None,
                "finetune_loss_final": final_loss(r.get("finetune_losses")) if ok else None,
                "sparse_execution": r.get("sparse_execution"),
                "reason": r.get("reason"),
                "record_id": r.get("record_id"),
            }
            if base is not None and ok:
                row["loss_gap_pct"] = 100 * (row["loss_final"] / final_loss(base.get("losses")) - 1)
                row["finetune_gap_pct"] = 100 * (row["finetune_loss_final"]
                                                 / final_loss(base.get("finetune_losses")) - 1)
            row["loss_curve_run"] = bool(r["_loss_curve_run"])
            rows.append(row | _bands(r, base, row))
    out = pd.DataFrame(rows)
    for col in ("speedup_vs_dense", "ideal_speedup", "loss_final", "finetune_loss_final", "loss_gap_pct",
                "finetune_gap_pct"):
        if col not in out.columns:
            out[col] = float("nan")
        out[col] = pd.to_numeric(out[col], errors="coerce")
    # What to read first, then what identifies the point, then the long texts.
    first = ["system", "preset", "config", "status", "execution", "sparsity_measured", "tokens_per_s",
             "speedup_vs_dense", "ideal_speedup", "tflops_per_device", "tflops_effective_per_device",
             "mfu_measured_pct", "mfu_pct", "loss_final", "loss_gap_pct", "finetune_loss_final", "finetune_gap_pct",
             "loss_curve_run"]
    last = ["sparse_execution", "reason", "record_id"] + [c for c in out.columns if c.endswith(("_lo", "_hi",
                                                                                                 "_spread"))]
    middle = [c for c in out.columns if c not in first and c not in last]
    return out[first + middle + last].reset_index(drop=True)


# --------------------------------------------------------------------------- figures

def figures(df: pd.DataFrame) -> dict:
    """Figure 7 (throughput relative to dense, per preset), Figure 8 (loss curves) and the loss gap."""
    from accel_kit import plots

    if df.empty:
        return {}
    t = table(df)
    figs = {}
    # Figure 7 from the throughput runs (a loss-curve run counts where its preset is one of ``presets``).
    speed = throughput_rows(t[t["speedup_vs_dense"].notna()], df)
    if not speed.empty:
        figs["sparsity_throughput"] = _throughput_figure(speed)
        if plots.has_values(speed, "tokens_per_j"):  # beside it, where the device reads its energy
            measured = speed[speed["tokens_per_j"].notna()]
            measured = measured.assign(config=pd.Categorical(measured["config"], categories=_order(measured["config"]),
                                                             ordered=True))
            figs["sparsity_energy"] = plots.grouped_bars(
                measured, x="config", y="tokens_per_j", facet="preset", group=["system", "precision", "execution"],
                title="Training energy efficiency against weight sparsity", note=ENERGY_BARS,
                x_title="weight sparsity",
                y_title="tokens / J", hover=["tokens_per_s", "power_avg_w", "speedup_vs_dense"])
    curves = df[loss_curve_rows(df) & (df["status"] == "ok")] if "status" in df.columns else df.iloc[:0]
    if not curves.empty:
        figs["sparsity_loss_curves"] = _loss_figure(_latest(curves))
        gaps = t[t["loss_curve_run"] & (t["sparsity"] > 0) & t["loss_gap_pct"].notna()]
        if not gaps.empty:
            figs["sparsity_loss_gap"] = _gap_figure(gaps)
    return figs


# What the error bars of each figure are (said in the figure: a reader cannot tell them apart otherwise).
THROUGHPUT_BARS = ("error bars: the range of sparse over dense tokens/s from both points' spreads "
                   "(trials' IQR, widened to their runs)")
ENERGY_BARS = ("one energy reading covers all of a point's trials: error bars only where a point ran more than "
               "once (the runs' range)")
GAP_BARS = (f"a loss is not timed, so no trial spread applies; error bars: the IQR of the per-step gap over "
            f"the last {LOSS_WINDOW} steps (same batches)")


def throughput_rows(t: pd.DataFrame, df: pd.DataFrame) -> pd.DataFrame:
    """The rows of ``t`` (the study's table over the records ``df``) that Figure 7 compares: the throughput runs,
    and a loss-curve run where its preset is one of the throughput ``presets``."""
    if t.empty:
        return t
    presets = (set(df["preset"]) if "presets" not in df.columns
               else {p for value in df["presets"] if isinstance(value, list) for p in value})
    return t[~t["loss_curve_run"] | t["preset"].isin(presets)]


def loss_rows(t: pd.DataFrame, df: pd.DataFrame) -> pd.DataFrame:
    """The rows of ``t`` that Figure 8 compares: the loss-curve runs."""
    return t[t["loss_curve_run"]] if not t.empty else t


def _order(configs) -> list[str]:
    def key(label: str):
        return (label != "dense", label == "2:4", float(label[2:]) if label.startswith("s=") else 0.0)
    return sorted(set(configs), key=key)


def _throughput_figure(t: pd.DataFrame):
    import plotly.graph_objects as go

    from accel_kit import plots

    t = t.assign(config=pd.Categorical(t["config"], categories=_order(t["config"]), ordered=True))
    fig = plots.grouped_bars(t, x="config", y="speedup_vs_dense", facet="preset",
                             group=["system", "precision", "execution"],
                             title="Figure 7: training throughput relative to the dense model",
                             note=THROUGHPUT_BARS,
                             x_title="weight sparsity", y_title="tokens/s relative to dense",
                             hover=["tokens_per_s", "sparsity_measured", "ideal_speedup"])
    facets = sorted(set(t["preset"]))
    for col, preset in enumerate(facets, 1):
        sub = t[t["preset"] == preset].drop_duplicates("config").sort_values("config")
        fig.add_trace(go.Scatter(
            x=sub["config"].astype(str), y=sub["ideal_speedup"], mode="markers", name="FLOP-proportional ideal",
            legendgroup="ideal", showlegend=col == 1, marker=dict(symbol="line-ew-open", size=28, color="black",
                                                                  line=dict(width=2)),
            hovertemplate="ideal (dense / effective FLOPs) = %{y:.2f}x<extra></extra>"), row=1, col=col)
    fig.add_hline(y=1.0, line_dash="dot", line_color="grey")
    fig.update_xaxes(categoryorder="array", categoryarray=list(t["config"].cat.categories))
    fig.update_layout(legend=dict(orientation="h", y=-0.25), height=500)
    return fig


def _loss_figure(curves: pd.DataFrame):
    """Loss per step (top) and its difference to the dense run at the same step (bottom).

    Every run sees the same batches in the same order, so the per-step difference cancels
    most of the batch-to-batch noise that hides a gap of a few percent in the raw curves.
    """
    import plotly.express as px
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    series, switch, records = {}, [], {}
    systems = sorted(set(curves["system"]))  # several machines' runs: one dash style each
    for _, r in curves.iterrows():
        tail = list(r["finetune_losses"]) if isinstance(r.get("finetune_losses"), list) else []
        label = config_label(r["sparsity_pattern"], r["sparsity"])
        name = label if curves["preset"].nunique() == 1 else f"{r['preset']} · {label}"
        if len(systems) > 1:
            name = f"{r['system']} · {name}"
        key = (r["system"], r["preset"], label, name)
        series[key] = pd.Series(list(r["losses"]) + tail, dtype=float)
        records[key] = str(r.get("record_id") or "")[:12]
        if tail:
            switch.append(len(r["losses"]))
    order = _order(label for _, _, label, _ in series)
    palette = px.colors.qualitative.Safe
    colors = {label: palette[i % len(palette)] for i, label in enumerate(order)}
    dashes = ["solid", "dash", "dot", "dashdot"]
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.6, 0.4], vertical_spacing=0.06)
    smooth = lambda v: v.rolling(LOSS_WINDOW, min_periods=1).mean()  # noqa: E731
    for key, loss in sorted(series.items(), key=lambda kv: (kv[0][0], kv[0][1], order.index(kv[0][2]))):
        system, preset, label, name = key
        steps = list(range(1, len(loss) + 1))
        style = dict(color=colors[label], width=3 if label == "dense" else 2,
                     dash=dashes[systems.index(system) % len(dashes)])
        record = f"<br>record {records[key]}" if records[key] else ""
        fig.add_trace(go.Scatter(x=steps, y=smooth(loss), name=name, legendgroup=name, mode="lines", line=style,
                                 hovertemplate="step %{x}<br>loss %{y:.3f}" + record + "<extra>" + name + "</extra>"),
                      row=1, col=1)
        dense = series.get(next((k for k in series if k[:2] == (system, preset) and k[2] == "dense"), None))
        if dense is not None and label != "dense":
            n = min(len(dense), len(loss))
            gap = smooth(100 * (loss[:n] / dense[:n] - 1))
            fig.add_trace(go.Scatter(x=steps[:n], y=gap, name=name, legendgroup=name, showlegend=False,
                                     mode="lines", line=style,
                                     hovertemplate="step %{x}<br>%{y:.2f} % above dense" + record
                                     + "<extra>" + name + "</extra>"),
                          row=2, col=1)
    fig.add_hline(y=0, line_color="grey", row=2, col=1)
    if switch:
        fig.add_vline(x=max(switch) + 0.5, line_dash="dash", line_color="grey")
        fig.add_annotation(x=max(switch) + 0.5, y=1, yref="paper", text="dense fine-tuning from here",
                           showarrow=False, xanchor="left", yanchor="bottom")
    fig.update_yaxes(title_text="training loss (nats/token)", row=1, col=1)
    fig.update_yaxes(title_text="% above dense", row=2, col=1)
    fig.update_xaxes(title_text="optimizer step (same batches for every run)", row=2, col=1)
    fig.update_layout(title=f"Figure 8: training loss, dense against sparse (mean over {LOSS_WINDOW} steps)",
                      template="plotly_white", legend_title_text="weight sparsity", height=650, width=900)
    return fig


def _gap_figure(gaps: pd.DataFrame):
    from accel_kit import plots

    rows = []
    for _, r in gaps.iterrows():
        # (labels sort in phase order: grouped_bars orders groups by name)
        for phase, gap in (("sparse training", "loss_gap_pct"), ("then dense fine-tuning", "finetune_gap_pct")):
            if pd.notna(r[gap]):
                rows.append({**r.to_dict(), "phase": phase, "gap": r[gap], "gap_lo": r.get(f"{gap}_lo"),
                             "gap_hi": r.get(f"{gap}_hi")})
    long = pd.DataFrame(rows)
    long["config"] = pd.Categorical(long["config"], categories=_order(long["config"]), ordered=True)
    fig = plots.grouped_bars(long, x="config", y="gap", facet="preset", group=["system", "phase"],
                             title=f"Final loss gap to dense (mean of the last {LOSS_WINDOW} steps of each phase)",
                             note=GAP_BARS,
                             x_title="weight sparsity", y_title="loss above dense (%)",
                             hover=["loss_final", "sparsity_measured"])
    fig.add_hline(y=0.0, line_color="grey")
    fig.update_xaxes(categoryorder="array", categoryarray=list(long["config"].cat.categories))
    return fig


STUDY = Study(
    NAME, Params, table, figures, run=run, keys=tuple(KEYS), shown=SHOWN, axis=("sparsity", "sparsity_pattern"),
    headline=Headline("tokens_per_s", "tokens/s", ("preset", "seq_len", "micro_batch_size", "steps",
                                                    "sparsity_pattern", "sparsity")),
    report=(
        # Figure 7's numbers: each sparse point against the dense one of its configuration.
        ReportTable("figure-7-data", ("preset", "config"), extra=("micro_batch_size", "seq_len", "steps",
                                                                   "sparse_kernels"), select=throughput_rows, rows=(
            Row("tokens_per_s"),
            Row("speedup_vs_dense", "relative to dense", "ratio", derived=True, base=True,
                reason="no ok dense record of this preset"),
            Row("ideal_speedup", "FLOP-proportional ideal", "ratio", derived=True,
                reason="effective FLOPs not recorded"),
            Row("execution", "how it ran", "text", derived=True),
            Row("tokens_per_j"))),
        # Figure 8's numbers: the loss-curve runs' final loss and its gap to dense.
        ReportTable("figure-8-data", ("preset", "config"), extra=("micro_batch_size", "seq_len", "steps",
                                                                   "dense_finetune_steps"), select=loss_rows, rows=(
            Row("loss_final", "final loss (nats)", "loss", derived=True, reason="fewer than two windows of 10 steps"),
            Row("loss_gap_pct", "above dense", "pct", derived=True, reason="no dense run to compare"),
            Row("finetune_gap_pct", "above dense after dense fine-tuning", "pct", derived=True,
                reason="this run had no dense fine-tuning steps")))))
