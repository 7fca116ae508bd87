"""The Systems section: what each system is, as its records say (device, software, precision,
record counts, peaks, MFU, energy), each value citing the records it comes from."""
from __future__ import annotations

from collections import Counter
from typing import Callable

from accel_kit import results
import accel_kit.report.render as R
from accel_kit.report.cells import energy_reason
from accel_kit.report.context import Context, Section
from accel_kit.report.render import Cell, Table
from accel_kit.results import Record


def systems_section(ctx: Context) -> Section:
    """Each system: device, devices used, software, the precision that ran and why, its records, MFU, energy."""
    from accel_kit.studies import STUDIES

    s = Section("systems", "Systems")
    records = ctx.records.records
    table = Table("systems-table", ["", "quantity"], ctx.systems)
    per_system = {sys: [r for r in records if ctx.records.column(r) == sys] for sys in ctx.systems}

    def row(group: str, name: str, fn: Callable[[list[Record]], Cell]) -> None:
        table.add([group, name], [fn(per_system[sys]) for sys in ctx.systems])

    def distinct(values: list[tuple[str, str]], what: str) -> Cell:
        """Distinct texts, each citing the first record that carried it."""
        first: dict[str, str] = {}
        for text, rid in values:
            if text:
                first.setdefault(text, rid)
        if not first:
            return Cell(R.NOT_MEASURED, (), R.NOT_MEASURED, f"no record says {what}")
        return Cell("; ".join(first), tuple(first.values()))

    row("system", "description", lambda recs: _description(recs))
    row("system", "device", lambda recs: distinct([(R.device_of(r), r.record_id) for r in recs], "the device"))
    row("system", "devices used", _devices_used)
    row("system", "hosts", lambda recs: distinct([(r.env.get("host"), r.record_id)
                                                 for r in recs], "the host"))
    row("software", "versions", lambda recs: distinct([(R.versions_of(r), r.record_id) for r in recs],
                                                      "the versions"))
    row("software", "accel-kit commit", lambda recs: distinct([(R.commit_of(r), r.record_id) for r in recs],
                                                              "the commit"))
    row("precision", "that ran, and why", lambda recs: distinct(
        [(_precision_text(r), r.record_id) for r in recs if r.params.get("precision")],
        "its precision"))
    for study in STUDIES:
        row("records", study, lambda recs, study=study: _study_counts(recs, study))
    row("peak", "datasheet peak", lambda recs: _peaks(recs, "peak_tflops_datasheet", "mfu_reason"))
    row("peak", "measured matmul peak", lambda recs: _peaks(recs, "peak_tflops_measured", "mfu_measured_reason"))
    row("MFU", "best, datasheet peak", lambda recs: _best(recs, "mfu_pct", "mfu_reason"))
    row("MFU", "best, measured peak", lambda recs: _best(recs, "mfu_measured_pct", "mfu_measured_reason"))
    row("energy", "work per joule", _energy_summary)
    s.text("<p>What each system is, as its records say. Every value cites the records it comes from; "
           "hover a cell for the record's date, commit, device and versions.</p>")
    return s.table(table)


def _description(recs: list[Record]) -> Cell:
    for r in recs:
        system = r.env.get("system") or {}
        if system.get("description"):
            return Cell(system["description"], (r.record_id,))
    sid = recs[0].system if recs else None
    if sid:
        from accel_kit.errors import AccelKitError
        from accel_kit.systems import load_system

        try:
            return Cell(f"{load_system(sid).description} (from params/systems/{sid}.yaml here; "
                        "the records predate the description field)", ())
        except AccelKitError:
            pass
    return Cell(R.NOT_MEASURED, (), R.NOT_MEASURED, "the records carry no description and there is no "
                "params/systems YAML of this id here")


def _devices_used(recs: list[Record]) -> Cell:
    counts: dict[int, str] = {}
    per_node = None
    for r in recs:
        params = r.params
        n = params.get("devices", 1)
        counts.setdefault(int(n), r.record_id)
        per_node = per_node or params.get("devices_per_node") or (r.env.get("system") or {}).get(
            "devices_per_node")
    if not counts:
        return Cell(R.NOT_MEASURED, (), R.NOT_MEASURED, "no records")
    text = ", ".join(str(n) for n in sorted(counts)) + (f" (of {per_node} per node)" if per_node else "")
    return Cell(text, tuple(counts[n] for n in sorted(counts)))


def _precision_text(rec: Record) -> str:
    return results.precision_text(rec.params)


def _study_counts(recs: list[Record], study: str) -> Cell:
    mine = [r for r in recs if r.study == study]
    if not mine:
        return R.not_run(f"no {study} records from this system")
    counts = Counter(r.status for r in mine)
    ok = [r.record_id for r in mine if r.status == "ok"][:1]
    other = [r.record_id for r in mine if r.status != "ok"][:1]
    return Cell(", ".join(f"{n} {s}" for s, n in sorted(counts.items(), key=lambda kv: kv[0] != "ok")),
                tuple(ok + other))


def _peaks(recs: list[Record], key: str, reason_key: str) -> Cell:
    best: dict[str, tuple[float, str]] = {}
    reasons: dict[str, tuple[str, str]] = {}
    for r in recs:
        if r.status != "ok":
            continue
        m, precision = r.metrics, r.params.get("precision", "?")
        if m.get(key) is not None:
            if precision not in best or m[key] > best[precision][0]:
                best[precision] = (m[key], r.record_id)
        elif m.get(reason_key):
            reasons.setdefault(precision, (m[reason_key], r.record_id))
    if best:
        text = "; ".join(f"{p}: {R.fmt_num(v)} TFLOP/s" for p, (v, _) in sorted(best.items()))
        return Cell(text, tuple(rid for _, rid in best.values()))
    if reasons:
        p, (why, rid) = sorted(reasons.items())[0]
        return Cell(R.NOT_MEASURED, (rid,), R.NOT_MEASURED, why)
    return Cell(R.NOT_MEASURED, (), R.NOT_MEASURED, "no ok record carries a peak")


def _best(recs: list[Record], key: str, reason_key: str) -> Cell:
    top = None
    reason = None
    for r in recs:
        m = r.metrics
        if r.status != "ok":
            continue
        if m.get(key) is not None and not (key == "mfu_measured_pct" and m.get("mfu_measured_unreliable")):
            if top is None or m[key] > top[0]:
                top = (m[key], r)
        elif m.get(reason_key) and reason is None:
            reason = (m[reason_key], r.record_id)
    if top is not None:
        v, r = top
        where = r.study + (f", {r.model}" if r.model else "") + \
            f", {r.params.get('precision', '?')}"
        return Cell(f"{R.fmt_pct(v)} ({where})", (r.record_id,))
    if reason:
        return Cell(R.NOT_MEASURED, (reason[1],), R.NOT_MEASURED, reason[0])
    return Cell(R.NOT_MEASURED, (), R.NOT_MEASURED, "no ok record")


def _energy_summary(recs: list[Record]) -> Cell:
    ok = [r for r in recs if r.status == "ok"]
    with_energy = [r for r in ok if any(r.metrics.get(k) is not None
                                        for k in ("tokens_per_j", "flops_per_j"))]
    if with_energy:
        return Cell(f"measured in {len(with_energy)} of {len(ok)} ok records", (with_energy[0]["record_id"],))
    if not ok:
        return Cell(R.NOT_MEASURED, (), R.NOT_MEASURED, "no ok records")
    return Cell(R.NOT_MEASURED, (ok[0]["record_id"],), R.NOT_MEASURED, energy_reason(ok[0].get("metrics") or {}))
