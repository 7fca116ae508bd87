"""What every energy reader returns: the meter protocol, the window's figure and its source.

An ``EnergyMeter`` is started after the warm-up, polled after each timed trial and stopped
after the last one; ``stop`` gives an ``EnergyWindow``: joules, or None with the reason (never
a zero standing in for "not read"), and the ``EnergySource`` it was read from, recorded with it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Literal, Protocol, runtime_checkable

from accel_kit.devices._vendor import package_version

ENERGY_COUNTER = "energy_counter"  # a cumulative counter read at both ends of the window
SAMPLED_POWER = "sampled_power"  # power samples integrated over the window
Method = Literal["energy_counter", "sampled_power"]


@dataclass(frozen=True)
class EnergySource:
    """What an energy figure was read from, recorded with it."""

    counter: str  # the counter or call, and which device or zones
    library: str  # the library (with its version) or interface that read it
    method: Method
    sampling_period_s: float | None = None  # sampled power: the sampling period; a counter: None
    scope: Literal["device", "host"] = "device"  # host: one reading for the whole node (a CPU package)
    rated_power_w: float | None = None  # the device's power limit, for the plausibility check; None: unknown
    rated_power_source: str = ""
    min_window_s: float = 0.0  # shorter windows are too coarse for this counter to be recorded

    def describe(self) -> str:
        """One line for the record's ``energy_source``."""
        how = "energy counter" if self.method == ENERGY_COUNTER else f"sampled power every {self.sampling_period_s} s"
        return f"{self.counter}; {self.library}; {how}"


@dataclass(frozen=True)
class EnergyWindow:
    """The energy of one timed window: joules, or None and ``reason``."""

    energy_j: float | None
    window_s: float
    source: EnergySource | None = None  # None: nothing could be read on this device
    reason: str | None = None  # why energy_j is None

    def without_energy(self, reason: str) -> "EnergyWindow":
        """The same window with no figure, and ``reason`` for it."""
        return replace(self, energy_j=None, reason=reason)


@runtime_checkable
class EnergyMeter(Protocol):
    """Reads a device's energy over one window: ``start``, ``poll`` after each trial, ``stop``."""

    source: EnergySource | None

    def start(self) -> None:
        """Open the window (the device idle: the caller synchronised it)."""

    def poll(self) -> None:
        """Read counters that can wrap (between trials, outside the timed region)."""

    def stop(self) -> EnergyWindow:
        """Close the window (the device idle) and return its energy."""


class UnavailableMeter:
    """The device exposes no energy reading here: every window is None with ``reason``."""

    source = None

    def __init__(self, reason: str):
        self.reason = reason
        self._t0 = time.perf_counter()

    def start(self) -> None:
        """Open the window: only its length is measured."""
        self._t0 = time.perf_counter()

    def poll(self) -> None:
        """Nothing to read."""

    def stop(self) -> EnergyWindow:
        """The window's length, no figure, and the reason."""
        return EnergyWindow(None, time.perf_counter() - self._t0, None, self.reason)


def library_version(*dists: str) -> str:
    """The installed version of the first of ``dists`` found (read without importing it), for the source's library."""
    return package_version(*dists) or "(version unknown)"
