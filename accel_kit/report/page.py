"""The report as one self-contained HTML page: plotly.js inlined once, no network needed to open it."""
from __future__ import annotations

import datetime as _dt
import json

from accel_kit import __version__
import accel_kit.report.render as R
from accel_kit.report.context import Context, Section
from accel_kit.report.render import esc
from accel_kit.results import Record

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0 auto; max-width: 1500px;
       padding: 0 24px 48px; color: #222; line-height: 1.4; }
header { border-bottom: 2px solid #444; margin-bottom: 12px; }
nav ol { columns: 3; font-size: 0.92em; }
section { margin-top: 28px; }
h2 { border-bottom: 1px solid #bbb; padding-bottom: 2px; }
.tablewrap { overflow-x: auto; margin: 8px 0 16px; }
table.report-table { border-collapse: collapse; font-size: 0.86em; }
table.report-table th, table.report-table td { border: 1px solid #ccc; padding: 3px 6px; vertical-align: top; }
table.report-table thead th { background: #f0f0f0; position: sticky; top: 0; }
th.rk { background: #fafafa; text-align: left; font-weight: 600; white-space: nowrap; }
th.sys .note { font-weight: normal; font-size: 0.85em; color: #555; }
td.v { text-align: right; white-space: nowrap; font-variant-numeric: tabular-nums; }
td.v.txt { text-align: left; white-space: normal; min-width: 12em; max-width: 40em; }
td.why { font-size: 0.9em; color: #555; max-width: 26em; }
td.why .st { font-weight: 600; margin-right: 4px; }
ul.table-notes { font-size: 0.85em; color: #555; list-style: none; padding-left: 0; margin: 4px 0 12px; }
td.s-not-run { background: #f6f6f6; }
td.s-oom, td.s-error { background: #fde8e8; }
td.s-unsupported, td.s-skipped { background: #fff4dc; }
td.s-not-measured { background: #eef3fb; }
sup.ref { font-size: 0.75em; margin-left: 2px; }
sup.ref a { text-decoration: none; }
.nofig { background: #fff4dc; padding: 6px 10px; border-left: 4px solid #e0a800; }
.figure { margin: 8px 0; }
ul.findings li { margin: 4px 0; }
table.records td { font-size: 0.85em; }
table.records tr:target { background: #fff3a8; }
.meta { color: #555; font-size: 0.9em; }
"""


def figure_html(div_id: str, fig) -> str:
    """A figure's div and script; plotly.js itself is in the page head, once."""
    import plotly.io as pio

    # The page's width, not the notebook figure's fixed one (a wide legend is cut at a fixed width).
    fig = fig.update_layout(width=None, autosize=True)
    return '<div class="figure">' + pio.to_html(
        fig, full_html=False, include_plotlyjs=False, div_id=div_id,
        config={"displaylogo": False, "responsive": True}) + "</div>"


def section_html(section: Section, cite: R.Citations) -> str:
    out = [f'<section id="{esc(section.id)}"><h2>{esc(section.title)}</h2>']
    for kind, part in section.parts:
        if kind == "html":
            out.append(part)
        elif kind == "table":
            out.append(part.html(cite))
        elif kind == "figure":
            out.append(figure_html(*part))
    out.append("</section>")
    return "".join(out)


def records_html(ctx: Context) -> str:
    """Every record of the report, numbered as cited, with its provenance (the footnotes' targets)."""
    for rec in ctx.records.records:  # records no table cites (e.g. drawn only) get numbers after the cited ones
        ctx.cite.cite(rec.record_id)
    rows = []
    for rid, n in sorted(ctx.cite.numbers.items(), key=lambda kv: kv[1]):
        rec = ctx.rec(rid)
        params = rec.params
        rows.append(
            f'<tr id="rec-{n}"><td>{n}</td><td><code>{esc(rid)}</code></td><td>{esc(rec.study)}</td>'
            f'<td>{esc(rec.system)}</td><td>{esc(rec.model or "")} {esc(params.get("precision") or "")}</td>'
            f'<td>{esc(rec.status)}' + (f': {esc(R.short(rec.reason, 200))}' if rec.reason else "")
            + f'</td><td>{esc(R.date_of(rec))}</td><td><code>{esc(rec.run_id or "")}</code></td>'
            f'<td>{esc(R.commit_of(rec))}</td><td>{esc(R.device_of(rec))}</td><td>{esc(R.versions_of(rec))}</td>'
            f'<td>{esc(rec.env.get("host") or "")}</td></tr>')
    head = "".join(f"<th>{h}</th>" for h in ("#", "record id", "study", "system", "model, precision", "status",
                                            "date", "run", "commit", "device", "versions", "host"))
    return ('<section id="records"><h2>Records</h2><p>Every record in this report, numbered as the tables cite '
            'them. Each is one line of <code>&lt;study&gt;/&lt;system&gt;.jsonl</code> in the folders read; its id '
            'finds it there.</p><div class="tablewrap"><table class="records report-table" id="records-table">'
            f"<thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table></div></section>")


def page(ctx: Context, sections: list[Section], rendered: list[str], *, title: str) -> str:
    """The whole page; ``rendered`` are the sections' HTML (rendered first, so that citations are numbered)."""
    from plotly.offline import get_plotlyjs

    recs = ctx.records
    sources = "".join(f"<li><code>{esc(s.path)}</code>: {s.records} records</li>" for s in recs.sources)
    dropped = []
    if recs.duplicates:
        dropped.append(f"{recs.duplicates} duplicate records (same id in several sources) read once")
    if recs.superseded:
        dropped.append(f"{recs.superseded} older records of points a later run measured again left out")
    if recs.filtered_out:
        dropped.append(f"{recs.filtered_out} records of systems not asked for left out")
    selection = ("one column per run of each system (<code>system @ run id</code>)" if recs.by_run
                 else "each system's latest record of each point")
    toc = "".join(f'<li><a href="#{esc(s.id)}">{esc(s.title)}</a></li>' for s in sections)
    manifest = {"sections": [s.id for s in sections],
                "tables": [t.id for s in sections for t in s.tables] + ["records-table"],
                "figures": [div for s in sections for div, _ in s.figures],
                "systems": ctx.systems, "records": len(recs.records)}
    manifest_json = json.dumps(manifest).replace("</", "<\\/")  # a system id cannot close the script element
    now = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>{esc(title)}</title><style>{CSS}</style>"
        f"<script type=\"text/javascript\">{get_plotlyjs()}</script>"
        f'<script type="application/json" id="report-manifest">{manifest_json}</script>'
        "</head><body>"
        f"<header><h1>{esc(title)}</h1><p class=\"meta\">Built {now} by accel-kit {esc(__version__)} from "
        f"{len(recs.records)} records of {len(ctx.systems)} system(s): {esc(', '.join(ctx.systems))}. "
        f"Selection: {selection}" + (f"; {'; '.join(dropped)}" if dropped else "") + ". "
        f"Newest record: {esc(_newest(recs.records))}. To rebuild after new runs: <code>accel-kit report</code> "
        "(or run <code>notebooks/report.ipynb</code>; <code>make run</code> does it after the studies).</p>"
        f"<details><summary>Sources read</summary><ul>{sources}</ul></details>"
        "<p class=\"meta\">The tables and figures follow the paper (Emani et al., arXiv 2310.04607, "
        "docs/study.md in accel-kit). A cell without a number says why: <i>not run</i> (no record of that "
        "point), the record's status (<i>oom</i>, <i>unsupported</i>, <i>skipped</i>, <i>error</i>) with its "
        "reason, or <i>not measured</i> with the reason the record gives. Bracketed numbers lead to the "
        "records.</p>"
        f"<nav><ol>{toc}<li><a href=\"#records\">Records</a></li></ol></nav></header>"
        + "".join(rendered) + records_html(ctx) + "</body></html>\n")


def _newest(records: list[Record]) -> str:
    """When the newest record was measured (its timestamp, to the minute), so a stale page shows it."""
    stamps = sorted(str(r.timestamp or "") for r in records if r.timestamp)
    return stamps[-1][:16].replace("T", " ") + " UTC" if stamps else "none"
