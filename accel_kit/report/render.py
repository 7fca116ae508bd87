"""The report's building blocks: cells that cite their records, tables of them, and the page.

A number is never shown without the record it came from: each cell cites one or more records
by a footnote number (the Records section at the end lists each with its id, date, commit,
device and software versions) and carries the same facts as its hover text. A cell that has no
number says why: ``not run`` (no record of that point), the record's own status (``oom``,
``unsupported``, ``skipped``, ``error``) with its reason, or ``not measured`` with the reason
the record gives for the missing metric.
"""
from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

from accel_kit.results import Record

NOT_RUN = "not run"
NOT_MEASURED = "not measured"


def esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def is_missing(value: object) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def fmt_num(value: float) -> str:
    """Three significant figures, thousands separated; never rounds a non-zero rate to "0"."""
    v = float(value)
    if v == 0:
        return "0"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.3g}"


def fmt_pct(value: float) -> str:
    return f"{float(value):.1f} %" if abs(float(value)) >= 0.1 else f"{float(value):.2g} %"


def fmt_loss(value: float) -> str:
    return f"{float(value):.4g}"


def fmt_ratio(value: float) -> str:
    return f"{float(value):.2f}×"


def fmt_key(value: object) -> str:
    """A parameter value as a reader writes it: 2, not 2.0; "-" for none."""
    if is_missing(value):
        return "-"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def short(text: object, limit: int = 110) -> str:
    text = " ".join(("" if is_missing(text) else fmt_key(text)).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass
class Cell:
    """One table cell: a value with the records it came from, or a status with the reason."""

    text: str
    records: tuple[str, ...] = ()
    status: str = "ok"  # ok, not run, not measured, or a record status (oom, unsupported, skipped, error)
    reason: str | None = None
    value: float | None = None
    compact: bool = False  # the status alone (the reason is in the hover): the same point's reason is above

    @property
    def measured(self) -> bool:
        return self.status == "ok"


def value_cell(value: float | None, records: Sequence[str], fmt: Callable[[float], str] = fmt_num, *,
               reason: str | None = None) -> Cell:
    """A measured value, or ``not measured`` with ``reason`` when it is missing."""
    if is_missing(value):
        return Cell(NOT_MEASURED, tuple(records), NOT_MEASURED, reason or "the record has no value for this")
    return Cell(fmt(value), tuple(records), value=float(value))


def text_cell(text: object, records: Sequence[str], *, reason: str | None = None) -> Cell:
    if is_missing(text) or str(text) == "":
        return Cell(NOT_MEASURED, tuple(records), NOT_MEASURED, reason or "the record has no value for this")
    return Cell(str(text), tuple(records))


def status_cell(status: str, reason: str | None, record_id: str | None) -> Cell:
    """A point that has a record but no measurement: its status and reason."""
    return Cell(status, (record_id,) if record_id else (), status, reason or f"status {status} (no reason recorded)")


def not_run(reason: str) -> Cell:
    return Cell(NOT_RUN, (), NOT_RUN, reason)


class Citations:
    """Footnote numbers for records, in order of first citation, and their provenance."""

    def __init__(self, by_id: dict[str, Record]):
        self.by_id = by_id
        self.numbers: dict[str, int] = {}

    def cite(self, record_id: str) -> int:
        if record_id not in self.numbers:
            self.numbers[record_id] = len(self.numbers) + 1
        return self.numbers[record_id]

    def refs(self, record_ids: Sequence[str]) -> str:
        """``[3, 4]`` as links to the Records section."""
        ids = [r for r in dict.fromkeys(record_ids) if r in self.by_id]
        if not ids:
            return ""
        links = ", ".join(f'<a href="#rec-{self.cite(r)}">{self.cite(r)}</a>' for r in ids)
        return f'<sup class="ref">[{links}]</sup>'

    def tooltip(self, record_ids: Sequence[str]) -> str:
        return "\n".join(provenance(self.by_id[r]) for r in dict.fromkeys(record_ids) if r in self.by_id)


def commit_of(rec: Record) -> str:
    git = rec.env.get("git") or {}
    commit = git.get("commit")
    if not commit:
        return "commit unknown"
    return f"commit {commit[:10]}" + (" (uncommitted changes)" if git.get("dirty") else "")


def versions_of(rec: Record) -> str:
    env = rec.env
    parts = [f"{name} {env[name]}" for name in ("accel_kit", "python", "torch", "transformers") if env.get(name)]
    device_versions = ((env.get("device") or {}).get("versions") or {})
    parts += [f"{k} {v}" for k, v in device_versions.items() if v and k not in ("torch",)]
    return ", ".join(parts) or "versions not recorded"


def device_of(rec: Record) -> str:
    env_device = rec.env.get("device") or {}
    model = rec.device or env_device.get("model") or "device not recorded"
    adapter = env_device.get("adapter")
    return f"{model} ({adapter})" if adapter else str(model)


def date_of(rec: Record) -> str:
    return str(rec.timestamp or "date unknown").replace("T", " ").replace("+00:00", " UTC")


def provenance(rec: Record, *, with_id: bool = True) -> str:
    """One line: record id, date, commit, device, software versions."""
    head = f"record {rec.record_id[:12]} · " if with_id else ""
    return (f"{head}{rec.system} · {date_of(rec)} · "
            f"{commit_of(rec)} · {device_of(rec)} · {versions_of(rec)}")


def note_mark(number: int) -> str:
    """A table note's mark: a letter (a, b, ..., then aa, ab), apart from the records' citation numbers."""
    letters = ""
    number += 1
    while number:
        number, rest = divmod(number - 1, 26)
        letters = chr(ord("a") + rest) + letters
    return letters


def cell_html(cell: Cell, cite: Citations, note: Callable[[str], str] | None = None) -> str:
    """A cell; a status cell's reason is a note of the table (``note``: its mark, the note said once under
    the table, whole), or, without ``note``, the reason itself."""
    refs = cite.refs(cell.records)
    tip = cite.tooltip(cell.records)
    if cell.measured:
        klass = "v" if cell.value is not None else "v txt"  # numbers right-aligned, texts wrap
        return f'<td class="{klass}" title="{esc(tip)}">{esc(cell.text)}{refs}</td>'
    klass = "why s-" + cell.status.replace(" ", "-")
    title = f"{cell.status}: {cell.reason}" + (f"\n{tip}" if tip else "")
    if cell.compact:
        reason = ""
    elif note is not None:
        mark = note(cell.reason or "")
        reason = f'<span class="rs">note <a href="#{esc(mark)}">{esc(mark.rsplit("-", 1)[-1])}</a></span>'
    else:
        reason = f'<span class="rs">{esc(cell.reason)}</span>'
    return (f'<td class="{klass}" title="{esc(title)}"><span class="st">{esc(cell.status)}</span>'
            f'{reason}{refs}</td>')


@dataclass
class Table:
    """Rows of cells under a header of columns (one per system); the first columns name the row."""

    id: str
    row_headers: list[str]
    columns: list[str]
    rows: list[tuple[tuple[str, ...], list[Cell]]] = field(default_factory=list)
    column_notes: dict[str, str] = field(default_factory=dict)  # shown under a column's name
    caption: str = ""

    def add(self, key: Sequence[object], cells: list[Cell]) -> None:
        assert len(cells) == len(self.columns), (key, len(cells), len(self.columns))
        self.rows.append((tuple(str(k) for k in key), cells))

    def html(self, cite: Citations) -> str:
        head = "".join(f'<th class="rk">{esc(h)}</th>' for h in self.row_headers)
        head += "".join(f'<th class="sys">{esc(c)}'
                        + (f'<div class="note">{esc(self.column_notes[c])}</div>' if self.column_notes.get(c) else "")
                        + "</th>" for c in self.columns)
        body = []
        notes = self.notes()
        spans = _row_spans([key for key, _ in self.rows])
        for (key, cells), span in zip(self.rows, spans):
            tds = "".join(f'<th class="rk" rowspan="{n}" scope="row">{esc(k)}</th>'
                          for k, n in zip(key, span) if n)
            tds += "".join(cell_html(c, cite, lambda r: f"{self.id}-note-{notes[r]}") for c in cells)
            body.append(f"<tr>{tds}</tr>")
        caption = f"<caption>{self.caption}</caption>" if self.caption else ""
        below = "".join(f'<li id="{esc(self.id)}-note-{mark}"><b>{mark}</b>: {esc(reason)}</li>'
                        for reason, mark in notes.items())
        return (f'<div class="tablewrap"><table class="report-table" id="{esc(self.id)}">{caption}'
                f"<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
                + (f'<ul class="table-notes">{below}</ul>' if below else "") + "</div>")

    def notes(self) -> dict[str, str]:
        """Each distinct reason of the table's status cells -> its mark, in the order first met: a reason
        shared by many cells (no power meter on this machine) is said once, under the table, whole."""
        reasons: dict[str, str] = {}
        for _, cells in self.rows:
            for c in cells:
                if not c.measured and not c.compact and c.reason is not None and c.reason not in reasons:
                    reasons[c.reason] = note_mark(len(reasons))
        return reasons


def _row_spans(keys: list[tuple[str, ...]]) -> list[list[int]]:
    """Rowspans for the row-name columns: a leading part repeated in the rows below spans them."""
    spans = [[1] * len(k) for k in keys]
    for level in range(max((len(k) for k in keys), default=0)):
        start = 0
        for i in range(1, len(keys) + 1):
            same = (i < len(keys) and keys[i][: level + 1] == keys[start][: level + 1]
                    and level < len(keys[i]) - 1)
            if not same:
                for j in range(start, i):
                    spans[j][level] = (i - start) if j == start else 0
                start = i
    return spans
