"""The section framework: ``Section`` (what a section function returns) and ``Context`` (what it reads).

Every section of the page is a function ``(ctx: Context) -> Section``; ``accel_kit.report.sections``
lists them in the page's order. ``Context`` holds the selected records, framed per study, and the
citations of the page being built; ``study_table`` is a study's own table over those records
(its declaration's ``Study.table``), so a number in the report is computed where the notebook
computes it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable, Union

import pandas as pd

import accel_kit.report.render as R
from accel_kit.report.records import RecordSet
from accel_kit.report.render import Citations, Table
from accel_kit.json_types import JSONObject
from accel_kit.results import Record

if TYPE_CHECKING:
    from plotly.graph_objects import Figure

# what a section holds, in order: ("html", its HTML), ("table", a Table) or ("figure", (element id, figure))
Part = Union[str, Table, tuple[str, "Figure"]]


@dataclass
class Section:
    """A titled part of the page: HTML, tables and figures in the order added."""

    id: str
    title: str
    parts: list[tuple[str, Part]] = field(default_factory=list)

    def text(self, html: str) -> "Section":
        self.parts.append(("html", html))
        return self

    def table(self, table: Table) -> "Section":
        self.parts.append(("table", table))
        return self

    def figure(self, div_id: str, fig: Figure) -> "Section":
        self.parts.append(("figure", (div_id, fig)))
        return self

    @property
    def figures(self) -> list[tuple[str, Figure]]:
        return [p for kind, p in self.parts if kind == "figure"]

    @property
    def tables(self) -> list[Table]:
        return [p for kind, p in self.parts if kind == "table"]


class Context:
    """The selected records, framed per study, and the citations of the page being built."""

    def __init__(self, records: RecordSet):
        self.records = records
        self.cite = Citations(records.by_id)
        self.systems = records.systems
        self._frames: dict[str, pd.DataFrame] = {}
        self._spreads: dict[tuple, pd.DataFrame] = {}

    def rec(self, record_id: str) -> Record:
        return self.records.by_id[record_id]

    def metrics(self, record_id: str) -> JSONObject:
        return self.rec(record_id).metrics

    def study(self, name: str) -> pd.DataFrame:
        """The study's records as a frame, with each row's provenance for figure hovers."""
        if name not in self._frames:
            df = self.records.study(name)
            if not df.empty:
                df = df.assign(provenance=[R.provenance(self.rec(r), with_id=False) for r in df["record_id"]])
            self._frames[name] = df
        return self._frames[name]

    def spreads(self, name: str, rates: Iterable[str] | None = None) -> pd.DataFrame:
        """Each point's latest record of the study with its spread, by record id: ``accel_kit.noise.with_spread``
        per point key (the trials' IQR, widened to the runs of the point), what tables and findings read.

        ``rates``: the rates to spread (None: ``noise.RATES``, the timed ones); one outside them (a served load's
        ``serve_output_tokens_per_s``: one load per run, no trials) spreads over the point's runs only."""
        from accel_kit import noise

        rates = tuple(noise.RATES if rates is None else rates)
        if (name, rates) not in self._spreads:
            df = self.records.study_runs(name)  # every run: a point's spread widens to their range
            if not df.empty:
                df = noise.with_spread(df, rates)
            self._spreads[(name, rates)] = df.set_index("record_id") if not df.empty else df
        return self._spreads[(name, rates)]

    def has(self, study: str, system: str) -> bool:
        df = self.study(study)
        return not df.empty and (df["system"] == system).any()


def study_table(ctx: Context, study: str, which: str = "table") -> pd.DataFrame:
    """The study's own table (its ``Study.table``; ``which``: a second table it declares) over the context's
    records."""
    from accel_kit import studies

    df = ctx.study(study)
    if df.empty:
        return df
    return studies.get_study(study).table(df, which)
