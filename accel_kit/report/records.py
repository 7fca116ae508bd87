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

_REQUIRED = ("record_id", "study", "system", "status")


@dataclass
class Source:
    """One folder, file or archive that was read, and how many records it held."""

    path: str
    records: int


@dataclass
class RecordSet:
    """The selected records (dicts, as written), with what was read and what was left out."""

    records: list[dict]
    sources: list[Source]
    duplicates: int = 0  # records read more than once (the same record_id in several sources)
    superseded: int = 0  # older records of a point that a later run measured again
    filtered_out: int = 0  # records of systems not asked for
    by_run: bool = False
    systems_found: list[str] = field(default_factory=list)  # before the systems filter
    # Every run of the selected systems' points, superseded ones too: a point's spread widens to its runs'
    # range as the notebook's does (``Context.spreads``); None: only ``records`` were given.
    runs: list[dict] | None = None

    @cached_property
    def by_id(self) -> dict[str, dict]:
        return {rec["record_id"]: rec for rec in self.records}

    @cached_property
    def frame(self) -> pd.DataFrame:
        """Every selected record, flattened (``accel_kit.results.frame``)."""
        return results.frame(self.records)

    def study(self, name: str) -> pd.DataFrame:
        """The selected records of one study (an empty frame when there are none)."""
        # Framed apart: another study's columns would turn this one's integers into floats (NaN).
        return results.frame([rec for rec in self.records if rec["study"] == name])

    def study_runs(self, name: str) -> pd.DataFrame:
        """Every run of one study's points (``runs``: superseded records too), framed as ``study``."""
        return results.frame([rec for rec in (self.runs if self.runs is not None else self.records)
                              if rec["study"] == name])

    @property
    def systems(self) -> list[str]:
        """The systems (or, by run, system @ run columns) in the report, sorted."""
        return sorted({rec["system"] for rec in self.records})

    def studies(self) -> list[str]:
        return sorted({rec["study"] for rec in self.records})


def _is_record(obj) -> bool:
    return isinstance(obj, dict) and all(obj.get(k) for k in _REQUIRED)


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
    seen: dict[str, dict] = {}
    read: list[Source] = []
    duplicates = 0
    order = 0
    for source in sources:
        count = 0
        for rec in results.read_source(source):
            if not _is_record(rec):
                continue  # a JSON line that is not a result record (another tool's file)
            count += 1
            if rec["record_id"] in seen:
                duplicates += 1
                continue
            seen[rec["record_id"]] = rec | {"_order": order}
            order += 1
        read.append(Source(str(source), count))
    found = sorted({rec["system"] for rec in seen.values()})
    chosen = list(seen.values())
    filtered_out = 0
    if systems is not None:
        wanted = list(dict.fromkeys(systems))
        missing = [s for s in wanted if s not in found]
        if missing:
            raise DataError(f"no records of system {', '.join(map(repr, missing))} in "
                            f"{', '.join(s.path for s in read)}; found: {', '.join(found) or 'none'}")
        chosen = [rec for rec in chosen if rec["system"] in wanted]
        filtered_out = len(seen) - len(chosen)
    # Oldest first (ties in the order read): the last record of a point is its latest.
    chosen.sort(key=lambda r: (str(r.get("timestamp") or ""), r["_order"]))
    superseded = 0
    if by_run:
        kept = [rec | {"system": f"{rec['system']} @ {rec.get('run_id') or '?'}", "system_id": rec["system"]}
                for rec in chosen]
    else:
        latest: dict[tuple, dict] = {}
        for rec in chosen:
            latest[(rec["study"], rec["system"], results.point_key_of(rec))] = rec
        superseded = len(chosen) - len(latest)
        kept = sorted(latest.values(), key=lambda r: r["_order"])
    records = [{k: v for k, v in rec.items() if k != "_order"} for rec in kept]
    runs = [{k: v for k, v in rec.items() if k != "_order"} for rec in chosen] if not by_run else records
    return RecordSet(records=records, sources=read, duplicates=duplicates, superseded=superseded,
                     filtered_out=filtered_out, by_run=by_run, systems_found=found, runs=runs)
