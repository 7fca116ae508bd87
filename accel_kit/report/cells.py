"""Cell helpers: the quantities a table row shows, each a function ``(ctx, row, record) -> Cell``.

A quantity reads a record's metrics (``metric``, ``energy``) or a column of the study's own
table (``derived``); a missing value becomes ``not measured`` with the reason the record gives
(``energy_reason`` for the energy fields). ``base_record`` finds the record a ratio (speedup,
gain) is taken against, so that the cell cites it too. ``declared`` turns the rows a study declares for a
report table (``accel_kit.studies.ReportTable``) into these quantities.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence

import pandas as pd

import accel_kit.report.render as R
from accel_kit import noise
from accel_kit.report.context import Context
from accel_kit.report.render import Cell
from accel_kit.results import Record

if TYPE_CHECKING:
    from accel_kit.studies.study import ReportTable, Row, Study

# A row of a pivot table: its name and the function that makes each system's cell.
Quantity = tuple[str, Callable[[Context, pd.Series, Record], Cell]]


def metric(name: str, fmt=R.fmt_num, reason_key: str | None = None, default_reason: str | None = None):
    """A quantity read from the record's metrics; its reason key explains a missing value."""
    def cell(ctx: Context, row: pd.Series, rec: Record) -> Cell:
        m = rec.metrics
        reason = m.get(reason_key) if reason_key else None
        return R.value_cell(m.get(name), [rec.record_id], fmt, reason=reason or default_reason)
    return cell


def derived(column: str, fmt=R.fmt_num, *, also: Callable[[pd.Series], list[str]] | None = None,
            reason: str = "not derived for this point"):
    """A quantity from the study's own table (``column``), citing the row's record and ``also``'s."""
    def cell(ctx: Context, row: pd.Series, rec: Record) -> Cell:
        ids = [rec.record_id] + (also(row) if also else [])
        return R.value_cell(row.get(column), ids, fmt, reason=reason)
    return cell


def rate(study: str, label: str, name: str, rates: tuple[str, ...] | None = None,
         no_spread: str = "one trial and one run: noise not measured") -> list[Quantity]:
    """A throughput and, in the row below it, its spread (``Context.spreads``: the trials' IQR widened to the
    point's runs), both rounded to the digits the spread supports (``accel_kit.noise``). Below, not beside:
    a pivot's columns are the systems, so a spread column per system would double the table's width.
    ``rates``: the study's rates to spread, ``name`` among them (None: ``noise.RATES``); ``no_spread``: what a
    blank spread means."""
    def band(ctx: Context, row: pd.Series, rec: Record) -> tuple[float | None, float]:
        spreads = ctx.spreads(study, rates)
        value = rec.metrics.get(name)
        found = rec.record_id in spreads.index and f"{name}_spread" in spreads.columns
        spread = spreads.at[rec.record_id, f"{name}_spread"] if found else float("nan")
        return value, float(spread) if not pd.isna(spread) else float("nan")

    def value(ctx: Context, row: pd.Series, rec: Record) -> Cell:
        v, spread = band(ctx, row, rec)
        places = noise.decimals(spread, v)
        busy = f" {BUSY_MARK}" if rec.metrics.get("machine_busy") else ""
        return R.value_cell(v, [rec.record_id], lambda x: noise.fmt(x, places) + busy)

    def spread(ctx: Context, row: pd.Series, rec: Record) -> Cell:
        v, spread = band(ctx, row, rec)
        places = noise.decimals(spread, v)
        return R.value_cell(spread, [rec.record_id], lambda x: noise.fmt(x, places), reason=no_spread)
    return [(label, value), (f"{label} spread", spread)]


# A throughput measured while other work kept the machine busy (the record's ``machine_busy``): marked in its
# cell, the mark said under the table (``pivot``).
BUSY_MARK = "(busy)"
BUSY_NOTE = (f"{BUSY_MARK}: measured while the machine was busy with other work during the timed window "
             "(the record's load_others_cpu_pct: the CPU time other processes took); its numbers may be low.")

ENERGY_FIELDS = ("energy_j", "power_avg_w", "tokens_per_j", "flops_per_j")


def energy(work: str = "tokens"):
    """Work per joule (``tokens_per_j`` or ``flops_per_j``), or why the record has none."""
    def cell(ctx: Context, row: pd.Series, rec: Record) -> Cell:
        m = rec.metrics
        return R.value_cell(m.get(f"{work}_per_j"), [rec.record_id], R.fmt_num, reason=energy_reason(m))
    return cell


def energy_reason(m: dict) -> str:
    """Why a record has no energy figure: the reason it gives, or that it predates the fields."""
    for key, value in m.items():
        if value and key.endswith("_reason") and ("energy" in key or "power" in key or "_per_j" in key):
            return str(value)
    if not any(k in m for k in ENERGY_FIELDS):
        return "this record has no energy fields (written before accel-kit measured energy)"
    return "the record's energy fields are empty and give no reason"


MFU_DATASHEET: Quantity = ("MFU, datasheet peak", metric("mfu_pct", R.fmt_pct, "mfu_reason"))
MFU_MEASURED: Quantity = ("MFU, measured peak", metric("mfu_measured_pct", R.fmt_pct, "mfu_measured_reason"))


def base_record(t: pd.DataFrame, row: pd.Series, axis: str | Sequence[str]) -> list[str]:
    """The record of the smallest ``axis`` value with status ok in ``row``'s configuration (every key field
    but ``axis``: ``identity.config_key``): the base of a ratio."""
    from accel_kit import identity

    configs = identity.config_key(t, axis)
    mine = identity.config_key(t.loc[[row.name]], axis).iloc[0] if row.name in t.index else None
    same = t[(t["status"] == "ok") & (configs == mine)] if mine is not None else t.iloc[0:0]
    if same.empty:
        return []
    return [same.sort_values([axis] if isinstance(axis, str) else list(axis)).iloc[0]["record_id"]]


# How a declared row writes its value (``accel_kit.studies.Row.fmt``).
FORMATS: dict[str, Callable[[float], str]] = {
    "num": R.fmt_num, "pct": R.fmt_pct, "ratio": R.fmt_ratio, "loss": R.fmt_loss,
    "ms": lambda v: R.fmt_num(v * 1e3), "yes_no": lambda v: "yes" if v else "no",
    "share_pct": lambda v: R.fmt_pct(100 * v)}
# A row's format where it names none: by its metric's unit.
UNIT_FORMATS = {"%": "pct", "nats": "loss", "bool": "yes_no"}
# The rows every table words alike (the peak each MFU is taken against).
NAMED: dict[str, Quantity] = {"mfu_pct": MFU_DATASHEET, "mfu_measured_pct": MFU_MEASURED}


def declared(study: Study, spec: ReportTable, t: pd.DataFrame) -> list[Quantity]:
    """The quantities of the study's declared report table ``spec`` over ``t`` (the study's table, its rows
    selected), each row of ``spec.rows`` in its order: a rate with its spread below it, work per joule with the
    record's energy reason, a column of the study's table (a ratio citing its base record too), or a metric."""
    return [q for row in spec.rows for q in _quantities(study, spec, t, row)]


def _quantities(study: Study, spec: ReportTable, t: pd.DataFrame, row: Row) -> list[Quantity]:
    from accel_kit import metrics
    from accel_kit.tables import header

    if row.label is None and row.name in NAMED:
        return [NAMED[row.name]]
    label = row.label or header(row.name)
    unit = metrics.METRICS[row.name].unit if row.name in metrics.METRICS else ""
    fmt = FORMATS[row.fmt or UNIT_FORMATS.get(unit, "num")] if row.fmt != "text" else None
    if row.spread if row.spread is not None else row.name in (spec.rates or noise.RATES):
        return rate(study.name, label, row.name, rates=spec.rates, no_spread=spec.no_spread)
    if row.name in ("tokens_per_j", "flops_per_j") and not row.derived:
        return [(label, energy(row.name[: -len("_per_j")]))]
    if not row.derived:
        stem = next((row.name[: -len(x)] for x in ("_pct", "_gib", "_s", "_j") if row.name.endswith(x)), row.name)
        return [(label, metric(row.name, fmt, row.reason_key or f"{stem}_reason", row.reason))]
    if fmt is None:  # a text the table derives (how a point ran)
        return [(label, lambda ctx, r, rec: R.text_cell(r.get(row.name), [rec.record_id], reason=row.reason))]
    axis = study.axis
    also = (lambda r: base_record(t, r, axis)) if row.base and axis is not None else None
    return [(label, derived(row.name, fmt, also=also, reason=row.reason or "not derived for this point"))]
