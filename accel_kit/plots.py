"""Plot helpers shared by the studies: readable plotly figures, saved as standalone HTML."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from accel_kit.atomic import atomic_path, output_errors, write_text_atomic

_TEMPLATE = "plotly_white"


def _use_notebook_renderer() -> None:
    """In a Jupyter kernel, also store each figure as HTML, so that exported notebooks show it.

    There plotly's default renderer is "plotly_mimetype" alone, which only JupyterLab's plotly
    extension draws: ``jupyter nbconvert --to html`` shows no figure at all. "notebook" adds a
    text/html rendering and embeds plotly.js once per notebook (with the first figure), so the
    export works offline ("notebook_connected" would load plotly.js from the internet).
    PLOTLY_RENDERER, or a renderer chosen before this module is imported, is left as it is.
    """
    import os
    import sys

    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if os.environ.get("PLOTLY_RENDERER") or type(shell).__name__ != "ZMQInteractiveShell":
        return
    import plotly.io as pio

    if pio.renderers.default == "plotly_mimetype":
        pio.renderers.default = "plotly_mimetype+notebook"


_use_notebook_renderer()


def _error_y(part: pd.DataFrame, y: str) -> dict | None:
    """Error bars from ``<y>_lo`` / ``<y>_hi`` (``accel_kit.noise.with_spread``: the trials' IQR, widened
    to the runs' range); None where the rows carry none (one trial, one run, or a quantity with no trials)."""
    lo, hi = f"{y}_lo", f"{y}_hi"
    if lo not in part.columns or hi not in part.columns or not part[lo].notna().any():
        return None
    return dict(type="data", symmetric=False, array=(part[hi] - part[y]).clip(lower=0).fillna(0).tolist(),
                arrayminus=(part[y] - part[lo]).clip(lower=0).fillna(0).tolist(), thickness=1.5, width=4)


# What an error bar is, said on every figure that draws one (under its title): the same band a table's
# spread column gives (``accel_kit.noise.with_spread``), not a confidence interval.
ERROR_BARS = "bars: interquartile range of the trials, widened to the range of the point's runs"


def _bars_note(fig: go.Figure) -> None:
    if any(getattr(tr, "error_y", None) is not None and tr.error_y.array is not None for tr in fig.data):
        fig.update_layout(title_text=f"{fig.layout.title.text}<br><sup>{ERROR_BARS}</sup>")


def with_precision(df: pd.DataFrame, group: list[str], title: str) -> tuple[list[str], str]:
    """The precision that ran, in every figure: in the title when the rows share one, else in the legend."""
    if "precision" not in df.columns or df.empty:
        return group, title
    precisions = sorted(df["precision"].dropna().astype(str).unique())
    if len(precisions) == 1:
        return group, f"{title} ({precisions[0]})"
    return (group if "precision" in group else group + ["precision"]), title


def swept_ticks(fig: go.Figure, values, axis: str = "x") -> None:
    """Ticks at the values swept (GAS 1, 2, 4; devices 1, 2, 4, 8), on a log axis too, not plotly's own."""
    ticks = sorted({v for v in values if v is not None and not pd.isna(v)})
    if not ticks or len(ticks) > 16:
        return
    text = [f"{v:,.0f}" if float(v).is_integer() else f"{v:g}" for v in ticks]
    (fig.update_xaxes if axis == "x" else fig.update_yaxes)(tickmode="array", tickvals=ticks, ticktext=text)


def _label(row: pd.Series, group: list[str], varying: list[str]) -> str:
    parts = [str(row[g]) for g in group if g in varying]
    return " · ".join(parts) if parts else str(row[group[0]])


def grouped_bars(df: pd.DataFrame, *, x: str, y: str, facet: str, group: list[str], title: str,
                 x_title: str, y_title: str, facet_order: list[str] | None = None,
                 hover: list[str] | None = None, note: str | None = None) -> go.Figure:
    """Bars of ``y`` against categorical ``x``, one panel per ``facet`` value, one colour per group.

    Group labels name only the columns of ``group`` that vary (one system: colour by impl). ``note``: a
    line under the title (what the error bars are, where they are not ``ERROR_BARS``, which is said by default).
    """
    if facet != "precision":
        group, title = with_precision(df, group, title)
    title += f"<br><sup>{note}</sup>" if note else ""
    varying = [g for g in group if g in df.columns and df[g].nunique() > 1]
    df = df.assign(_group=df.apply(_label, axis=1, group=group, varying=varying))
    facets = [f for f in (facet_order or []) if f in set(df[facet])] + sorted(
        set(df[facet]) - set(facet_order or []))
    fig = make_subplots(rows=1, cols=len(facets), subplot_titles=[str(f) for f in facets], shared_yaxes=True)
    colors = _colors(sorted(df["_group"].unique()))
    hover = _hover_columns(df, hover)
    for col, fval in enumerate(facets, 1):
        sub = df[df[facet] == fval]
        for name, part in sub.groupby("_group", sort=True):
            part = part.sort_values(x)
            fig.add_trace(go.Bar(
                x=part[x].astype(str), y=part[y], name=name, legendgroup=name, showlegend=col == 1,
                error_y=_error_y(part, y),
                marker_color=colors[name], customdata=_customdata(part, hover),
                hovertemplate=_hovertemplate(x, y, hover, df)), row=1, col=col)
        fig.update_xaxes(title_text=x_title, type="category", row=1, col=col)
    fig.update_yaxes(title_text=y_title, row=1, col=1)
    fig.update_layout(title=title, barmode="group", template=_TEMPLATE, legend_title_text=" · ".join(varying) or group[0],
                      height=450, width=max(600, 380 * len(facets)))
    if note is None:  # (a note of the caller's own says what its bars are)
        _bars_note(fig)
    return fig


def line(df: pd.DataFrame, *, x: str, y: str, group: list[str], title: str, x_title: str, y_title: str,
         log_x: bool = False, log_y: bool = False, hover: list[str] | None = None) -> go.Figure:
    """Lines with markers of ``y`` against ``x``, one trace per group; error bars where the rows carry
    ``<y>_lo`` / ``<y>_hi``; ticks at the values of ``x`` when it is numeric."""
    group, title = with_precision(df, group, title)
    varying = [g for g in group if g in df.columns and df[g].nunique() > 1] or group[:1]
    df = df.assign(_group=df.apply(_label, axis=1, group=group, varying=varying))
    colors = _colors(sorted(df["_group"].unique()))
    hover = _hover_columns(df, hover)
    fig = go.Figure()
    for name, part in df.groupby("_group", sort=True):
        part = part.sort_values(x)
        fig.add_trace(go.Scatter(x=part[x], y=part[y], name=name, mode="lines+markers",
                                 line_color=colors[name], error_y=_error_y(part, y), customdata=_customdata(part, hover),
                                 hovertemplate=_hovertemplate(x, y, hover, df)))
    fig.update_layout(title=title, template=_TEMPLATE, xaxis_title=x_title, yaxis_title=y_title,
                      legend_title_text=" · ".join(varying), height=450, width=750)
    if log_x:
        fig.update_xaxes(type="log")
    if pd.api.types.is_numeric_dtype(df[x]):
        swept_ticks(fig, df[x])
    if log_y:
        fig.update_yaxes(type="log")
    _bars_note(fig)
    return fig


def has_values(df: pd.DataFrame, column: str) -> bool:
    """Whether any row of ``df`` has a figure in ``column`` (energy is null where the device reads none)."""
    return column in df.columns and bool(df[column].notna().any())


def energy_line(df: pd.DataFrame, *, x: str, group: list[str], title: str, x_title: str,
                log_x: bool = False) -> go.Figure | None:
    """Tokens per joule against ``x``, the companion of a tokens/s figure; None when no record has energy.

    Records without a reading (null ``tokens_per_j``) are left out, not drawn as zero; the hover
    gives tokens/s and the average power beside each point.
    """
    if not has_values(df, "tokens_per_j"):
        return None
    return line(df[df["tokens_per_j"].notna()], x=x, y="tokens_per_j", group=group, title=title, x_title=x_title,
                y_title="tokens / J", log_x=log_x, hover=["tokens_per_s", "power_avg_w", "energy_j"])


# Where a figure's rows carry them, every point's hover names its record (the cross-system
# report adds ``provenance``: date, commit, device, versions), so a number leads to its record.
_PROVENANCE = ("record_id", "provenance")


def _hover_columns(df: pd.DataFrame, hover: list[str] | None) -> list[str]:
    cols = [h for h in (hover or []) if h in df.columns and h not in _PROVENANCE]
    return cols + [c for c in _PROVENANCE if c in df.columns]


def _customdata(part: pd.DataFrame, hover: list[str]):
    if not hover:
        return None
    data = part[hover].copy()
    if "record_id" in data:
        data["record_id"] = data["record_id"].astype(str).str[:12]
    return data.to_numpy()


def _hovertemplate(x: str, y: str, hover: list[str], df: pd.DataFrame | None = None) -> str:
    lines = [f"{x}=%{{x}}", f"{y}=%{{y:.3g}}"]
    for i, h in enumerate(hover):
        if h == "record_id":
            lines.append(f"record %{{customdata[{i}]}}")
        elif h == "provenance":
            lines.append(f"%{{customdata[{i}]}}")
        elif df is not None and not pd.api.types.is_numeric_dtype(df[h]):
            lines.append(f"{h}=%{{customdata[{i}]}}")
        else:
            lines.append(f"{h}=%{{customdata[{i}]:.3g}}")
    return "<br>".join(lines) + "<extra>%{fullData.name}</extra>"


def _colors(names: list[str]) -> dict[str, str]:
    import plotly.express as px

    palette = px.colors.qualitative.Safe + px.colors.qualitative.Vivid
    return {n: palette[i % len(palette)] for i, n in enumerate(names)}


def save_html(figs: dict[str, go.Figure], folder: str | Path) -> list[Path]:
    """Write each figure to ``folder/<name>.html``; plotly.js is written once beside them (works offline).

    Each file is replaced atomically: a notebook interrupted while saving leaves the previous
    figure, not a truncated page.
    """
    folder = Path(folder)
    with output_errors(folder, "figures folder"):
        folder.mkdir(parents=True, exist_ok=True)
    bundle = folder / "plotly.min.js"
    if figs and not bundle.exists():
        # Written here, atomically: plotly writes it only when absent, in place, so a bundle
        # truncated by an interrupted save would otherwise stay broken for every later figure.
        from plotly.offline import get_plotlyjs

        write_text_atomic(bundle, get_plotlyjs(), what="figures' plotly.js")
    paths = []
    for name, fig in figs.items():
        path = folder / f"{name}.html"
        with atomic_path(path, "figure") as tmp:
            # "directory": the page loads the plotly.min.js beside it.
            fig.write_html(tmp, include_plotlyjs="directory", full_html=True)
        paths.append(path)
    return paths
