"""What ``accel-kit tune`` prints: the ranked prediction with its inputs and their sources, what was removed and
why; after measuring, the two rankings side by side."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from accel_kit.tune import Plan
    from accel_kit.tune.measure import Tuned

from accel_kit.tune.space import REASONS


def plan_lines(plan: Plan, shown: int = 10) -> list[str]:
    """The header, the inputs with their sources, the pruned counts by reason, the top ``shown`` predictions."""
    p = plan.params
    what = ("PREDICTED" if plan.at_hand else
            f"PREDICTIONS ONLY: {plan.system}'s device is not here, nothing is measured")
    lines = [f"tune {p.preset} on {p.devices} x {plan.system}, seq {plan.seq_len}, global batch {plan.global_batch}, "
             f"{plan.precision}: {what}",
             f"  device memory: {_gib(plan.device_gib)} ({plan.device_gib_source})",
             f"  memory margin: {plan.margin:.1%} ({plan.margin_source})"]
    top = plan.ranked[:shown]
    seen: dict[str, None] = {}
    for r in top:
        seen |= dict.fromkeys(f"  input: {x}" for x in r.prediction.inputs)
    for r in top:
        seen |= dict.fromkeys(f"  assumption: {x}" for x in r.prediction.assumptions if not x.startswith("layout "))
    lines += list(seen) + _pruned_lines(plan)
    lines.append(f"{'rank':>4}  {'layout':44s} {'tokens/s':>10} {'step s':>9} {'GiB/dev':>8}  basis")
    for i, r in enumerate(top):
        lines.append(_row(str(i + 1), r))
    if any(_unmodelled(r) for r in top):
        lines.append("   * its prediction leaves some of its layout's traffic out (a pipeline's activation sends, "
                     "context parallelism's key/value exchange: see the assumptions)")
    if plan.default is not None:
        rank = plan.rank_of(plan.default.candidate)
        where = f"rank {rank} of {len(plan.ranked)}" if rank else "removed for memory"
        lines.append(f"default, {where}:")
        lines.append(_row("-", plan.default))
    else:
        lines.append(f"default: none (global batch {plan.global_batch} does not split over {p.devices} devices)")
    return lines + plan.notes


def _pruned_lines(plan: Plan) -> list[str]:
    space = plan.space
    kept = len(plan.ranked)
    lines = [f"considered {space.meshes} meshes (engine x tp x pp x cp x ep over the divisors of {plan.params.devices});"
             f" {len(space.candidates)} configurations (with micro-batch x GAS, checkpointing off/on) predicted, "
             f"{kept} fit; removed by reason (meshes, or configurations for batch and memory):"]
    for reason in REASONS:
        if space.pruned[reason]:
            lines.append(f"  {reason:13s} {space.pruned[reason]:6d}  e.g. {space.examples[reason]}")
    return lines


def _row(rank: str, ranked) -> str:
    pred = ranked.prediction
    label = ranked.candidate.label() + (" *" if _unmodelled(ranked) else "")
    return (f"{rank:>4}  {label:44s} {pred.tokens_per_s:10.4g} {pred.step_time_s:9.4g} "
            f"{pred.memory_per_device_gib:8.3g}  {pred.basis}")


def _unmodelled(ranked) -> bool:
    """Whether the predictor leaves some of this layout's traffic out: a pipeline's activation sends and context
    parallelism's key/value exchange (``accel_kit.predict.predictor``; each prediction's assumptions say so)."""
    lay = ranked.candidate.layout
    return lay.pp > 1 or lay.cp > 1


def _gib(v: float | None) -> str:
    return "unknown" if v is None else f"{v:.3g} GiB"


def measured_lines(tuned: Tuned) -> list[str]:
    """Predicted against measured, per measured configuration, then tau, the choice and the default's figure."""
    lines = [f"measured on {tuned.plan.system} ({len(tuned.rows)} configurations; records -> {tuned.records_path}):",
             f"{'pred':>4} {'meas':>4}  {'layout':44s} {'predicted':>10} {'measured':>10} {'error':>7}  status"]
    for row in tuned.rows:
        meas = "" if row.measured is None else f"{row.measured:10.4g}"
        err = "" if row.error is None else f"{row.error:+7.1%}"
        lines.append(f"{row.predicted_rank or '-':>4} {row.measured_rank or '-':>4}  {row.label:44s} "
                     f"{row.predicted:10.4g} {meas:>10} {err:>7}  {row.status}"
                     + (" (default)" if row.default else "") + (f": {row.reason[:100]}" if row.reason else ""))
    lines.append(f"Kendall's tau, predicted against measured tokens/s: {tuned.tau:.3f} over {tuned.compared} "
                 "configurations" if tuned.compared >= 2 else "Kendall's tau: fewer than 2 configurations measured")
    if tuned.chosen is not None:
        line = f"chosen: {tuned.chosen.label}, {tuned.chosen.measured:.4g} tokens/s measured"
        base = tuned.default_row
        if base is not None and base.measured:
            line += f", {tuned.chosen.measured / base.measured:.2f}x the default's {base.measured:.4g}"
        lines.append(line)
    return lines + tuned.notes
