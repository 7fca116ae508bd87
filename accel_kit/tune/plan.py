"""The planning half of ``accel-kit tune`` (``accel_kit.tune``): every configuration enumerated, pruned, predicted
and ranked; what it prints."""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, get_args

import pandas as pd
from pydantic import Field, PositiveInt

from accel_kit.errors import AccelKitError, ParameterError
from accel_kit.json_types import JSONObject
from accel_kit.mesh import Engine, ParallelLayout
from accel_kit.models.memory import fits
from accel_kit.predict.predictor import Prediction, Predictor
from accel_kit.studies.training import TrainingParams
from accel_kit.tune.space import REASONS, Candidate, Space, default_layout, enumerate_space

if TYPE_CHECKING:
    import plotly.graph_objects as go

    from accel_kit.systems import System

STUDY = "tune"  # params/tune/<profile>.yaml; records in outputs/tune/<system>.jsonl
# The memory margin where the system has no measured peaks to hold the memory model against: the predictor's
# own target for its peak-memory error (benchmarks/predict_error.py: mean <= 15 %).
DEFAULT_MEMORY_MARGIN = 0.15
# A device's memory the predictor counts usable (the rest is the allocator's slack): ``fits``'s own figure.
USABLE_FRACTION: float = inspect.signature(fits).parameters["usable_fraction"].default
CHOSEN = ("engine", "tp", "pp", "pp_microbatches", "pp_schedule", "cp", "ep", "micro_batch_size", "gas",
          "activation_checkpointing")


class TuneParams(TrainingParams):
    """What to tune: a model on ``devices`` devices at one sequence length, global batch and precision, and how
    much to measure. Every other training field is a measured point's (its steps, its data); the layout and
    the batch split are tune's to choose."""

    REPLACED_BY: ClassVar[dict[str, str]] = {f: "nothing: tune chooses it" for f in CHOSEN}
    preset: str = "llama3-debug"
    devices: PositiveInt = 4  # devices (ranks) to lay the model out over
    global_batch: PositiveInt | None = None  # samples per optimizer step; None: the system's micro-batch x devices
    top_k: PositiveInt = 4  # predicted-best layouts to measure (with the system's default)
    budget_s: float | None = Field(default=None, gt=0)  # seconds for all the measuring; None: no limit
    records: list[str] | None = None  # output folders (or .jsonl, archives) to learn from; None: outputs/
    data: str = "synthetic"
    measure_peak: bool = False  # (a peak only feeds MFU, which tune does not rank by)


@dataclass
class Ranked:
    """A configuration and its prediction."""

    candidate: Candidate
    prediction: Prediction

    @property
    def tokens_per_s(self) -> float:
        return self.prediction.tokens_per_s


@dataclass
class Plan:
    """The prediction: the configurations that fit, fastest first, and what was removed and why."""

    system: str
    params: TuneParams
    precision: str
    seq_len: int
    global_batch: int
    space: Space
    ranked: list[Ranked]
    default: Ranked | None  # the system's default layout, predicted (whether it fits or not)
    margin: float
    margin_source: str
    device_gib: float | None
    device_gib_source: str
    at_hand: bool  # whether the system's device is here to measure on
    removed: list[Ranked] = field(default_factory=list)  # predicted, then removed for memory
    notes: list[str] = field(default_factory=list)

    def rank_of(self, candidate: Candidate) -> int | None:
        """1 for the predicted fastest; None for a configuration removed (or never considered)."""
        return next((i + 1 for i, r in enumerate(self.ranked) if r.candidate == candidate), None)

    def lines(self, shown: int = 10) -> list[str]:
        """The ranked prediction with every input's source and the pruned counts by reason (``plan_lines``)."""
        return plan_lines(self, shown)

    def table(self, shown: int = 20) -> pd.DataFrame:
        """The ranked prediction alone (where nothing was measured): the top ``shown``, with memory and basis."""
        return plan_table(self, shown)

    def figures(self) -> dict[str, go.Figure]:
        """None: a prediction alone has nothing measured to draw against."""
        return {}


def resolve_params(profile: str | None, overrides: JSONObject) -> TuneParams:
    from accel_kit import params as _params

    return _params.resolve(TuneParams, STUDY, profile, overrides)


def plan(system: str, params: TuneParams, records: list | None = None, precision: str | None = None,
         output_dir: str | Path | None = None) -> Plan:
    """Enumerate, prune and predict ``params.preset`` on ``params.devices`` devices of ``system``, learning from
    ``records`` (None: those under ``params.records``, else under ``output_dir``, else outputs/), in
    ``precision`` (None: as ``accel-kit predict`` resolves the parameter). A measured link is kept under the
    first of those folders.

    Raises:
        ParameterError: an unknown model, a device count no layout divides, a global batch no micro-batch and GAS
            make (each in one line).
    """
    from accel_kit.paths import output_dir as default_output_dir
    from accel_kit.predict.heldout import load_records
    from accel_kit.systems import load_system

    sys_desc = load_system(system)
    params.check(sys_desc)  # an unknown preset: one line
    dirs = params.records or [str(default_output_dir(output_dir))]
    if records is None:
        records = load_records(d for d in dirs if params.records or Path(d).exists())
    adapter = sys_desc.device_adapter()
    at_hand = bool(adapter.availability())
    # Where the system's device is here and its ranks share the host's cores (a CPU's), a rank computes on its share.
    host_cores = adapter.threads_per_rank(1) if at_hand else None
    predictor = Predictor(system, records, link_root=dirs[0], host_cores=host_cores)
    precision = precision or _precision(params, sys_desc, predictor)
    space, seq_len, global_batch = space_for(params, sys_desc, precision)
    margin, margin_source = memory_margin(records, system, dirs[0])
    limit, limit_source = _device_memory(params, sys_desc)
    out = Plan(system, params, precision, seq_len, global_batch, space, [], None, margin, margin_source, limit,
               limit_source, at_hand)
    _predict(out, predictor, default_layout(params.devices, global_batch, sys_desc.micro_batch_size))
    return out


def space_for(params: TuneParams, system: System, precision: str) -> tuple[Space, int, int]:
    """The configurations of ``params`` on ``system`` the checks let through, its sequence length and global batch.

    Raises:
        ParameterError: none is left (a device count no layout divides, a global batch no split makes).
    """
    seq_len = params.seq_len or system.seq_len
    global_batch = params.global_batch or system.micro_batch_size * params.devices
    space = enumerate_space(params.preset, devices=params.devices, global_batch=global_batch, seq_len=seq_len,
                            precision=precision, adapter=system.device_adapter())
    _refuse_empty(space, params, global_batch)
    return space, seq_len, global_batch


def _precision(params: TuneParams, system: System, predictor: Predictor) -> str:
    """The precision asked for, ``auto`` resolved as ``accel-kit predict`` resolves it."""
    from accel_kit.predict import prediction_precision

    return prediction_precision(params.precision or system.default_precision, system, predictor)


def _refuse_empty(space: Space, params: TuneParams, global_batch: int) -> None:
    if space.candidates:
        return
    reasons = ", ".join(f"{n} by {r}" for r, n in space.pruned.most_common())
    if space.pruned["global batch"]:  # a mesh that would have run but for the batch
        raise ParameterError(f"no layout of {params.preset} on {params.devices} devices makes global batch "
                             f"{global_batch} from a micro-batch and GAS ({reasons}); e.g. "
                             f"{space.examples['global batch']}")
    raise ParameterError(f"no layout of {params.preset} divides {params.devices} devices ({reasons}); "
                         + "; ".join(f"{r}: {space.examples[r]}" for r, _ in space.pruned.most_common(2)))


def memory_margin(records: list, system: str, link_root: str | None) -> tuple[float, str]:
    """How much more than predicted a configuration may need: the memory model's largest held-out error on
    this system's records, else ``DEFAULT_MEMORY_MARGIN``; with where the figure comes from."""
    from accel_kit.predict.heldout import error_summary, held_out

    errors = error_summary(held_out(records, [system], link_root=link_root, probe=False))
    worst = errors["mem_max_abs_error"].dropna().max() if "mem_max_abs_error" in errors else float("nan")
    if worst == worst:  # (not NaN)
        return float(worst), f"the memory model's largest held-out peak-memory error on {system}'s records"
    return DEFAULT_MEMORY_MARGIN, (f"assumed: no measured peaks of {system} to hold the memory model against; the "
                                   f"predictor's peak-memory error target (benchmarks/predict_error.py)")


def _device_memory(params: TuneParams, system: System) -> tuple[float | None, str]:
    """Memory one device (rank) may use: the points' cap, else the system's figure, else the device's own."""
    if params.memory_limit_gib:
        return params.memory_limit_gib, "memory_limit_gib (each measured point's process is capped at it)"
    if system.device_memory_gib:
        return float(system.device_memory_gib), f"params/systems/{system.id}.yaml device_memory_gib"
    adapter = system.device_adapter()
    total = adapter.total_memory_bytes() if adapter.availability() else None
    if total is None:
        return None, "unknown: nothing is removed for memory"
    return total / 2**30, f"the {system.adapter} adapter's total memory here"


def _predict(out: Plan, predictor: Predictor, default: ParallelLayout | None) -> None:
    """Predict every candidate (one step shape per checkpointing setting, its layout replaced: the model's
    counts are made once), remove those that do not fit, rank the rest."""
    from accel_kit.predict import shape_for

    p = out.params
    base = {ckpt: shape_for(p.preset, ParallelLayout(devices=p.devices, micro_batch_size=1), seq_len=out.seq_len,
                            precision=out.precision, activation_checkpointing=ckpt) for ckpt in (False, True)}
    for cand in out.space.candidates:
        try:
            pred = predictor.predict(replace(base[cand.activation_checkpointing], layout=cand.layout))
        except AccelKitError as exc:  # nothing to predict from (no records, no datasheet): one line
            raise AccelKitError(f"cannot predict {p.preset} on {out.system}: {exc}") from None
        ranked = Ranked(cand, pred)
        if default is not None and cand == Candidate(default, False):
            out.default = ranked
        need = pred.memory_per_device_gib * (1 + out.margin)
        if out.device_gib is not None and need > USABLE_FRACTION * out.device_gib:
            out.space.prune("memory", cand.label(), f"{pred.memory_per_device_gib:.3g} GiB predicted, "
                                                    f"{need:.3g} with the margin, over {USABLE_FRACTION:.0%} of "
                                                    f"{out.device_gib:.3g} GiB")
            out.removed.append(ranked)
            continue
        out.ranked.append(ranked)
    out.ranked.sort(key=lambda r: (-r.tokens_per_s, *simplicity(r.candidate)))
    if not out.ranked:
        raise ParameterError(f"no layout of {p.preset} on {p.devices} devices fits: "
                             f"{out.space.pruned['memory']} removed for memory, e.g. {out.space.examples['memory']}")


def simplicity(candidate: Candidate) -> tuple:
    """Among configurations predicted alike, the one with fewer moving parts first: no checkpointing (its
    recomputation is work a fit without checkpointed records may not see), the engine in the order ``Engine``
    lists them (ddp, fsdp, deepspeed), the fewest split degrees, the largest micro-batch (the fewest launches)."""
    lay = candidate.layout
    return (candidate.activation_checkpointing, get_args(Engine).index(lay.engine), lay.replica_devices * lay.ep,
            -lay.micro_batch_size)


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


def plan_table(plan: Plan, shown: int = 20) -> pd.DataFrame:
    """``Plan.table``."""
    rows = [{"predicted_rank": i + 1, "layout": r.candidate.label(), "predicted_tokens_per_s": r.tokens_per_s,
             "predicted_step_s": r.prediction.step_time_s,
             "memory_per_device_gib": r.prediction.memory_per_device_gib,
             "default": plan.default is not None and r.candidate == plan.default.candidate,
             "basis": r.prediction.basis} for i, r in enumerate(plan.ranked[:shown])]
    return pd.DataFrame(rows)
