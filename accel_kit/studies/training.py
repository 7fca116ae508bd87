"""What the training studies (scaling, sequence length, GAS, ...) share: parameters, points, running.

A training study's parameters are ``TrainSpec`` (every field of a training point, declared
once in ``accel_kit.engine.point``) plus the run's own settings below, plus its axes (lists
that replace one of the spec's single values, e.g. ``seq_lens`` for ``seq_len``, declared in
``AXES``). Its points are built by ``make_point`` and run by the sweep runner
(``accel_kit.engine.sweep``), one process per point. A study that differs from another only in
its axes (scaling, sequence length, GAS) has no ``run`` of its own: ``study_runner`` makes it
from the axes, the product of their sorted values, in the order the axes are declared.
"""
from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Callable, ClassVar, Literal, Sequence

import pandas as pd

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, create_model
from pydantic.fields import FieldInfo

from accel_kit.devices import PrecisionChoice
from accel_kit.errors import ParameterError
from accel_kit.models import check_preset
from accel_kit.params import StudyParams
from accel_kit.results import Record
from accel_kit.systems import System
from accel_kit.engine.layout import check_layout
from accel_kit.engine.point import Point, TrainPoint, TrainSpec
from accel_kit.engine.sweep import PeakReference, run_sweep
from accel_kit.mesh import LAYOUT_DEFAULTS, LAYOUT_FIELDS


class _OtherModelBase(BaseModel):
    """Another configuration the study's axes also run, with the settings it differs in: a full profile's
    Llama 3.1 8B at sequence 8192 in bf16 beside the paper's GPT-2 XL, or the paper's A100 tensor-parallel
    layouts. Its fields are ``TrainSpec``'s, each None ("the study's") unless set, plus ``systems``. A
    field it sets that a study sweeps (``seq_len`` in the sequence-length study, ``devices`` in the scaling
    study) is that configuration's one value of the axis. A layout (``tp``, ``pp``) runs over the device
    counts it divides (tensor parallel 4 from 4 devices on), and ``systems`` limits the entry to the
    systems named (the paper's A100 layouts on ``a100``)."""

    model_config = ConfigDict(extra="forbid")

    systems: list[str] | None = None  # the systems it runs on; None: every one

    def changes(self) -> dict:
        """The training fields it sets (not ``systems``, which says where)."""
        return self.model_dump(exclude_none=True, exclude={"systems"})

    def runs_on(self, system: System) -> bool:
        return self.systems is None or system.id in self.systems


# Every TrainSpec field, with its own type and bounds, optional: the one schema of a training point.
OtherModel = create_model(
    "OtherModel", __base__=_OtherModelBase, __module__=__name__, __doc__=_OtherModelBase.__doc__,
    **{name: (field.annotation | None, FieldInfo.merge_field_infos(field, default=None))
       for name, field in TrainSpec.model_fields.items()})


class TrainingParams(StudyParams, TrainSpec):
    """Every training parameter (``TrainSpec``) plus how the run goes. None means "the system's default"."""

    timeout_s: float = Field(default=1800, gt=0)  # per point; a hung point is killed and recorded
    measure_peak: bool = True
    # local; or inside a batch job: mpiexec, mpirun, srun (every rank), torchrun (one per node, c10d rendezvous)
    launcher: Literal["local", "mpiexec", "mpirun", "srun", "torchrun"] = "local"
    max_nodes: PositiveInt = 1  # nodes this run may use (set by job scripts)
    # Devices (ranks) a node runs, which spreads a point's ranks over nodes; None: the system's figure. Job
    # scripts set it (jobscript --devices-per-node): a CPU node's real cores, not the cpu system's nominal 8.
    devices_per_node: PositiveInt | None = None
    # Where on the first node a job's multi-node points meet (a site that opens only some ports); None: a port
    # free there, chosen per point.
    rendezvous_port: int | None = Field(default=None, ge=1, le=65535)
    # The study's axes: list parameter -> the TrainSpec field it sweeps (e.g. {"seq_lens": "seq_len"}).
    AXES: ClassVar[dict[str, str]] = {}

    def check(self, system: System) -> None:
        for where, preset in [("preset", self.preset)] + [(f"also[{i}].preset", o.preset) for i, o in
                                                            enumerate(getattr(self, "also", []))]:
            if preset is not None:
                check_preset(preset, where)  # a name, or hf:PATH (its file read and its shape checked)
        check_also(getattr(self, "also", []))


def check_also(also: list[OtherModel]) -> None:
    """Refuse, in one line, an ``also`` entry naming a system that does not exist."""
    from accel_kit.systems import system_ids

    known = system_ids()
    for i, other in enumerate(also):
        unknown = sorted(set(other.systems or []) - set(known))
        if unknown:
            raise ParameterError(f"parameter 'also[{i}][systems]': unknown system {', '.join(map(repr, unknown))}; "
                                 f"known: {', '.join(known)}")


class AxesParams(TrainingParams):
    """A study that is its axes (scaling, sequence length, GAS): ``study_runner`` runs it, and ``also``
    runs other models over the same axes."""

    also: list[OtherModel] = []  # other models the axes run too, after the preset's points


def requested_precision(params: TrainingParams, system: System) -> str:
    """The precision asked for: the parameter, else the system's default (``auto`` included)."""
    return params.precision or system.default_precision


def resolve_precision(params: TrainingParams, system: System) -> PrecisionChoice:
    """The precision the points run in: the parameter or the system's default, resolved by the adapter."""
    return system.adapter_instance().resolve_precision(requested_precision(params, system))


def make_point(params: TrainingParams, system: System, choice: PrecisionChoice, **axis) -> TrainPoint:
    """A TrainPoint from the study parameters, the system's defaults and this point's axis values."""
    values = params.model_dump(include=set(TrainSpec.model_fields)) | axis
    adapter = system.device_adapter()
    placement = adapter.placement(values["devices"])
    values |= {"system": system.id, "devices_per_node": params.devices_per_node or system.devices_per_node,
               "precision": choice.precision,
               "precision_reason": choice.reason,
               "micro_batch_size": values["micro_batch_size"] or system.micro_batch_size,
               "seq_len": values["seq_len"] or system.seq_len,
               "processes": placement.processes, "replicas": placement.replicas,
               "steps_per_call": placement.steps_per_call,
               "pp": adapter.pipeline_degree(values["pp"])}  # (an IPU's pipeline is the device's: the point records it)
    point = TrainPoint(**values)
    if adapter.engine_layouts():
        check_layout(point)  # a layout that does not divide, or that the model or the engine cannot take: one line
    # (else the programming model's own: its unsupported_train records what it cannot take, with the reason)
    return point


def resolve_data(data: str, data_root: Path, *, progress: bool) -> str | None:
    """Where ``data`` is read from: None for synthetic; the embedded corpus prepared (once) under
    ``data_root`` for 'text'; a prepared folder as given (checked)."""
    if data == "synthetic":
        return None
    if data == "text":
        from accel_kit.data import prepare_default_text

        out = data_root / "pydoc-gpt2"
        prepare_default_text(out, progress=progress)
        return str(out.resolve())
    from accel_kit.data import read_meta

    read_meta(data)  # raises a one-line DataError for a folder that is not prepared
    return str(Path(data).resolve())


def _model_vocab_size(preset: str, vocab_size_override: int | None) -> int:
    """The token ids a point's model embeds: its preset's vocabulary, or the point's ``vocab_size``."""
    from accel_kit.models import family_of, get_config

    cfg = get_config(preset, **({"vocab_size": vocab_size_override} if vocab_size_override else {}))
    return family_of(cfg).shape(cfg).vocab_size


def check_data_vocab(points: Sequence[TrainPoint]) -> None:
    """Refuse, before any work, a point whose data holds token ids its model cannot embed.

    Raises:
        ParameterError: a data's tokenizer has more tokens than its model's vocabulary (both named).
    """
    from accel_kit.data import read_meta
    from accel_kit.tokenizers.gpt2 import VOCAB_SIZE as GPT2_VOCAB

    for p in {(p.preset, p.vocab_size, p.data, p.data_path): p for p in points}.values():
        if p.data == "synthetic" and p.data_path is None:
            continue  # drawn from the model's own vocabulary
        if p.data == "text" and p.data_path is None:
            tokenizer, tokens = "gpt2", GPT2_VOCAB  # known before the embedded corpus is prepared
        else:
            meta = read_meta(p.data_path or p.data)  # a one-line DataError for a folder not prepared
            tokenizer, tokens = meta["tokenizer"], int(meta["vocab_size"])
        model = _model_vocab_size(p.preset, p.vocab_size)
        if tokens > model:
            of = f"model preset {p.preset!r}" + (f" with vocab_size {p.vocab_size}" if p.vocab_size else "")
            raise ParameterError(f"data {p.data!r}: its tokenizer {tokenizer} has {tokens:,} tokens, more than the "
                                 f"{model:,} of {of}; use a preset with at least {tokens:,} (or -p vocab_size {tokens})")


def peak_shapes(points: Sequence[TrainPoint]) -> tuple[tuple[int, int, int], ...]:
    """The block GEMM shapes of the points' models (their own products), for the measured peak."""
    from accel_kit.models import family_of, get_config

    shapes: dict[tuple[int, int, int], None] = {}
    for p in points:
        cfg = get_config(p.preset)
        shapes |= dict.fromkeys(family_of(cfg).gemm_shapes(cfg, p.micro_batch_size * p.seq_len))
    return tuple(shapes)


def run_points(study: str, params: TrainingParams, system: System, points: Sequence[Point], *, records_path: Path,
               run_id: str, profile: str | None, progress: bool, rerun: bool = False,
               threads_as_ranks: int | None = None) -> list[Record]:
    """Resolve the training points' data, then run (or resume) the sweep of ``points`` (of any kind: a study
    may measure other kinds beside its training steps) with a measured peak reference. Where ranks share the
    host's cores, every process gets the threads of one rank among ``threads_as_ranks`` (None: among the points'
    largest device count)."""
    params.check(system)
    train = [p for p in points if isinstance(p, TrainPoint)]
    check_data_vocab(train)
    adapter = system.adapter_instance()  # fail early, in one line, when the device is missing
    # Per point, each distinct value once: a study may give its points different prepared folders
    # (GenSLM prepares the genomes once per block size).
    data_root = records_path.parent.parent / "data"
    paths = {d: resolve_data(d, data_root, progress=progress) for d in dict.fromkeys(p.data for p in train
                                                                                         if p.data_path is None)}
    points = [p.model_copy(update={"data_path": paths[p.data]}) if isinstance(p, TrainPoint) and p.data_path is None
              else p for p in points]
    peak = PeakReference(system.id, peak_shapes([p for p in points if isinstance(p, TrainPoint)]),
                         enabled=params.measure_peak)
    extra = params.model_dump(exclude=set(TrainSpec.model_fields)) | {
        "profile": profile, "precision_requested": requested_precision(params, system)}
    return run_sweep(study, points, records_path=records_path, run_id=run_id, extra_params=extra,
                     timeout_s=params.timeout_s, launcher=params.launcher, max_nodes=params.max_nodes,
                     rendezvous_port=params.rendezvous_port,
                     progress=progress, cpu_threads=adapter.threads_per_rank(
                         threads_as_ranks or max((p.devices for p in train), default=1)),
                     peak=peak, rerun=rerun)


def axis_points(params: TrainingParams, system: System, choice: PrecisionChoice) -> list[TrainPoint]:
    """One point per combination of the study's axes (``AXES``), each axis's values sorted and once.

    Sorted, so a sequence-length sweep finds its memory frontier before the longer lengths are tried.
    """
    return _product(params, system, choice, {})


def _product(params: TrainingParams, system: System, choice: PrecisionChoice, fixed: dict, *,
             dividing: bool = False) -> list[TrainPoint]:
    """The points of every combination of the axes; ``dividing``: only the device counts the layout divides
    (an ``also`` entry's tensor parallel 4 starts at 4 devices), the others left out, not refused."""
    names = list(type(params).AXES)
    fields = [type(params).AXES[name] for name in names]
    # An axis whose field the model fixes runs that one value.
    values = [[fixed[f]] if f in fixed else sorted(set(getattr(params, name))) for name, f in zip(names, fields)]
    combos = [dict(zip(fields, combo)) for combo in itertools.product(*values)]
    if dividing:  # dp = devices / (tp x pp x cp) a whole number, which ep divides
        combos = [c for c in combos if c.get("devices", params.devices) % (params.replica_devices * params.ep) == 0]
    return [make_point(params, system, choice, **combo) for combo in combos]


def unresolved_precision(params: TrainingParams, system: System) -> PrecisionChoice:
    """The precision asked for, not resolved on a device (a job script is written where its system's devices
    are not): ``auto`` stands as fp32 for the layout's checks, which refuse only fp16."""
    asked = requested_precision(params, system)
    return PrecisionChoice(asked, "fp32" if asked == "auto" else asked, "as asked; resolved on the job's nodes")


def all_points(params: AxesParams, system: System, precision: Callable[[TrainingParams, System], PrecisionChoice]
               = resolve_precision) -> list[TrainPoint]:
    """The preset's points (``axis_points``), then each of ``also``'s over the same axes (those whose
    ``systems`` include this one). ``precision``: how a configuration's precision is resolved (by the
    system's adapter; ``unresolved_precision`` where its devices are not at hand).

    Raises:
        ParameterError: a layout the model or the engine cannot take, a device count it does not divide,
            or an ``also`` entry whose layout divides none of the device counts.
    """
    points = axis_points(params, system, precision(params, system))
    check_also(params.also)
    for i, other in enumerate(params.also):
        if not other.runs_on(system):
            continue
        changes = other.changes()
        # The study's own values, changed where the other model says so; its axis fields stay the study's lists.
        mine = params.model_copy(update={k: v for k, v in changes.items() if k in TrainSpec.model_fields})
        mine_points = _product(mine, system, precision(mine, system), changes, dividing=True)
        if not mine_points:
            layout = ", ".join(f"{f} {getattr(mine, f)}" for f in LAYOUT_FIELDS if f != "engine")
            raise ParameterError(f"parameter 'also[{i}]': its layout ({layout}) divides none of the device counts")
        points += mine_points
    return points


def layout_lines(points: list[TrainPoint]) -> list[str]:
    """What a job script says of its points' layouts: per configuration (model, precision, layout) the
    devices it runs on and its data-parallel degree there."""
    configs: dict[tuple[str, str, str], list[TrainPoint]] = {}
    for p in points:
        configs.setdefault((p.preset, p.precision, layout_label(p)), []).append(p)
    lines = ["Layouts: the devices split as pp x dp x cp x tp, dp = devices / (tp x pp x cp) (accel_kit.mesh)"]
    for (preset, precision, label), mine in configs.items():
        shown = ", ".join(dict.fromkeys(f"{p.devices} (dp {p.dp})" for p in mine))
        lines.append(f"  {preset} {precision}: {label} (tp {mine[0].tp}, pp {mine[0].pp}) on {shown} devices")
    return lines


def left_out_lines(points: list[TrainPoint], nodes: int, devices_per_node: int) -> list[str]:
    """What a job script says of the points its ``nodes`` cannot hold (``points``: those): per configuration the
    devices each needs. The run records them as unsupported without starting them (``run_worker``)."""
    configs: dict[tuple[str, str, str], list[TrainPoint]] = {}
    for p in points:
        configs.setdefault((p.preset, p.precision, layout_label(p)), []).append(p)
    lines = [f"Left out: points that need more than the job's {nodes * devices_per_node} devices ({nodes} node(s) x "
             f"{devices_per_node});", "  the run records them as unsupported, without starting them"]
    for (preset, precision, label), mine in configs.items():
        counts = ", ".join(dict.fromkeys(str(p.devices) for p in mine))
        lines.append(f"  left out: {preset} {precision}: {label} on {counts} devices, the job has "
                     f"{nodes * devices_per_node}")
    return lines


def layout_label(row: object) -> str:
    """A point's layout as a table or a legend names it: ``ddp``, ``fsdp``, ``ddp, tp 2``; ``row``: a record
    row or a point (its ``engine``, ``tp``, ``pp``, ``cp``)."""
    get = row.get if hasattr(row, "get") else lambda k, d=None: getattr(row, k, d)
    parts = [str(get("engine") or LAYOUT_DEFAULTS["engine"])]
    for f in LAYOUT_FIELDS[1:]:
        degree = get(f)
        if degree is not None and not (isinstance(degree, float) and math.isnan(degree)) and int(degree) > 1:
            parts.append(f"{f} {int(degree)}")
    return ", ".join(parts)


def with_layout(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` (training records) with every layout field filled (a record from before a field existed ran
    its default: data parallel, tp 1, pp 1) and a ``layout`` column (``layout_label``): points of different
    layouts stay apart in a study's table and figures, and records of one layout stay together."""
    if df.empty:
        return df
    fill = {f: df[f].where(df[f].notna(), default) if f in df.columns else default
            for f, default in LAYOUT_DEFAULTS.items()}
    df = df.assign(**fill)
    return df.assign(layout=[layout_label(r) for _, r in df.iterrows()])


def study_runner(study: str) -> Callable[..., list[Record]]:
    """The ``run`` of a training study that differs from the others only in its axes."""

    def run(params: TrainingParams, system: System, *, records_path: Path, run_id: str, profile: str | None = None,
            progress: bool = True, rerun: bool = False) -> list[Record]:
        points = all_points(params, system)
        return run_points(study, params, system, points, records_path=records_path, run_id=run_id, profile=profile,
                          progress=progress, rerun=rerun)

    run.__doc__ = f"Measure (or resume) every point of the {study} study, each in its own process; one record each."
    return run
