"""Point kinds and their measurements: the one table that maps a point's kind to how it is measured.

Points (``accel_kit.engine.point``) are data; this table gives each kind its measurement (a
``KindMeasurement`` run through the shared path of ``accel_kit.engine.measurement``, or a
function of its own where the path does not apply) and the adapter's check of whether the
device's programming model can run it at all. So no adapter switches on a kind's name: each
answers ``unsupported_train``, ``unsupported_block`` and ``unsupported_peak`` (and, for a training point's
layout, what ``accel_kit.engine.layout.unsupported_on_device`` asks it).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from accel_kit.engine import measurement
from accel_kit.engine.block_measure import BlockMeasurement
from accel_kit.engine.layout import unsupported_on_device
from accel_kit.engine.measurement import Context
from accel_kit.engine.train_measure import TrainMeasurement


def measure_peak(point: Any, ctx: Context) -> dict:
    """A matmul peak: many products, each timed by ``accel_kit.timing`` (its own path: no FLOPs of one
    workload, no MFU, no energy window), the best rate kept."""
    from accel_kit.peaks import measure_matmul_peak

    return {"status": "ok", "peak": measure_matmul_peak(ctx.adapter, point.precision,
                                                        shapes=tuple(map(tuple, point.shapes))).to_dict()}


@dataclass(frozen=True)
class Kind:
    """How points of one kind are measured, and which adapter check says whether they can run."""

    measure: Callable[[Any, Context], dict]
    unsupported: Callable[[Any, Any], str | None]  # (adapter, point) -> why not, or None


KINDS: dict[str, Kind] = {
    "train": Kind(lambda point, ctx: measurement.run(TrainMeasurement(point, ctx)),
                  lambda adapter, point: adapter.unsupported_train(point) or unsupported_on_device(point, adapter)),
    "block": Kind(lambda point, ctx: measurement.run(BlockMeasurement(point, ctx)),
                  lambda adapter, point: adapter.unsupported_block(point)),
    "peak": Kind(measure_peak, lambda adapter, point: adapter.unsupported_peak(point)),
}


def kind_of(point: Any) -> Kind:
    """The point's kind; a point kind defined elsewhere (a "module:Class" kind, e.g. the runner's fault-injecting
    test points) brings its own ``measure(ctx)`` and runs anywhere."""
    known = KINDS.get(point.kind)
    if known is not None:
        return known
    return Kind(lambda p, ctx: p.measure(ctx), lambda adapter, p: None)
