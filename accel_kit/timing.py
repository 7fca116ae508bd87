"""Timing: the one place clocks are read.

Rules: synchronise the device before *and* after the timed work (queued
asynchronous kernels would otherwise be charged to the wrong iteration or to none), time
warm-up iterations (which include compilation, autotuning, allocator growth) but report
them apart, keep every per-trial time, and summarise with robust statistics (median and
inter-quartile range) rather than the mean.
"""
from __future__ import annotations

import contextlib
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Protocol

if TYPE_CHECKING:
    import torch

# A point whose trials vary more than this (coefficient of variation) is flagged noisy.
DEFAULT_NOISY_CV = 0.05


class EnergyMeter(Protocol):
    """What ``measure`` calls of an energy meter around its timed trials (``accel_kit.devices.power.EnergyMeter``,
    whose ``stop`` returns an ``EnergyWindow``: this leaf module names no device type)."""

    def start(self) -> None: ...

    def poll(self) -> None: ...

    def stop(self) -> object: ...


class EventSource(Protocol):
    """What a ``Timeline`` reads of a device adapter (``accel_kit.devices.base.BaseAdapter`` is one)."""

    def synchronize(self) -> None: ...

    def timing_event(self) -> torch.Event | None: ...


# The latency percentiles every kind of inference point records (generation's TTFT and TPOT, serving's
# TTFT, TPOT, ITL and end-to-end latency): MLPerf Inference judges at the 99th.
PERCENTILES = (50, 90, 99)


def percentiles(values, prefix: str) -> dict[str, float | None]:
    """``{prefix}_p50_s``, ``_p90_s``, ``_p99_s`` of ``values`` in seconds (linear interpolation, numpy's
    default; None values dropped); each None where no value is left."""
    import numpy as np

    arr = np.asarray([v for v in values if v is not None], dtype=float)
    return {f"{prefix}_p{q}_s": (float(np.percentile(arr, q)) if arr.size else None) for q in PERCENTILES}


def iqr(values) -> tuple[float, float] | None:
    """The first and third quartiles of ``values`` (None and NaN left out); None for fewer than 2 values.
    The one quartile rule: a record's ``time_iqr_s`` and a table's spread (``accel_kit.noise``) both use it."""
    values = [float(v) for v in values if v is not None and not math.isnan(float(v))]
    if len(values) < 2:
        return None
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[0], q[2]


@dataclass
class Timing:
    """Per-trial times of one measured point, and their summary. All times in seconds."""

    times_s: list[float]
    warmup_times_s: list[float] = field(default_factory=list)
    noisy_cv: float = DEFAULT_NOISY_CV
    energy: object = None  # the meter's reading over the timed trials (accel_kit.devices.power.EnergyWindow)

    def __post_init__(self) -> None:
        if not self.times_s:
            raise ValueError("a Timing needs at least one timed trial")

    @property
    def median_s(self) -> float:
        return statistics.median(self.times_s)

    @property
    def mean_s(self) -> float:
        return statistics.fmean(self.times_s)

    @property
    def min_s(self) -> float:
        return min(self.times_s)

    @property
    def iqr_s(self) -> float:
        """Inter-quartile range (0 for fewer than 2 trials)."""
        quartiles = iqr(self.times_s)
        return quartiles[1] - quartiles[0] if quartiles else 0.0

    @property
    def cv(self) -> float:
        """Coefficient of variation: sample standard deviation / mean (0 for one trial)."""
        if len(self.times_s) < 2:
            return 0.0
        return statistics.stdev(self.times_s) / self.mean_s

    @property
    def noisy(self) -> bool:
        return self.cv > self.noisy_cv

    @property
    def warmup_total_s(self) -> float:
        return sum(self.warmup_times_s)

    def summary(self) -> dict:
        """Flat dict for a result record (units in the names)."""
        return {
            "time_median_s": self.median_s,
            "time_mean_s": self.mean_s,
            "time_min_s": self.min_s,
            "time_iqr_s": self.iqr_s,
            "time_cv": self.cv,
            "noisy": self.noisy,
            "trials": len(self.times_s),
            "warmup_total_s": self.warmup_total_s,
        }


class Stopwatch:
    """Seconds spent inside one kind of region of each step (e.g. a gradient all-reduce the engine issues
    itself), synchronised on both sides like every other clock here: ``times_s`` holds one total per step.
    """

    def __init__(self, synchronize: Callable[[], None]):
        self.synchronize = synchronize
        self.times_s: list[float] = []
        self.regions = 0  # regions timed so far (none: nothing of the kind ran)
        self._open = 0.0

    @contextlib.contextmanager
    def region(self):
        self.synchronize()  # the work queued before (the backward) is not charged to the region
        self.regions += 1
        start = time.perf_counter()
        try:
            yield
        finally:
            self.synchronize()
            self._open += time.perf_counter() - start

    def end_step(self) -> None:
        """Close the current step's total (zero where no region ran)."""
        self.times_s.append(self._open)
        self._open = 0.0


class Timeline:
    """Times between marks set while work is queued, read with one synchronisation at the end.

    Where ``Stopwatch`` synchronises on both sides of every region (right for a step whose parts must not
    overlap), a loop of short steps (a decode step: a few milliseconds of kernels) would then wait for the
    device at every step and time that wait too. Here each ``mark()`` records a device event in the stream
    (``new_event``: the adapter's ``timing_event``), the steps queue back to back, and ``intervals_s()``
    synchronises once and reads the events' elapsed times. A device without events (a CPU runs each
    operation before returning) gives None for ``new_event``: each mark then reads the host clock.
    """

    def __init__(self, synchronize: Callable[[], None], new_event: Callable[[], torch.Event] | None = None,
                 clock: Callable[[], float] = time.perf_counter):
        self.synchronize = synchronize
        self.new_event = new_event
        self.clock = clock
        self.marks: list[float | torch.Event] = []

    @classmethod
    def of(cls, adapter: EventSource) -> "Timeline":
        """A timeline on the device adapter's events, or on the host clock where it has none."""
        return cls(adapter.synchronize, adapter.timing_event if adapter.timing_event() is not None else None)

    def mark(self) -> None:
        """The boundary between two steps (and before the first, after the last)."""
        if self.new_event is None:
            self.marks.append(self.clock())
            return
        event = self.new_event()
        event.record()
        self.marks.append(event)

    def intervals_s(self) -> list[float]:
        """Seconds between consecutive marks; synchronises the device once (the last mark's work done)."""
        self.synchronize()
        if self.new_event is None:
            return [b - a for a, b in zip(self.marks, self.marks[1:])]
        return [a.elapsed_time(b) / 1e3 for a, b in zip(self.marks, self.marks[1:])]  # events count ms


class OverBudget(RuntimeError):
    """The first iteration says the whole measurement would exceed its time budget."""

    def __init__(self, estimate_s: float, budget_s: float, first_s: float, iterations: int,
                 second_s: float | None = None):
        how = (f"{iterations} iterations at {first_s:.2f} s, the first one's time" if second_s is None else
               f"the first iteration {first_s:.2f} s, the {iterations - 1} others at {second_s:.2f} s, the second's")
        super().__init__(f"estimated {estimate_s:.0f} s ({how}) exceeds the time budget of {budget_s:.0f} s")
        self.estimate_s, self.budget_s = estimate_s, budget_s


def _check_budget(times_s: list[float], iterations: int, budget_s: float, *, last: bool) -> None:
    """After the first iteration, and the second where the first alone says over: raise OverBudget when
    the whole measurement's estimate exceeds ``budget_s``.

    The first iteration carries one-time costs (lazy initialisation, allocator growth, compilation), and
    on a busy machine the first of a short step was seen at 15x the rest (0.9 s against 0.06 s: a
    two-minute estimate for a ten-second point). So a point is skipped on the first iteration alone only
    where no second follows it here (``last``); otherwise the second, one iteration more, estimates the rest.
    """
    first = times_s[0]
    if len(times_s) == 1:
        if first * iterations > budget_s and last:
            raise OverBudget(first * iterations, budget_s, first, iterations)
        return
    estimate = first + times_s[1] * (iterations - 1)
    if estimate > budget_s:
        raise OverBudget(estimate, budget_s, first, iterations, second_s=times_s[1])


def measure(fn: Callable[[], object], synchronize: Callable[[], None], *,
            warmup: int = 2, trials: int = 5, noisy_cv: float = DEFAULT_NOISY_CV,
            on_trial: Callable[[int, float], None] | None = None,
            budget_s: float | None = None, extra_iterations: int = 0, meter: EnergyMeter | None = None) -> Timing:
    """Time ``fn`` (one iteration of the work) ``trials`` times after ``warmup`` untimed-for-results runs.

    Args:
        fn: runs one iteration; its return value is ignored.
        synchronize: blocks until the device is idle (the adapter's ``synchronize``).
        warmup: iterations run first (compile, autotune); their times are kept apart.
        trials: timed iterations; each is synchronised on both sides.
        on_trial: called with (trial index, seconds) after each timed trial (progress bars).
        budget_s: after the first iteration, the whole measurement (warm-up, trials and
            ``extra_iterations`` run by the caller afterwards) is estimated from its time, and where
            that exceeds the budget, again after the second (``_check_budget``); OverBudget is raised
            when the estimate exceeds the budget.
        meter: an energy meter (the adapter's ``energy_meter``): started after the warm-up with the
            device idle, polled after each trial (outside its timed region, so counters that wrap
            are read often enough), stopped after the last trial's closing synchronisation.
    Returns:
        Timing with per-trial and warm-up times, and the meter's reading as ``energy``.
    Raises:
        OverBudget: the estimate from the first iteration (and the second) exceeds ``budget_s``.
    """
    if trials < 1:
        raise ValueError(f"trials must be >= 1, got {trials}")
    warmup_times: list[float] = []
    times: list[float] = []
    judging = False
    for i in range(warmup + trials):
        if i == warmup and meter is not None:
            synchronize()  # the warm-up's queued work is not charged to the window
            meter.start()
        elapsed = _timed(fn, synchronize)
        if budget_s is not None and (i == 0 or (i == 1 and judging)):
            seen = [*warmup_times, *times, elapsed][:2]
            iterations = warmup + trials + extra_iterations
            _check_budget(seen, iterations, budget_s, last=warmup + trials == 1)
            # a first iteration over budget is judged again with the second (one iteration more, at most)
            judging = i == 0 and seen[0] * iterations > budget_s
        if i < warmup:
            warmup_times.append(elapsed)
            continue
        times.append(elapsed)
        if meter is not None and len(times) < trials:
            meter.poll()
        if on_trial is not None:
            on_trial(i - warmup, elapsed)
    energy = meter.stop() if meter is not None else None  # after the last trial's closing synchronisation
    return Timing(times_s=times, warmup_times_s=warmup_times, noisy_cv=noisy_cv, energy=energy)


def _timed(fn: Callable[[], object], synchronize: Callable[[], None]) -> float:
    synchronize()  # nothing queued before the clock starts
    start = time.perf_counter()
    fn()
    synchronize()  # everything fn queued has finished before the clock stops
    return time.perf_counter() - start
