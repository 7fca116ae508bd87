"""Pivots: a study's table turned into one column per system and one row per (point, quantity).

``pivot`` is what every table of the paper is made with: columns are the report's systems
(split by precision where a system ran several), rows the points of the study (its parameters)
times the quantities asked for (``accel_kit.report.cells``). A cell whose point did not run
says why: no record of that point (``not run``), or the record's own status and reason.
"""
from __future__ import annotations

from typing import Sequence

import pandas as pd

import accel_kit.report.render as R
from accel_kit.report.cells import BUSY_NOTE, Quantity
from accel_kit.results import LAYOUT_DEFAULTS
from accel_kit.report.context import Context
from accel_kit.report.render import Table, esc


def _sort_value(value: object) -> tuple[int, float, str]:
    from accel_kit.models import PRESETS

    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (0, float(value), "")
    if isinstance(value, str) and value in PRESETS:
        return (1, list(PRESETS).index(value), value)
    return (2, 0.0, str(value))


def _columns(ctx: Context, t: pd.DataFrame, split_precision: bool) -> tuple[list[str], dict[str, str], pd.Series]:
    """Column labels (every system of the report, split by precision where one ran several),
    their notes, and each table row's column."""
    labels, notes = [], {}
    col = pd.Series(dtype=object, index=t.index)
    for system in ctx.systems:
        rows = t[t["system"] == system] if not t.empty else t
        precisions = sorted(rows["precision"].dropna().unique()) if "precision" in rows and not rows.empty else []
        if split_precision and len(precisions) > 1:
            for p in precisions:
                label = f"{system} · {p}"
                labels.append(label)
                notes[label] = p
                col[rows.index[rows["precision"] == p]] = label
        else:
            labels.append(system)
            if len(precisions) == 1:
                notes[system] = precisions[0]
            elif not precisions:
                notes[system] = "no records" if rows.empty else ""
            if not rows.empty:
                col[rows.index] = system
    return labels, notes, col


def _row_keys(t: pd.DataFrame, base: list[str], extra: list[str]) -> list[str]:
    """``base``, plus each ``extra`` key, then each key field of the points (``identity.key_fields``), that
    tells apart two rows that would share a cell: two presets or sequence lengths are two rows, never one."""
    from accel_kit import identity

    keys = [k for k in base if k in t.columns]
    fields = [f for f in identity.key_fields(t) if f not in ("system", "precision")] if not t.empty else []
    layout = set(LAYOUT_DEFAULTS) if "layout" in keys else set()
    for k in list(extra) + [f for f in fields if f not in extra and f not in layout]:
        if k in t.columns and k not in keys and not t.empty:
            if t.groupby(keys + ["_col"], dropna=False)[k].nunique(dropna=False).gt(1).any():
                keys.append(k)
    return keys


def pivot(ctx: Context, table_id: str, t: pd.DataFrame, *, study: str, base: list[str], extra: list[str],
          quantities: Sequence[Quantity], split_precision: bool = True, caption: str = "") -> Table:
    """A table with one column per system and one row per (point, quantity).

    A point's record with status ok fills each quantity's cell through its function; any
    other status fills every cell of that point with the status and reason; a column without
    a record of the point says ``not run`` and why.
    """
    t = t.copy() if not t.empty else pd.DataFrame(columns=["system", "status", "record_id"] + base)
    columns, notes, col = _columns(ctx, t, split_precision)
    t["_col"] = col
    keys = _row_keys(t, base, extra)
    headers = [k.replace("_", " ") for k in keys] + ["quantity"]
    table = Table(table_id, headers, columns, column_notes=notes, caption=caption)
    points = sorted({_norm(tuple(r)) for r in t[keys].itertuples(index=False)} if not t.empty else set(),
                    key=lambda p: tuple(_sort_value(v) for v in p))
    by_cell: dict[tuple, pd.Series] = {}
    for _, row in t.iterrows():
        by_cell[(_norm(tuple(row[k] for k in keys)), row["_col"])] = row  # (one row per cell: see _row_keys)
    for point in points:
        for i, (name, fn) in enumerate(quantities):
            cells = []
            for column in columns:
                row = by_cell.get((_norm(point), column))
                if row is None:
                    system = column.split(" · ")[0]
                    why = (f"no record of this point from {system}" if ctx.has(study, system)
                           else f"no {study} records from {system}")
                    cell = R.not_run(why)
                elif row["status"] != "ok":
                    cell = R.status_cell(row["status"], None if R.is_missing(row.get("reason"))
                                         else row.get("reason"), row["record_id"])
                else:
                    cell = fn(ctx, row, ctx.rec(row["record_id"]))
                # A point that did not run gives its reason once, in its first quantity's row.
                cell.compact = i > 0 and (row is None or row["status"] != "ok")
                cells.append(cell)
            table.add([R.fmt_key(v) for v in point] + [name], cells)
    if any(ctx.metrics(r).get("machine_busy") for r in t["record_id"] if r in ctx.records.by_id):
        table.caption = " ".join(filter(None, [table.caption, esc(BUSY_NOTE)]))
    if not points:  # no record of this study at all: one row that says so for every system
        table.row_headers = ["quantity"]
        table.add(["any"], [R.not_run(f"no {study} records from {c}") for c in columns])
    return table


def _norm(key: tuple) -> tuple:
    # NaN != NaN: a missing key part is None, so that the cell is found again.
    return tuple(None if R.is_missing(v) else v for v in key)


def declared_pivot(ctx: Context, study: str, table_id: str, caption: str = "") -> Table:
    """The report table ``table_id`` that ``study`` declares (``Study.report``): its rows, the points' keys that
    name them and the quantities, over the study's table of the context's records."""
    from accel_kit import studies
    from accel_kit.report.cells import declared

    found = studies.get_study(study)
    spec = found.report_table(table_id)
    df = ctx.study(study)
    t = found.table(df, spec.table or "table") if not df.empty else df
    if spec.select is not None and not t.empty:
        t = spec.select(t, df)
    return pivot(ctx, table_id, t, study=study, base=list(spec.base), extra=list(spec.extra),
                 quantities=declared(found, spec, t), split_precision=spec.split_precision, caption=caption)
