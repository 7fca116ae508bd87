"""The Models section: each model that trained, as its records say: family, shape, parameters, and for a
mixture of experts the active parameters (those a token multiplies, which its FLOPs and MFU count) beside
the total (which its memory holds), each value citing the record it comes from."""
from __future__ import annotations

from accel_kit.report.context import Context, Section
from accel_kit.report.render import Cell, Table
from accel_kit.results import Record

COLUMNS = ["family", "layers x width", "parameters", "active parameters", "experts (routed, per token, shared)"]


def models_section(ctx: Context) -> Section:
    """One row per model (preset) that a training record names, from the first such record."""
    s = Section("models", "Models")
    first: dict[str, Record] = {}
    for r in ctx.records.records:
        if r.model and r.metrics.get("n_params") is not None:
            first.setdefault(r.model, r)
    if not first:
        return s.text("<p>No training record names its model.</p>")
    table = Table("models-table", ["model"], COLUMNS)
    for model, rec in sorted(first.items()):
        table.add([model], _cells(rec))
    s.text("<p>The models that trained. A mixture of experts holds every expert in memory but multiplies each "
           "token by its routed experts only: its FLOPs, TFLOP/s and MFU count the active parameters.</p>")
    return s.table(table)


def _cells(rec: Record) -> list[Cell]:
    m, rid = rec.metrics, (rec.record_id,)
    total = int(m["n_params"])
    active = int(m.get("n_params_active") or total)
    experts = (f"{m['n_experts']}, {m.get('experts_per_token', '?')}, {m.get('n_shared_experts', 0)}"
               if m.get("n_experts") else "dense")
    return [Cell(str(m.get("family", "?")), rid),
            Cell(f"{m.get('n_layers', '?')} x {m.get('hidden_size', '?')}", rid),
            Cell(_count(total), rid, value=float(total)),
            Cell(_count(active) + (f" ({active / total:.0%})" if active != total else ""), rid, value=float(active)),
            Cell(experts, rid)]


def _count(n: int) -> str:
    """A parameter count people read: 46.7B, 110M, 110,336."""
    for scale, unit in ((1e9, "B"), (1e6, "M")):
        if n >= scale:
            return f"{n / scale:.1f}{unit}"
    return f"{n:,}"
