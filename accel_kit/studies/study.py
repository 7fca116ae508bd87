"""The study contract: each study declares once, in its module, ``STUDY = Study(...)``, what the runner, the
notebooks, the CLI and the report read of it.

A declaration names the study's parameters class, how its points are built (``points``: the generic runner
runs them) or run (``run``: a runner of its own), the keys its table names first, its table, the columns a
reader sees (``shown``), its figures and findings, the metric the report ranks systems by (``headline``) and
the quantities of its report tables (``report``). The report holds no per-study dict of its own: a metric
the record carries is shown in the notebook's table, the report's table and its headline by naming it here
(docs/engine.md, "Showing a new metric in the report").

The what-if predictor (``accel_kit.predict.what_if``) is no study: it measures nothing and writes no record
(a prediction is computed afresh from a study's records and the system's datasheet each time it is asked),
so it has no points, no resume, no records to tabulate across systems, and nothing for a ``Study``'s table,
findings or headline to read; the report shows its held-out error from the studies' records instead
(``accel_kit.report.what_if``). The predictor reads the studies' notebook helpers, so ``studies`` naming
``predict`` would also make the two packages one layer.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Literal, Mapping, Sequence

import pandas as pd

if TYPE_CHECKING:
    from accel_kit.engine.point import Point
    from accel_kit.params import StudyParams
    from accel_kit.results import Record
    from accel_kit.systems import System

# How a report cell writes a value: by the metric's unit where the row does not say (``Row.fmt``).
Format = Literal["num", "pct", "ratio", "loss", "ms", "yes_no", "share_pct", "text"]


@dataclass(frozen=True)
class Headline:
    """What the report's "Fastest system" finding ranks systems by: ``metric`` (in ``unit``), and the
    parameters a finding names of a point (``keys``)."""

    metric: str
    unit: str
    keys: tuple[str, ...]


@dataclass(frozen=True)
class Row:
    """One quantity of a report table (one row per point and quantity, one column per system).

    ``name``: a metric of the record (``accel_kit.metrics``), or, with ``derived``, a column the study's
    table computes (a ratio, a label). A rate of ``accel_kit.noise.RATES`` (or of the table's ``rates``) is
    shown with its spread in the row below; ``tokens_per_j`` and ``flops_per_j`` with the record's energy
    reason where missing."""

    name: str
    label: str | None = None  # None: accel_kit.tables.header(name)
    fmt: Format | None = None  # None: by the metric's unit (% -> pct, nats -> loss, else num)
    reason: str | None = None  # why a value is missing, where the record says nothing
    reason_key: str | None = None  # the record's metric saying why the value is missing (mfu_pct: mfu_reason)
    derived: bool = False  # a column of the study's table, not a metric of the record
    spread: bool | None = None  # its spread in the row below; None: where it is one of the table's rates
    base: bool = False  # a ratio: the cell also cites the record it is taken against (``Study.axis``'s smallest)


@dataclass(frozen=True)
class ReportTable:
    """A pivot of the study's table in the report: ``id`` (the table's element id), the parameters naming a row
    (``base``, then each of ``extra`` where it varies), the quantities (``rows``)."""

    id: str
    base: tuple[str, ...]
    rows: tuple[Row, ...]
    extra: tuple[str, ...] = ()
    split_precision: bool = True  # one column per system and precision where a system ran several
    table: str | None = None  # the study's second table it pivots (a key of ``Study.tables``); None: ``table``
    # the rows of the study's table it shows, given that table and the records (None: every row)
    select: Callable[[pd.DataFrame, pd.DataFrame], pd.DataFrame] | None = None
    rates: tuple[str, ...] | None = None  # the rates it spreads (None: accel_kit.noise.RATES)
    no_spread: str = "one trial and one run: noise not measured"  # what a blank spread means


@dataclass(frozen=True)
class Study:
    """One study, declared once (``STUDY`` in its module)."""

    name: str
    params: type[StudyParams]
    make_table: Callable[[pd.DataFrame], pd.DataFrame]  # the data: every column, the record ids
    figures: Callable[[pd.DataFrame], dict]
    points: Callable[[StudyParams, System], Sequence[Point]] | None = None  # run by ``run_declared``
    run: Callable[..., list[Record]] | None = None  # a runner of its own (it wins over points): (params, system,
    #                                                 *, records_path, run_id, profile, progress, rerun)
    keys: tuple[str, ...] = ()  # the columns its table names first
    shown: tuple[str, ...] | None = None  # the columns a reader of the notebook's table sees (None: all)
    findings: Callable[[pd.DataFrame], list[dict]] | None = None  # each {"text", "record_ids"}
    headline: Headline | None = None
    axis: str | tuple[str, ...] | None = None  # what a ratio (speedup, gain) is taken along: its base the smallest
    report: tuple[ReportTable, ...] = ()
    work: Literal["training", "inference"] = "training"  # what the report's title says its records cover
    tables: Mapping[str, Callable[[pd.DataFrame], pd.DataFrame]] = field(default_factory=dict)  # second tables

    def __post_init__(self) -> None:
        if self.points is None and self.run is None:
            raise ValueError(f"study {self.name!r} declares neither points (the generic runner's) nor a run")

    def table(self, df: pd.DataFrame, which: str = "table") -> pd.DataFrame:
        """The study's table (or its second table ``which``) over ``df``, with every metric it declares shown
        (``shown``, a report row) that the table leaves out, from each row's record: naming a metric here is
        what shows it."""
        t = (self.make_table if which == "table" else self.tables[which])(df)
        declared = [c for c in dict.fromkeys([*(self.shown or ()), *self.report_metrics(which)])
                    if c not in t.columns and c in df.columns]
        if t.empty or not declared or "record_id" not in t.columns:
            return t
        by_id = df.drop_duplicates("record_id", keep="last").set_index("record_id")[declared]
        return t.join(by_id, on="record_id")

    def report_metrics(self, which: str = "table") -> list[str]:
        """The record metrics the study's report tables over ``which`` show."""
        return [r.name for t in self.report if (t.table or "table") == which for r in t.rows if not r.derived]

    def report_table(self, table_id: str) -> ReportTable:
        for t in self.report:
            if t.id == table_id:
                return t
        raise KeyError(f"study {self.name!r} declares no report table {table_id!r}")
