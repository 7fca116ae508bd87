"""The counter algorithm: energy over a window from cumulative counters, read at its ends and between trials.

A reading below the previous one is a wrap where the counter has a range and a reset (a driver
reload) otherwise; a wrapping counter read less often than its range lasts at the rated power
could have wrapped twice unseen. The vendor readers (RAPL, NVML, HLML) give a ``Counter`` per
device or zone and the rated power they read; ``CounterMeter`` does the rest.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from accel_kit.devices.power.meter import EnergySource, EnergyWindow

# A counter that updates every ~20-100 ms (NVML's, by public accounts; HLML's is not documented) is within
# about 10 % only over a window of at least ten updates: shorter windows are not recorded.
GPU_COUNTER_MIN_WINDOW_S = 1.0
# A counter that wraps is read after every trial; a trial long enough to hold a whole wrap range at this
# multiple of the rated power could hide a second wrap.
WRAP_SAFETY = 1.5


@dataclass(frozen=True)
class Counter:
    """One cumulative energy counter: ``read_j`` in joules; ``wrap_j``: where it wraps to 0 (None: never);
    ``rated_w``: the power limit of what it measures (None: the source's)."""

    name: str
    read_j: Callable[[], float]
    wrap_j: float | None = None
    rated_w: float | None = None


class CounterMeter:
    """Energy over a window from cumulative counters (summed), with wrap-around and resets handled.

    Each counter is read at the start, after every trial (``poll``) and at the stop, and the
    differences are summed. A reading below the previous one is a wrap where the counter has a
    range (the difference plus the range is added) and a reset otherwise (a driver reload: the
    window has no figure). A wrapping counter polled less often than its range lasts at the
    device's rated power could have wrapped twice unseen: that window has no figure either.
    """

    def __init__(self, counters: list[Counter], source: EnergySource, clock: Callable[[], float] = time.perf_counter):
        self.counters, self.source, self.clock = counters, source, clock
        self._last: list[float] = []
        self._total_j = 0.0
        self._problem: str | None = None
        self._t0 = self._t_last = 0.0

    def start(self) -> None:
        """Open the window: every counter read once."""
        self._t0 = self._t_last = self.clock()
        self._last = [c.read_j() for c in self.counters]
        self._total_j, self._problem = 0.0, None

    def poll(self) -> None:
        """Read every counter and add its increase since the last reading (a wrap added back, a reset noted)."""
        now = self.clock()
        values = [c.read_j() for c in self.counters]
        for counter, before, after in zip(self.counters, self._last, values):
            delta = after - before
            if counter.wrap_j is not None:
                rated = counter.rated_w or self.source.rated_power_w
                if rated and (now - self._t_last) * rated * WRAP_SAFETY >= counter.wrap_j and not self._problem:
                    self._problem = (f"{counter.name} was read {now - self._t_last:.0f} s apart, long enough at "
                                     f"{WRAP_SAFETY} x the rated {rated:.0f} W to wrap its {counter.wrap_j:.0f} J "
                                     "range more than once unseen")
                if delta < 0:
                    delta += counter.wrap_j
            elif delta < 0 and not self._problem:
                self._problem = (f"{counter.name} went backwards ({before:.3f} J to {after:.3f} J) during the window: "
                                 "the counter was reset (a driver reload?)")
            self._total_j += delta
        self._last, self._t_last = values, now

    def stop(self) -> EnergyWindow:
        """Close the window: the summed energy, or None with the reason (a reset, a possible second wrap)."""
        self.poll()
        window_s = self._t_last - self._t0
        if self._problem:
            return EnergyWindow(None, window_s, self.source, self._problem)
        return EnergyWindow(self._total_j, window_s, self.source)


def rated_power(read_w: Callable[[], float], what: str) -> tuple[float | None, str]:
    """The rated power in watts from ``read_w`` and ``what`` it is, or None and why where it cannot be read
    (the window is then recorded with its upper bound unchecked)."""
    try:
        return read_w(), what
    except Exception as exc:  # an old driver, a virtual device, no permission: no bound, and the record says so
        return None, f"power limit not readable ({type(exc).__name__}): upper bound not checked"
