"""The one measurement path of every point kind: preflight -> timed window -> finish.

A kind (a training step, one transformer block) passes in only what differs, as a
``KindMeasurement``; this module does what they share, once:

- **preflight**, before anything is allocated: the kind's fit check against the device's
  memory, then the time budget (the point's FLOPs at the device's best measured matmul rate
  give a lower bound on its time: a point skipped here could not have finished in time);
- **setup**: the kind builds its model and its iteration (it may still decline, e.g. a forced
  attention kernel the device lacks, or a second fit check once the kernel is known);
- **the timed window**: the energy meter opened before the clock (its setup is not timed),
  the machine's load sampled over the meter's window (``accel_kit.machine_load``), peak memory reset, ``accel_kit.timing.measure`` the only clock, a time budget re-checked
  from the first iteration;
- **finish**: times, energy, memory and the machine's load reduced over the ranks (the slowest rank sets the pace of
  a synchronous step), achieved TFLOP/s per device, MFU against the datasheet and against the
  measured peak (``accel_kit.peaks``), energy per unit of work (``accel_kit.energy``).

Outcomes that are the point's own (does not fit, over budget, a non-finite loss, a run that
measured nothing) are results with a status, not exceptions; anything else propagates to the
worker, which records it with its traceback.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import torch
import torch.distributed as dist

from accel_kit import energy, machine_load, peaks
from accel_kit.engine.result import Result
from accel_kit.engine.step import NonFiniteLoss, NotMeasured
from accel_kit.results import Status
from accel_kit.timing import OverBudget, Timing, measure

if TYPE_CHECKING:
    from accel_kit.devices.base import BaseAdapter
    from accel_kit.devices.power import EnergyWindow
    from accel_kit.json_types import JSONObject, JSONValue
    from accel_kit.engine.point import Point

GiB = 2**30


@dataclass
class Context:
    """What every measurement in a worker process shares: one adapter, its device, the ranks."""

    adapter: BaseAdapter
    device: torch.device
    rank: int = 0
    world: int = 1
    local_rank: int = 0


@dataclass
class Window:
    """What a kind's timed window runs: one iteration, how often, and around what."""

    iteration: Callable[[], object]
    warmup: int
    trials: int
    extra_iterations: int = 0  # run by the kind after the window (counted in the time budget)
    noisy_cv: float | None = None  # None: timing's default
    # entered around the window
    context: contextlib.AbstractContextManager[object] = dataclasses.field(default_factory=contextlib.nullcontext)


class KindMeasurement:
    """The parts of one point kind's measurement that differ; ``run`` calls them in this order.

    ``base`` holds the metrics known before the run (shape, FLOPs); ``out`` the result's other
    fields (env, model). Each step may return a finished ``Result`` (a status other than ok) to stop.
    """

    work: str | None = None  # what the energy figure counts ("tokens", "flops")

    def __init__(self, point: Point, ctx: Context, *, tf32: bool = False):
        from accel_kit import results

        self.point, self.ctx, self.tf32 = point, ctx, tf32
        # TF32 (or the device's reduced-precision fp32 matmul) allowed or not before anything runs, and
        # recorded as it is (the env's math mode); it also picks the datasheet peak to compare with.
        ctx.adapter.set_tf32(tf32)
        self.base: JSONObject = {}
        self.out: JSONObject = {"env": results.environment(ctx.adapter)}

    @property
    def device_model(self) -> str | None:
        return (self.out["env"].get("device") or {}).get("model")

    def fit(self) -> Result | None:
        """Before anything is allocated: a result when the point cannot fit the device; None if it may."""
        return None

    def total_flops(self) -> float | None:
        """Everything the point will compute (warm-up and extra iterations included), for the time budget."""
        return None

    def setup(self) -> Window | Result:
        """Build the model and the iteration; or a result when the point turns out not to run."""
        raise NotImplementedError

    def after_window(self, timing: Timing) -> None:
        """Work after the timed window that belongs to the point (e.g. dense fine-tuning steps)."""

    def metrics(self, timing: Timing, mem_bytes: int | None) -> tuple[dict, float, float]:
        """(the kind's metrics, achieved TFLOP/s per device, the amount of ``work`` in the timed window)."""
        raise NotImplementedError

    def summary(self, metrics: dict) -> str:
        return "ok"

    def result(self, status: Status, reason: str | None = None, **metrics: JSONValue) -> Result:
        """A result of this point with a status other than a measurement (does not fit, skipped...)."""
        return Result(**self.out, status=status, reason=reason, metrics=self.base | metrics)


def run(m: KindMeasurement) -> Result:
    """Measure one point through the shared path; its result (status, metrics, times, env)."""
    point, ctx = m.point, m.ctx
    early = m.fit() or _over_budget(m)
    if early is not None:
        return early
    window = m.setup()
    if isinstance(window, Result):
        return window
    # opened now: its setup (a library, a handle) is not timed; the machine's load is sampled over its window
    meter = machine_load.LoadMeter(ctx.adapter.energy_meter(ctx.local_rank))
    kwargs = {} if window.noisy_cv is None else {"noisy_cv": window.noisy_cv}
    try:
        ctx.adapter.reset_peak_memory()
        with window.context:
            timing = measure(window.iteration, ctx.adapter.synchronize, warmup=window.warmup, trials=window.trials,
                             budget_s=point.time_budget_s, extra_iterations=window.extra_iterations, meter=meter,
                             **kwargs)
            m.after_window(timing)
        mem = ctx.adapter.peak_memory_bytes()
    except NonFiniteLoss as exc:
        return m.result("error", str(exc), nonfinite_step=exc.step)
    except NotMeasured as exc:  # ran as asked (e.g. compile only) but measured nothing
        return m.result(exc.status, exc.reason)
    except OverBudget as exc:
        return m.result("skipped", f"over the time budget: {exc}", time_estimate_s=exc.estimate_s)
    return _finish(m, timing, mem, meter)


def _finish(m: KindMeasurement, timing: Timing, mem: int | None, meter: machine_load.LoadMeter) -> Result:
    point, ctx = m.point, m.ctx
    where = ctx.adapter.collective_device(ctx.device)
    window_energy = reduce_energy(timing.energy, where, ctx.world, ctx.local_rank)
    load = machine_load.point_fields(meter.before, meter.after, where, ctx.world, ctx.rank, ctx.local_rank)
    times = reduce_max(timing.times_s, where, ctx.world)
    m.out["env"]["hosts"] = gather_hosts(ctx.world)  # (every rank is here: the collectives above met)
    if mem is not None:
        mem = int(reduce_max([float(mem)], where, ctx.world)[0])
    timing = Timing(times_s=times, warmup_times_s=timing.warmup_times_s, noisy_cv=timing.noisy_cv)
    kind_metrics, achieved_tflops, work_amount = m.metrics(timing, mem)
    metrics = m.base | timing.summary() | {
        # (above 100 % of a datasheet peak is a bug: raises, and the point is an error)
        **peaks.mfu_metrics(achieved_tflops, m.device_model, point.precision, point.peak, tf32=m.tf32),
        "mem_peak_gib": mem / GiB if mem is not None else None,
    } | load | kind_metrics  # last: a runtime's own figures (e.g. cstorch's) are the kind's to set
    timed = {"times_s": times, "warmup_times_s": timing.warmup_times_s}
    try:  # every device's energy over the timed window, against the work it did
        metrics |= energy.energy_fields(window_energy, work=m.work, amount=work_amount)
    except energy.ImplausibleEnergy as exc:
        return Result(**m.out, **timed, status="error", reason=f"implausible energy reading: {exc}",
                      metrics=metrics | energy.null_fields(str(exc), m.work))
    return Result(**m.out, **timed, status="ok", metrics=metrics, summary=m.summary(metrics))


def _over_budget(m: KindMeasurement) -> Result | None:
    flops = m.total_flops()
    why = None if flops is None else over_budget_before_start(m.point, m.ctx.adapter, flops)
    return m.result("skipped", why) if why else None


def over_budget_before_start(point: Point, adapter: BaseAdapter, flops: float) -> str | None:
    """Why the point cannot meet its time budget even at the device's best matmul rate; None if it may.

    ``flops``: everything the point will compute. The rate is the run's measured peak, else the
    adapter's precision probe; at that rate the estimate is a lower bound, so a point skipped
    here could not have finished in time.
    """
    if point.time_budget_s is None:
        return None
    if point.peak:
        tflops, source = point.peak["tflops"], "the measured matmul peak"
    else:
        gflops = adapter.precision_support(point.precision).gflops
        if gflops is None:
            return None
        tflops, source = gflops / 1e3, "the precision probe's matmul rate"
    estimate_s = flops / (tflops * 1e12)
    if estimate_s <= point.time_budget_s:
        return None
    return (f"over the time budget: at least {estimate_s:.0f} s ({flops:.3g} FLOPs at {tflops:.4f} TFLOP/s, "
            f"{source}) against a budget of {point.time_budget_s:.0f} s")


def reduce_max(values: list[float], device: torch.device, world: int) -> list[float]:
    """Each value's maximum over the ranks (a synchronous step is as slow as its slowest rank)."""
    if world == 1:
        return values
    # float32: not every accelerator has float64 (seconds and bytes keep 7 significant digits).
    t = torch.tensor(values, dtype=torch.float32, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def gather_hosts(world: int) -> list[str]:
    """The hosts the point's ranks ran on, sorted, each once (the record's ``host`` is rank 0's alone)."""
    if world == 1:
        return [socket.gethostname()]
    hosts: list[str | None] = [None] * world
    dist.all_gather_object(hosts, socket.gethostname())
    return sorted(set(filter(None, hosts)))


def reduce_energy(window: EnergyWindow | None, device: torch.device, world: int,
                  local_rank: int) -> EnergyWindow | None:
    """The point's energy over all ranks: each device's counted once (a host's shared counter by its local rank 0)."""
    if world == 1 or window is None:
        return window
    source = window.source
    shared = source is not None and source.scope == "host"
    counts = not (shared and local_rank != 0)  # a host counter is summed once per host
    nan = float("nan")
    mine = [window.energy_j if window.energy_j is not None else nan,
            (source.rated_power_w or nan) if source is not None else nan]
    t = torch.tensor(mine if counts else [0.0, 0.0], dtype=torch.float32, device=device)  # float32: Gaudi has no float64
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    total_j, rated_w = t.tolist()
    window_s = reduce_max([window.window_s], device, world)[0]
    if source is not None:
        where = "hosts" if shared else "ranks"
        source = dataclasses.replace(source, counter=f"{source.counter}, summed over the point's {where}",
                                     rated_power_w=None if math.isnan(rated_w) else rated_w)
    if math.isnan(total_j):
        reason = window.reason if window.energy_j is None else "another rank had no energy reading"
        return dataclasses.replace(window, energy_j=None, window_s=window_s, source=source,
                                   reason=reason or "a rank had no energy reading")
    return dataclasses.replace(window, energy_j=total_j, window_s=window_s, source=source)
