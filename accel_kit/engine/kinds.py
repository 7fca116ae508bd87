"""The registry of point kinds: each kind's point type, measurement, check, metrics and preload, in one place.

A kind registers itself in its own module with one call, ``register_kind``: its point type (a
``Point`` subclass, ``accel_kit.engine.point``), its measurement (usually a ``KindMeasurement``
run through ``accel_kit.engine.measurement.run``), the adapter's answer on whether the device can
run it, the metrics it adds to the record schema (``accel_kit.metrics``) and the modules the fork
server should import before forking its points. The worker, the sweep runner and the fork server
ask this registry and name no kind.

Where a kind's module is found: the built-in kinds' modules are the one line ``KIND_MODULES``; a
kind named ``"module:Name"`` (a kind defined outside accel_kit, e.g. the runner's tests' fault-
injecting points) is registered by importing ``module``. So adding a kind is its module and one
line in ``KIND_MODULES`` (or none, for a ``module:Name`` kind); ``docs/engine.md`` says how.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Generic, Protocol, TypeVar

from accel_kit.engine.point import Point
from accel_kit.engine.result import Result
from accel_kit.errors import ParameterError
from accel_kit.json_types import JSONObject
from accel_kit.metrics import Metric, declare

if TYPE_CHECKING:
    from accel_kit.devices.base import BaseAdapter
    from accel_kit.engine.measurement import Context

P = TypeVar("P", bound=Point)

# The built-in kinds: name -> the module that registers it (imported when a point of the kind is first met).
KIND_MODULES: dict[str, str] = {
    "train": "accel_kit.engine.train_measure",
    "block": "accel_kit.engine.block_measure",
    "peak": "accel_kit.engine.peak_measure",
    "bandwidth": "accel_kit.engine.peak_measure",
    "generate": "accel_kit.engine.generate_measure",
    "serve": "accel_kit.engine.serve_measure",
}


def adapter_check(adapter: "BaseAdapter", point: Point) -> str | None:
    """The adapter's answer for any kind: its ``unsupported(kind, point)`` (``accel_kit.devices.base``)."""
    return adapter.unsupported(point.kind, point)


class PointRunner(Protocol):
    """What measures a kind's points in the sweep runner's own process rather than a worker process per point: the
    sweep hands it its points of the kind in order (``measure``, after its own resume and frontier checks) and
    records each result, then ``close``s it after the last, an interruption included, so that what consecutive
    points shared (the serve kind's server) is freed."""

    def measure(self, point: Point) -> Result: ...

    def close(self) -> None: ...


# Makes a kind's ``PointRunner`` for one sweep: (a scratch folder beside the sweep's records, the sweep's limit on
# one point in seconds) -> the runner.
RunnerFactory = Callable[[Path, float], PointRunner]


@dataclass(frozen=True)
class KindSpec(Generic[P]):
    """One point kind: how its points are typed, measured and checked, and what they add."""

    name: str
    point_cls: type[P]
    measure: Callable[[P, "Context"], Result]
    # (adapter, point) -> why the device's programming model cannot run it, or None
    unsupported: Callable[["BaseAdapter", P], str | None] = adapter_check
    metrics: tuple[Metric, ...] = ()  # the kind's own metrics, beyond those accel_kit.metrics declares
    preload: tuple[str, ...] = ()  # modules every point of the kind imports (the fork server's, before forking)
    # None: the sweep runs each point in a worker process of its own (``accel_kit.engine.sweep.run_worker``).
    runner: RunnerFactory | None = None

    def preload_for(self, point: P) -> tuple[str, ...]:
        """What the fork server imports before forking ``point``: the kind's module, its preload, the point's own."""
        return (KIND_MODULES.get(self.name, self.name.partition(":")[0]), *self.preload, *point.preload_modules())


# Any: each entry is the spec of its own point class (a KindSpec[TrainPoint], a KindSpec[BlockPoint], ...).
_KINDS: dict[str, KindSpec[Any]] = {}


def register_kind(name: str, point_cls: type[P], measure: Callable[[P, "Context"], Result], *,
                  unsupported: Callable[["BaseAdapter", P], str | None] = adapter_check,
                  metrics: tuple[Metric, ...] = (), preload: tuple[str, ...] = (),
                  runner: RunnerFactory | None = None) -> KindSpec[P]:
    """Register a point kind (called once, by the kind's own module); its metrics join the record schema.
    ``runner``: where the sweep measures the kind's points in its own process (``PointRunner``)."""
    if name in _KINDS and _KINDS[name].point_cls is not point_cls:
        raise ValueError(f"point kind {name!r} registered twice, by {_KINDS[name].point_cls} and {point_cls}")
    if point_cls.model_fields["kind"].default != name:
        raise ValueError(f"{point_cls.__name__}.kind defaults to {point_cls.model_fields['kind'].default!r}, "
                         f"not its registered name {name!r}")
    declare(*metrics)
    spec = KindSpec(name, point_cls, measure, unsupported, tuple(metrics), tuple(preload), runner)
    _KINDS[name] = spec
    return spec


def spec(name: str) -> KindSpec[Any]:
    """The kind ``name``: registered already, or by importing its module (``KIND_MODULES``, or the module of
    a ``module:Name`` kind). Raises ParameterError for a kind no module registers."""
    if name not in _KINDS:
        module = KIND_MODULES.get(name) or (name.partition(":")[0] if ":" in name else None)
        if module is None:
            raise ParameterError(f"unknown point kind {name!r}; known: {', '.join(KIND_MODULES)} "
                                 "(or a 'module:Name' kind whose module registers it)")
        loaded = importlib.import_module(module)
        if name not in _KINDS:
            _register_self_measuring(name, getattr(loaded, name.partition(":")[2], None))
    return _KINDS[name]


def _register_self_measuring(name: str, cls: object) -> None:
    """A ``module:Class`` kind whose module registers nothing, but whose point class measures itself
    (``measure(ctx)``, returning a ``Result`` or its fields): registered as such, runnable anywhere."""
    if not (isinstance(cls, type) and issubclass(cls, Point) and callable(getattr(cls, "measure", None))):
        raise ParameterError(f"point kind {name!r}: its module registers no such kind, and names no Point "
                             "class with a measure(ctx) of its own")

    def measure(point: Point, ctx: "Context") -> Result:
        out = point.measure(ctx)
        return out if isinstance(out, Result) else Result.model_validate(out)

    register_kind(name, cls, measure, unsupported=lambda adapter, point: None)


def kind_of(point: Point) -> KindSpec[Any]:
    return spec(point.kind)


def point_classes() -> dict[str, type[Point]]:
    """Every built-in kind's point type (and any registered since), by kind name."""
    for name in KIND_MODULES:
        spec(name)
    return {name: s.point_cls for name, s in _KINDS.items()}


def load_point(fields: JSONObject) -> Point:
    """The point of its ``kind`` from its fields (a worker's point file)."""
    return spec(fields["kind"]).point_cls.model_validate(fields)
