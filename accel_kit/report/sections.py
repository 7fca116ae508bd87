"""The report's sections: one function per table or figure of the paper, each ``(ctx) -> Section``.

Every section reads the selected records through ``Context`` and reuses the study modules'
own tables and figures (``accel_kit.studies.<study>.table`` / ``figures``), so a number in the
report is computed where the notebook computes it. Tables have one column per system (split
by precision where a system ran several), one row per point and quantity; figures have one
bar group or line per system. ``SECTIONS`` is the page's order: a new section (e.g. predicted
against measured) is one more function appended there.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import pandas as pd

from accel_kit.report import render as R
from accel_kit.report.records import RecordSet
from accel_kit.report.render import Cell, Citations, Table, esc

STUDY_TITLES = {
    "microbenchmark": "transformer-block microbenchmark (Figures 3, 4)",
    "scaling": "scaling with device count (Table II, Figure 5)",
    "seq_length": "sequence length (Table III)",
    "gas": "gradient accumulation (Figure 6)",
    "sparsity": "weight sparsity (Figures 7, 8)",
    "genslm": "GenSLM (Table IV)",
}


@dataclass
class Section:
    """A titled part of the page: HTML, tables and figures in the order added."""

    id: str
    title: str
    parts: list[tuple[str, Any]] = field(default_factory=list)

    def text(self, html: str) -> "Section":
        self.parts.append(("html", html))
        return self

    def table(self, table: Table) -> "Section":
        self.parts.append(("table", table))
        return self

    def figure(self, div_id: str, fig) -> "Section":
        self.parts.append(("figure", (div_id, fig)))
        return self

    @property
    def figures(self) -> list[tuple[str, Any]]:
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

    def rec(self, record_id: str) -> dict:
        return self.records.by_id[record_id]

    def metrics(self, record_id: str) -> dict:
        return self.rec(record_id).get("metrics") or {}

    def study(self, name: str) -> pd.DataFrame:
        """The study's records as a frame, with each row's provenance for figure hovers."""
        if name not in self._frames:
            df = self.records.study(name)
            if not df.empty:
                df = df.assign(provenance=[R.provenance(self.rec(r), with_id=False) for r in df["record_id"]])
            self._frames[name] = df
        return self._frames[name]

    def has(self, study: str, system: str) -> bool:
        df = self.study(study)
        return not df.empty and (df["system"] == system).any()


# ---------------------------------------------------------------------------------------------- helpers

Quantity = tuple[str, Callable[["Context", pd.Series, dict], Cell]]


def _sort_value(value: Any):
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
    """``base``, plus each ``extra`` key that tells apart two rows that would share a cell."""
    keys = [k for k in base if k in t.columns]
    for k in extra:
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
    if not points:  # no record of this study at all: one row that says so for every system
        table.row_headers = ["quantity"]
        table.add(["any"], [R.not_run(f"no {study} records from {c}") for c in columns])
    return table


def _norm(key: tuple) -> tuple:
    # NaN != NaN: a missing key part is None, so that the cell is found again.
    return tuple(None if R.is_missing(v) else v for v in key)


def metric(name: str, fmt=R.fmt_num, reason_key: str | None = None, default_reason: str | None = None):
    """A quantity read from the record's metrics; its reason key explains a missing value."""
    def cell(ctx: Context, row: pd.Series, rec: dict) -> Cell:
        m = rec.get("metrics") or {}
        reason = m.get(reason_key) if reason_key else None
        return R.value_cell(m.get(name), [rec["record_id"]], fmt, reason=reason or default_reason)
    return cell


def derived(column: str, fmt=R.fmt_num, *, also: Callable[[pd.Series], list[str]] | None = None,
            reason: str = "not derived for this point"):
    """A quantity from the study's own table (``column``), citing the row's record and ``also``'s."""
    def cell(ctx: Context, row: pd.Series, rec: dict) -> Cell:
        ids = [rec["record_id"]] + (also(row) if also else [])
        return R.value_cell(row.get(column), ids, fmt, reason=reason)
    return cell


ENERGY_FIELDS = ("energy_j", "power_avg_w", "tokens_per_j", "flops_per_j")


def energy(work: str = "tokens"):
    """Work per joule (``tokens_per_j`` or ``flops_per_j``), or why the record has none."""
    def cell(ctx: Context, row: pd.Series, rec: dict) -> Cell:
        m = rec.get("metrics") or {}
        return R.value_cell(m.get(f"{work}_per_j"), [rec["record_id"]], R.fmt_num, reason=energy_reason(m))
    return cell


def energy_reason(m: dict) -> str:
    """Why a record has no energy figure: the reason it gives, or that it predates the fields."""
    for key, value in m.items():
        if value and key.endswith("_reason") and ("energy" in key or "power" in key or "_per_j" in key):
            return str(value)
    if not any(k in m for k in ENERGY_FIELDS):
        return "this record has no energy fields (written before accel-kit measured energy)"
    return "the record's energy fields are empty and give no reason"


MFU_DATASHEET = ("MFU, datasheet peak", metric("mfu_pct", R.fmt_pct, "mfu_reason"))
MFU_MEASURED = ("MFU, measured peak", metric("mfu_measured_pct", R.fmt_pct, "mfu_measured_reason"))


def _base_record(t: pd.DataFrame, row: pd.Series, group: list[str], axis: str) -> list[str]:
    """The record of the smallest ``axis`` value with status ok in ``row``'s group (the base of a ratio)."""
    same = t[(t["status"] == "ok")]
    for k in group:
        if k in t.columns:
            same = same[same[k] == row[k]]
    if same.empty:
        return []
    return [same.sort_values(axis).iloc[0]["record_id"]]


def _study_table(ctx: Context, study: str) -> pd.DataFrame:
    from accel_kit import studies

    df = ctx.study(study)
    if df.empty:
        return df
    return studies.study_module(study).table(df)


def _figure(ctx: Context, section: Section, study: str, key: str, div_id: str,
            select: Callable[[pd.DataFrame], pd.DataFrame] | None = None) -> None:
    """The study's own figure ``key`` over every system's records, or a line saying why there is none."""
    from accel_kit import studies

    df = ctx.study(study)
    if not df.empty and select is not None:
        df = select(df)
    figs = studies.study_module(study).figures(df) if not df.empty else {}
    if key in figs:
        section.figure(div_id, figs[key])
        return
    if df.empty:
        why = f"no system in this report has {study} records"
    else:
        counts = Counter(df["status"])
        why = (f"none of its {len(df)} records has status ok ("
               + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) + ")" if "ok" not in counts
               else "its ok records lack the values this figure draws")
    section.text(f'<p class="nofig" id="{esc(div_id)}-missing">No figure: {esc(why)}.</p>')


# ---------------------------------------------------------------------------------------------- systems

def systems_section(ctx: Context) -> Section:
    """Each system: device, devices used, software, the precision that ran and why, its records, MFU, energy."""
    from accel_kit.studies import STUDIES

    s = Section("systems", "Systems")
    records = ctx.records.records
    table = Table("systems-table", ["", "quantity"], ctx.systems)
    per_system = {sys: [r for r in records if r["system"] == sys] for sys in ctx.systems}

    def row(group: str, name: str, fn: Callable[[list[dict]], Cell]) -> None:
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
    row("system", "device", lambda recs: distinct([(R.device_of(r), r["record_id"]) for r in recs], "the device"))
    row("system", "devices used", _devices_used)
    row("system", "hosts", lambda recs: distinct([((r.get("env") or {}).get("host"), r["record_id"])
                                                 for r in recs], "the host"))
    row("software", "versions", lambda recs: distinct([(R.versions_of(r), r["record_id"]) for r in recs],
                                                      "the versions"))
    row("software", "accel-kit commit", lambda recs: distinct([(R.commit_of(r), r["record_id"]) for r in recs],
                                                              "the commit"))
    row("precision", "that ran, and why", lambda recs: distinct(
        [(_precision_text(r), r["record_id"]) for r in recs if (r.get("params") or {}).get("precision")],
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


def _description(recs: list[dict]) -> Cell:
    for r in recs:
        system = (r.get("env") or {}).get("system") or {}
        if system.get("description"):
            return Cell(system["description"], (r["record_id"],))
    sid = recs[0].get("system_id", recs[0]["system"]) if recs else None
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


def _devices_used(recs: list[dict]) -> Cell:
    counts: dict[int, str] = {}
    per_node = None
    for r in recs:
        params = r.get("params") or {}
        n = params.get("devices", 1)
        counts.setdefault(int(n), r["record_id"])
        per_node = per_node or params.get("devices_per_node") or ((r.get("env") or {}).get("system") or {}).get(
            "devices_per_node")
    if not counts:
        return Cell(R.NOT_MEASURED, (), R.NOT_MEASURED, "no records")
    text = ", ".join(str(n) for n in sorted(counts)) + (f" (of {per_node} per node)" if per_node else "")
    return Cell(text, tuple(counts[n] for n in sorted(counts)))


def _precision_text(rec: dict) -> str:
    params = rec.get("params") or {}
    reason = params.get("precision_reason")
    return f"{params['precision']}: {reason}" if reason else f"{params['precision']} (no reason recorded)"


def _study_counts(recs: list[dict], study: str) -> Cell:
    mine = [r for r in recs if r["study"] == study]
    if not mine:
        return R.not_run(f"no {study} records from this system")
    counts = Counter(r["status"] for r in mine)
    ok = [r["record_id"] for r in mine if r["status"] == "ok"][:1]
    other = [r["record_id"] for r in mine if r["status"] != "ok"][:1]
    return Cell(", ".join(f"{n} {s}" for s, n in sorted(counts.items(), key=lambda kv: kv[0] != "ok")),
                tuple(ok + other))


def _peaks(recs: list[dict], key: str, reason_key: str) -> Cell:
    best: dict[str, tuple[float, str]] = {}
    reasons: dict[str, tuple[str, str]] = {}
    for r in recs:
        if r["status"] != "ok":
            continue
        m, precision = r.get("metrics") or {}, (r.get("params") or {}).get("precision", "?")
        if m.get(key) is not None:
            if precision not in best or m[key] > best[precision][0]:
                best[precision] = (m[key], r["record_id"])
        elif m.get(reason_key):
            reasons.setdefault(precision, (m[reason_key], r["record_id"]))
    if best:
        text = "; ".join(f"{p}: {R.fmt_num(v)} TFLOP/s" for p, (v, _) in sorted(best.items()))
        return Cell(text, tuple(rid for _, rid in best.values()))
    if reasons:
        p, (why, rid) = sorted(reasons.items())[0]
        return Cell(R.NOT_MEASURED, (rid,), R.NOT_MEASURED, why)
    return Cell(R.NOT_MEASURED, (), R.NOT_MEASURED, "no ok record carries a peak")


def _best(recs: list[dict], key: str, reason_key: str) -> Cell:
    top = None
    reason = None
    for r in recs:
        m = r.get("metrics") or {}
        if r["status"] != "ok":
            continue
        if m.get(key) is not None and not (key == "mfu_measured_pct" and m.get("mfu_measured_unreliable")):
            if top is None or m[key] > top[0]:
                top = (m[key], r)
        elif m.get(reason_key) and reason is None:
            reason = (m[reason_key], r["record_id"])
    if top is not None:
        v, r = top
        where = r["study"] + (f", {r.get('model')}" if r.get("model") else "") + \
            f", {(r.get('params') or {}).get('precision', '?')}"
        return Cell(f"{R.fmt_pct(v)} ({where})", (r["record_id"],))
    if reason:
        return Cell(R.NOT_MEASURED, (reason[1],), R.NOT_MEASURED, reason[0])
    return Cell(R.NOT_MEASURED, (), R.NOT_MEASURED, "no ok record")


def _energy_summary(recs: list[dict]) -> Cell:
    ok = [r for r in recs if r["status"] == "ok"]
    with_energy = [r for r in ok if any((r.get("metrics") or {}).get(k) is not None
                                        for k in ("tokens_per_j", "flops_per_j"))]
    if with_energy:
        return Cell(f"measured in {len(with_energy)} of {len(ok)} ok records", (with_energy[0]["record_id"],))
    if not ok:
        return Cell(R.NOT_MEASURED, (), R.NOT_MEASURED, "no ok records")
    return Cell(R.NOT_MEASURED, (ok[0]["record_id"],), R.NOT_MEASURED, energy_reason(ok[0].get("metrics") or {}))


# ---------------------------------------------------------------------------------------------- tables

def table_ii_scaling(ctx: Context) -> Section:
    """Table II: throughput, speedup and scaling efficiency against device count."""
    s = Section("table-2", "Table II: scaling with the number of devices")
    t = _study_table(ctx, "scaling")
    group = ["system", "preset", "precision"]

    def base(row: pd.Series) -> list[str]:
        return _base_record(t, row, group, "devices")

    s.text("<p>Speedup is throughput over that of the smallest device count measured, scaling efficiency is "
           "speedup / (N / N<sub>0</sub>) (<code>accel_kit.studies.scaling.table</code>); both cite the base "
           "record too.</p>")
    return s.table(pivot(ctx, "table-2-scaling", t, study="scaling", base=["preset", "devices"],
                         extra=["global_batch_size"], quantities=[
                             ("tokens/s", metric("tokens_per_s")),
                             ("tokens/s per device", metric("tokens_per_s_per_device")),
                             ("tokens/J", energy()),
                             ("speedup", derived("speedup", R.fmt_ratio, also=base,
                                                 reason="no ok record at a smaller device count to compare with")),
                             ("scaling efficiency", derived("scaling_efficiency_pct", R.fmt_pct, also=base,
                                                            reason="no ok base record")),
                             MFU_DATASHEET, MFU_MEASURED]))


def table_iii_seq_length(ctx: Context) -> Section:
    """Table III: the sequence lengths that fit, their throughput and memory."""
    s = Section("table-3", "Table III: sequence length")
    s.text("<p>Lengths that did not fit are part of the result: their cells give the status and why "
           "(an estimate above the device's memory, an out-of-memory, or beyond the memory frontier).</p>")
    t = _study_table(ctx, "seq_length")
    return s.table(pivot(ctx, "table-3-seq-length", t, study="seq_length", base=["preset", "devices", "seq_len"],
                         extra=["micro_batch_size"], quantities=[
                             ("tokens/s", metric("tokens_per_s")),
                             ("tokens/J", energy()),
                             ("peak memory (GiB)", metric("mem_peak_gib", default_reason="the device reports no "
                                                          "peak memory")),
                             MFU_DATASHEET, MFU_MEASURED]))


def table_iv_genslm(ctx: Context) -> Section:
    """Table IV: GenSLM throughput per model and length."""
    s = Section("table-4", "Table IV: GenSLM")
    s.text("<p>Samples/s is GenSLM's own measure: the global batch over the mean step time, warm-up "
           "excluded.</p>")
    t = _study_table(ctx, "genslm")
    return s.table(pivot(ctx, "table-4-genslm", t, study="genslm", base=["preset", "seq_len"],
                         extra=["vocab_size", "micro_batch_size", "activation_checkpointing", "attention_kernel",
                                "steps"],
                         quantities=[
                             ("samples/s", metric("samples_per_s_mean")),
                             ("tokens/s", metric("tokens_per_s")),
                             ("tokens/J", energy()),
                             MFU_DATASHEET, MFU_MEASURED,
                             ("peak memory (GiB)", metric("mem_peak_gib", default_reason="the device reports no "
                                                          "peak memory")),
                             ("last loss (nats)", metric("loss_last", R.fmt_loss))]))


# ---------------------------------------------------------------------------------------------- figures

def _microbenchmark(ctx: Context, number: int, direction: str, title: str) -> Section:
    s = Section(f"figure-{number}", f"Figure {number}: {title}")
    _figure(ctx, s, "microbenchmark", f"microbenchmark_{direction}", f"figure-{number}-plot")
    t = _study_table(ctx, "microbenchmark")
    if not t.empty:
        t = t[t["direction"] == direction]
    return s.table(pivot(ctx, f"figure-{number}-data", t, study="microbenchmark", base=["precision", "batch_size"],
                         extra=["impl"], split_precision=False, quantities=[
                             ("TFLOP/s", metric("tflops")), MFU_DATASHEET, MFU_MEASURED,
                             ("FLOP/J", energy("flops"))]))


def figure_3_forward(ctx: Context) -> Section:
    """Figure 3: one GPT-2 XL block, forward TFLOP/s by batch size and precision."""
    return _microbenchmark(ctx, 3, "forward", "transformer block, forward pass")


def figure_4_backward(ctx: Context) -> Section:
    """Figure 4: the same block, forward and backward."""
    return _microbenchmark(ctx, 4, "forward_backward", "transformer block, forward and backward pass")


def figure_5_scaling(ctx: Context) -> Section:
    """Figure 5: tokens/s against device count, one line per system (numbers: Table II)."""
    s = Section("figure-5", "Figure 5: training throughput against device count")
    _figure(ctx, s, "scaling", "scaling_throughput", "figure-5-plot")
    return s.text('<p>The numbers, with the points that did not run and why, are in '
                  '<a href="#table-2">Table II</a>.</p>')


def figure_6_gas(ctx: Context) -> Section:
    """Figure 6: tokens/s against gradient accumulation steps."""
    s = Section("figure-6", "Figure 6: gradient accumulation")
    _figure(ctx, s, "gas", "gas_tokens_per_s", "figure-6-plot")
    t = _study_table(ctx, "gas")
    group = ["system", "preset", "precision", "devices", "micro_batch_size"]
    return s.table(pivot(ctx, "figure-6-data", t, study="gas", base=["micro_batch_size", "gas"],
                         extra=["preset", "devices", "global_batch_size"], quantities=[
                             ("tokens/s", metric("tokens_per_s")),
                             ("samples/s", metric("samples_per_s")),
                             ("gain over the smallest GAS", derived(
                                 "gain_vs_smallest_gas", R.fmt_ratio, also=lambda r: _base_record(t, r, group, "gas"),
                                 reason="no ok record at the smallest GAS of this micro-batch")),
                             ("tokens/J", energy())]))


def _sparsity_table(ctx: Context) -> pd.DataFrame:
    t = _study_table(ctx, "sparsity")
    return t.assign(_config_order=t["config"].map(lambda c: (c != "dense", c == "2:4", c))) if not t.empty else t


def figure_7_sparsity_throughput(ctx: Context) -> Section:
    """Figure 7: throughput of sparse models relative to dense."""
    from accel_kit.studies import sparsity

    s = Section("figure-7", "Figure 7: weight sparsity, throughput relative to dense")
    _figure(ctx, s, "sparsity", "sparsity_throughput", "figure-7-plot")
    t = _sparsity_table(ctx)
    if not t.empty:
        presets = sparsity._throughput_presets(ctx.study("sparsity"))
        t = t[~t["loss_curve_run"] | t["preset"].isin(presets)]

    def dense(row: pd.Series) -> list[str]:
        same = t[(t["system"] == row["system"]) & (t["preset"] == row["preset"]) & (t["config"] == "dense")
                 & (t["status"] == "ok")]
        return list(same["record_id"][:1])

    return s.table(pivot(ctx, "figure-7-data", t, study="sparsity", base=["preset", "config"],
                         extra=["micro_batch_size", "seq_len", "steps", "sparse_kernels"], quantities=[
                             ("tokens/s", metric("tokens_per_s")),
                             ("relative to dense", derived("speedup_vs_dense", R.fmt_ratio, also=dense,
                                                           reason="no ok dense record of this preset")),
                             ("FLOP-proportional ideal", derived("ideal_speedup", R.fmt_ratio,
                                                                 reason="effective FLOPs not recorded")),
                             ("how it ran", lambda c, row, rec: R.text_cell(row.get("execution"),
                                                                            [rec["record_id"]])),
                             ("tokens/J", energy())]))


def figure_8_sparsity_loss(ctx: Context) -> Section:
    """Figure 8: training loss of sparse models against dense, and the final gap."""
    s = Section("figure-8", "Figure 8: weight sparsity, training loss")
    _figure(ctx, s, "sparsity", "sparsity_loss_curves", "figure-8-plot")
    _figure(ctx, s, "sparsity", "sparsity_loss_gap", "figure-8-gap")
    t = _sparsity_table(ctx)
    if not t.empty:
        t = t[t["loss_curve_run"]]
    return s.table(pivot(ctx, "figure-8-data", t, study="sparsity", base=["preset", "config"],
                         extra=["micro_batch_size", "seq_len", "steps", "dense_finetune_steps"], quantities=[
                             ("final loss (nats)", derived("loss_final", R.fmt_loss,
                                                           reason="fewer than two windows of 10 steps")),
                             ("above dense", derived("loss_gap_pct", R.fmt_pct, reason="no dense run to compare")),
                             ("above dense after dense fine-tuning", derived(
                                 "finetune_gap_pct", R.fmt_pct, reason="this run had no dense fine-tuning steps"))]))


def what_if_held_out(ctx: Context) -> Section:
    """The what-if predictor's held-out error on these records: each dense training point predicted
    from a fit on the same system's other points (accel_kit.predict), predicted against measured."""
    from accel_kit.predict import held_out
    from accel_kit.predict.plots import predicted_vs_measured

    s = Section("what-if", "What-if: held-out prediction error (predicted against measured)")
    # No link probe here: the report reads records, it does not measure (a link probed by the
    # what-if notebook beside the records is used).
    first = next((src.path for src in ctx.records.sources if Path(src.path).is_dir()), None)
    df = held_out(ctx.records.records, link_root=first, probe=False)
    if df.empty:
        return s.text('<p class="nofig" id="what-if-missing">No figure: no system in this report has dense '
                      "training records (scaling, seq_length, gas) to predict.</p>")
    s.text("<p>Each dense training point is predicted from a fit on the same system's other points "
           "(leave-one-out; <code>accel_kit/predict/model.py</code>), then compared with what was measured "
           "(the median of its runs, where the report keeps several). "
           "The error is relative: (predicted &minus; measured) / measured.</p>")
    if df["predicted_step_s"].notna().any():
        s.figure("what-if-plot", predicted_vs_measured(df))
    t = Table("what-if-errors", ["study", "devices", "seq", "micro-batch", "GAS", "quantity"], ctx.systems,
              caption="step time and peak memory: measured, predicted from the others, error")
    for key, g in df.groupby(["study", "devices", "seq_len", "micro_batch_size", "gas"], sort=True):
        for what, measured, predicted, error, fmt in (
                ("step time", "measured_step_s", "predicted_step_s", "step_error", R.fmt_num),
                ("peak memory", "measured_mem_gib", "predicted_mem_gib", "mem_error", R.fmt_num)):
            cells = []
            for system in ctx.systems:
                rows = g[g["system"] == system]
                if rows.empty:
                    cells.append(R.not_run(f"no {key[0]} record of {system} at this shape"))
                    continue
                r = rows.iloc[0]
                if R.is_missing(r[predicted]):
                    cells.append(Cell("not predicted", (r["record_id"],), R.NOT_MEASURED,
                                      r["why_not"] or "no prediction"))
                    continue
                text = f"{fmt(r[measured])} / {fmt(r[predicted])} ({100 * r[error]:+.1f} %)" \
                    if not R.is_missing(r[measured]) else f"not measured / {fmt(r[predicted])}"
                cells.append(Cell(text, (r["record_id"],), value=float(r[predicted])))
            t.add(list(key) + [what], cells)
    return s.table(t)


# ---------------------------------------------------------------------------------------------- page order

SECTIONS: list[Callable[[Context], Section]] = [
    systems_section,
    # findings are computed after the tables they summarise; the page shows them second (see build)
    table_ii_scaling,
    table_iii_seq_length,
    table_iv_genslm,
    figure_3_forward,
    figure_4_backward,
    figure_5_scaling,
    figure_6_gas,
    figure_7_sparsity_throughput,
    figure_8_sparsity_loss,
    what_if_held_out,
]
