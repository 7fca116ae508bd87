"""The records a report is made of: read from folders, .jsonl files and archives, merged, selected.

Several machines' ``outputs/`` folders (or ``.tar.gz``/``.zip`` archives of them) are read
as they are, by ``accel_kit.results.read_source``. A record copied into two
folders is one record (same ``record_id``). By default each system's latest record of each
point (``results.point_key_of``, the one identity of a point) is kept, so a re-run replaces
what it re-measured and keeps the rest; ``by_run`` keeps every run instead, each run of a
system as a column of its own.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Iterable

import pandas as pd

from accel_kit import results
from accel_kit.errors import DataError


@dataclass
class Source:
    """One folder, file or archive that was read, and how many records it held."""

    path: str
    records: int


@dataclass
class RecordSet:
    """The selected records, with what was read and what was left out."""

    records: list[results.Record]
    sources: list[Source]
    duplicates: int = 0  # records read more than once (the same record_id in several sources)
    superseded: int = 0  # older records of a point that a later run measured again
    filtered_out: int = 0  # records of systems not asked for
    by_run: bool = False
    systems_found: list[str] = field(default_factory=list)  # before the systems filter
    # Every run of the selected systems' points, superseded ones too: a point's spread widens to its runs'
    # range as the notebook's does (``Context.spreads``); None: only ``records`` were given.
    runs: list[results.Record] | None = None

    def column(self, rec: results.Record) -> str:
        """The report's column ``rec`` belongs to: its system, or, ``by_run``, ``system @ run_id``."""
        return f"{rec.system} @ {rec.run_id or '?'}" if self.by_run else rec.system

    @cached_property
    def by_id(self) -> dict[str, results.Record]:
        return {rec.record_id: rec for rec in self.records}

    def _frame(self, records: Iterable[results.Record]) -> pd.DataFrame:
        """``records`` framed (``accel_kit.results.frame``), their ``system`` column their report column."""
        records = list(records)
        df = results.frame(records)
        if self.by_run and not df.empty:
            df["system"] = [self.column(rec) for rec in records]
        return df

    @cached_property
    def frame(self) -> pd.DataFrame:
        """Every selected record, flattened (``accel_kit.results.frame``)."""
        return self._frame(self.records)

    def study(self, name: str) -> pd.DataFrame:
        """The selected records of one study (an empty frame when there are none)."""
        # Framed apart: another study's columns would turn this one's integers into floats (NaN).
        return self._frame(rec for rec in self.records if rec.study == name)

    def study_runs(self, name: str) -> pd.DataFrame:
        """Every run of one study's points (``runs``: superseded records too), framed as ``study``."""
        return self._frame(rec for rec in (self.runs if self.runs is not None else self.records) if rec.study == name)

    @property
    def systems(self) -> list[str]:
        """The systems (or, by run, system @ run columns) in the report, sorted."""
        return sorted({self.column(rec) for rec in self.records})

    def studies(self) -> list[str]:
        return sorted({rec.study for rec in self.records})


def collect(sources: Iterable[str | Path], *, systems: Iterable[str] | None = None,
            by_run: bool = False) -> RecordSet:
    """Read, merge and select the records of ``sources``.

    Args:
        sources: folders (several machines' ``outputs/``), ``.jsonl`` files or archives of them.
        systems: keep only these system ids (None: all); an id found in no source is an error.
        by_run: keep every run: each (system, run) becomes a column ``system @ run_id``; by
            default each system's latest record per point is kept.

    Raises:
        DataError: a source that does not exist or cannot be read, a malformed record line, or
            a system asked for that no source holds.
    """
    seen: dict[str, tuple[results.Record, int]] = {}  # record id -> (the record, its order read)
    read: list[Source] = []
    duplicates = 0
    for source in sources:
        count = 0
        for rec in results.read_source(source):  # (a JSON line that is no record, another tool's, is skipped)
            count += 1
            if rec.record_id in seen:
                duplicates += 1
                continue
            seen[rec.record_id] = (rec, len(seen))
        read.append(Source(str(source), count))
    found = sorted({rec.system for rec, _ in seen.values()})
    chosen = list(seen.values())
    filtered_out = 0
    if systems is not None:
        wanted = list(dict.fromkeys(systems))
        missing = [s for s in wanted if s not in found]
        if missing:
            raise DataError(f"no records of system {', '.join(map(repr, missing))} in "
                            f"{', '.join(s.path for s in read)}; found: {', '.join(found) or 'none'}")
        chosen = [(rec, order) for rec, order in chosen if rec.system in wanted]
        filtered_out = len(seen) - len(chosen)
    # Oldest first (ties in the order read): the last record of a point is its latest.
    chosen.sort(key=lambda pair: (pair[0].timestamp or "", pair[1]))
    superseded = 0
    runs = [rec for rec, _ in chosen]
    if by_run:
        records = runs
    else:
        latest: dict[tuple, tuple[results.Record, int]] = {}
        for rec, order in chosen:
            latest[(rec.study, rec.system, results.point_key_of(rec))] = (rec, order)
        superseded = len(chosen) - len(latest)
        records = [rec for rec, _ in sorted(latest.values(), key=lambda pair: pair[1])]
    return RecordSet(records=records, sources=read, duplicates=duplicates, superseded=superseded,
                     filtered_out=filtered_out, by_run=by_run, systems_found=found, runs=runs)
