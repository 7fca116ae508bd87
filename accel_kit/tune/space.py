"""The layouts ``accel-kit tune`` considers: every mesh of the devices, every micro-batch and GAS that make the
global batch, activation checkpointing off and on; and which check removed each of the others.

A mesh is an engine (ddp, fsdp, deepspeed) x tp x pp x cp x ep, each degree a divisor of the device count. It is
removed, in this order, for

- ``device count``: tp x pp x cp does not divide the devices;
- ``divisibility``: the layout's own arithmetic (ep does not divide dp; a pipeline's micro-batch does not split
  into its chunks);
- ``global batch``: the global batch does not split over dp (checked last of a mesh's: it ran but for the batch);
- ``not built``: a combination the engine here does not build (``ParallelLayout.validate_layout``, and fp16 under
  a sharded layout in ``check_layout``);
- ``model shape``: what the model does not allow (its heads over tp, its blocks over pp, its experts over ep, its
  sequence over cp: ``accel_kit.engine.layout.check_layout``, the check ``accel-kit run`` makes);
- ``device``: what the system's device cannot run (``unsupported_on_device``: context parallelism off CUDA);

and a configuration (a mesh with its micro-batch, GAS and checkpointing) by the memory model, later
(``accel_kit.tune``). A pipeline runs 1F1B with as many chunks as stages: the predictor times GPipe and 1F1B
alike, and 1F1B keeps fewer chunks' activations in flight (``accel_kit.models.memory``).
"""
from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, get_args

from accel_kit.engine.layout import check_layout, unsupported_on_device
from accel_kit.engine.point import TrainSpec
from accel_kit.errors import ParameterError
from accel_kit.json_types import JSONObject
from accel_kit.mesh import Engine, ParallelLayout

if TYPE_CHECKING:
    from accel_kit.devices.base import BaseAdapter

# The reasons a layout is removed, in the order they are checked ("memory" last: ``accel_kit.tune``).
REASONS = ("device count", "divisibility", "not built", "model shape", "device", "global batch", "memory")
DEGREES = ("tp", "pp", "cp", "ep")


@dataclass(frozen=True)
class Candidate:
    """One configuration to predict: a resolved layout (its micro-batch and GAS set) and checkpointing."""

    layout: ParallelLayout
    activation_checkpointing: bool

    def label(self) -> str:
        """``fsdp tp 2, mb 4 x gas 2, ckpt``: the engine, the degrees above 1, the batch split, checkpointing."""
        lay = self.layout
        parts = [lay.engine] + [f"{d} {getattr(lay, d)}" for d in DEGREES if getattr(lay, d) > 1]
        return (" ".join(parts[:1]) + "".join(f" {p}" for p in parts[1:]) + f", dp {lay.dp}, mb {lay.micro_batch_size}"
                f" x gas {lay.gas}" + (", ckpt" if self.activation_checkpointing else ""))

    def fields(self) -> JSONObject:
        """The training point's fields this configuration sets."""
        return self.layout.model_dump() | {"activation_checkpointing": self.activation_checkpointing}


@dataclass
class Space:
    """The configurations left, and how many meshes or configurations each check removed (one example each)."""

    candidates: list[Candidate] = field(default_factory=list)
    pruned: Counter = field(default_factory=Counter)
    examples: dict[str, str] = field(default_factory=dict)
    meshes: int = 0  # meshes considered (engine x tp x pp x cp x ep)

    def prune(self, reason: str, what: str, why: str) -> None:
        self.pruned[reason] += 1
        self.examples.setdefault(reason, f"{what}: {why}")


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def mesh_label(layout: ParallelLayout) -> str:
    degrees = [f"{d} {getattr(layout, d)}" for d in DEGREES if getattr(layout, d) > 1]
    return " ".join([layout.engine, *degrees])


def _layout_reason(exc: ParameterError) -> str:
    """``validate_layout``'s refusals: its arithmetic (a degree or batch that does not divide or split) or a
    combination the engine does not build."""
    text = str(exc)
    return "divisibility" if "does not divide" in text or "does not split" in text else "not built"


def _model_reason(exc: ParameterError) -> str:
    """``check_layout``'s refusals past the layout's own: the model's shape, or a precision the layout lacks."""
    return "not built" if "not built" in str(exc) else "model shape"


def _check_mesh(space: Space, layout: ParallelLayout, spec: dict[str, str | int], adapter: BaseAdapter) -> bool:
    """Whether ``layout`` (no micro-batch yet) may run the model; else why not, counted in ``space``."""
    what = mesh_label(layout)
    if layout.devices % layout.replica_devices:
        space.prune("device count", what, f"tp x pp x cp = {layout.replica_devices} does not divide "
                                          f"{layout.devices} devices")
        return False
    try:
        layout.validate_layout()
    except ParameterError as exc:
        space.prune(_layout_reason(exc), what, str(exc))
        return False
    point = TrainSpec(**spec, **layout.model_dump())
    try:
        check_layout(point)
    except ParameterError as exc:
        space.prune(_model_reason(exc), what, str(exc))
        return False
    why = unsupported_on_device(point, adapter)
    if why:
        space.prune("device", what, why)
        return False
    return True


def _batches(space: Space, layout: ParallelLayout, global_batch: int) -> list[ParallelLayout]:
    """``layout`` at every micro-batch and GAS whose product over dp is ``global_batch``."""
    if global_batch % layout.dp:
        space.prune("global batch", mesh_label(layout), f"global batch {global_batch} does not split over "
                                                        f"dp {layout.dp}")
        return []
    per_replica = global_batch // layout.dp
    out = []
    for mb in divisors(per_replica):
        resolved = layout.model_copy(update={"micro_batch_size": mb, "gas": per_replica // mb})
        try:
            resolved.validate_layout()  # a pipeline's micro-batch must split into its chunks
        except ParameterError as exc:
            space.prune(_layout_reason(exc), f"{mesh_label(layout)}, mb {mb}", str(exc))
            continue
        out.append(resolved)
    return out


def enumerate_space(preset: str, *, devices: int, global_batch: int, seq_len: int, precision: str,
                    adapter: BaseAdapter) -> Space:
    """Every configuration of ``preset`` on ``devices`` that the checks let through (``Space.candidates``,
    memory not yet judged), and the meshes or configurations each check removed. ``adapter``: the system's
    device adapter, asked what its device cannot run."""
    space = Space()
    spec = {"preset": preset, "seq_len": seq_len, "precision": precision}
    degrees = divisors(devices)
    for engine, tp, pp, cp, ep in itertools.product(get_args(Engine), degrees, degrees, degrees, degrees):
        space.meshes += 1
        layout = ParallelLayout(devices=devices, engine=engine, tp=tp, pp=pp, cp=cp, ep=ep,
                                pp_schedule="1f1b" if pp > 1 else "gpipe")
        if not _check_mesh(space, layout, spec, adapter):
            continue
        for resolved in _batches(space, layout, global_batch):
            space.candidates += [Candidate(resolved, ckpt) for ckpt in (False, True)]
    return space


def default_layout(devices: int, global_batch: int, micro_batch_size: int) -> ParallelLayout | None:
    """The system's own default: data parallel (ddp) over every device at the system's micro-batch, its GAS
    making the global batch (where the system's micro-batch does not divide it, the largest that does below it);
    None where the global batch does not split over the devices."""
    if global_batch % devices:
        return None
    per_replica = global_batch // devices
    mb = max(d for d in divisors(per_replica) if d <= micro_batch_size)
    return ParallelLayout(devices=devices, micro_batch_size=mb, gas=per_replica // mb)
