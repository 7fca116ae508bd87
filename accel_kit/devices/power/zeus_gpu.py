"""NVIDIA and AMD GPUs through Zeus's ``ZeusMonitor`` (the optional extra ``accel-kit[energy]``).

Zeus reads NVML's ``nvmlDeviceGetTotalEnergyConsumption`` on NVIDIA GPUs and amdsmi's
``amdsmi_get_energy_count`` on AMD ones, and falls back to integrating sampled power on GPUs
without a counter (NVIDIA before Volta). Zeus is imported when a meter is asked for, not before.
"""
from __future__ import annotations

import time
import warnings

from accel_kit.devices.power.counter import GPU_COUNTER_MIN_WINDOW_S, rated_power
from accel_kit.devices.power.meter import (ENERGY_COUNTER, SAMPLED_POWER, EnergySource, EnergyWindow,
                                           UnavailableMeter, library_version)


class ZeusMeter:
    """One GPU's energy over a window through Zeus's ``ZeusMonitor`` (NVML / amdsmi).

    The device is synchronised by the caller (the adapter), so Zeus is told not to; its index
    is the framework's (after ``CUDA_VISIBLE_DEVICES``), as torch's.
    """

    def __init__(self, monitor, index: int, source: EnergySource):
        self.monitor, self.index, self.source = monitor, index, source
        self._windows = 0
        self._t0 = time.perf_counter()

    @property
    def _key(self) -> str:
        return f"accel-kit-window-{self._windows}"

    def start(self) -> None:
        """Open a Zeus window under a fresh key."""
        self._windows += 1  # a fresh key: a window left open by a failed measurement does not block the next
        self._t0 = time.perf_counter()
        self.monitor.begin_window(self._key, sync_execution=False)

    def poll(self) -> None:
        """Nothing to read: NVML's and amdsmi's counters are 64-bit, no wrap within a run."""

    def stop(self) -> EnergyWindow:
        """Close the Zeus window: this GPU's joules, or None with the reason (no reading, a reset counter)."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Zeus warns on a zero reading; the record says it instead
            try:
                m = self.monitor.end_window(self._key, sync_execution=False)
            except Exception as exc:  # a sampling fallback with no samples, a lost GPU: no figure, say why
                return EnergyWindow(None, time.perf_counter() - self._t0, self.source,
                                    f"zeus could not close the window: {type(exc).__name__}: {exc}")
        energy = m.gpu_energy.get(self.index)
        if energy is None:
            return EnergyWindow(None, m.time, self.source, f"zeus returned no energy for GPU {self.index}")
        if energy < 0:
            return EnergyWindow(None, m.time, self.source,
                                f"the energy counter of GPU {self.index} went backwards ({energy:.3f} J over the window): "
                                "it was reset (a driver reload?)")
        return EnergyWindow(float(energy), m.time, self.source)


def zeus_gpu_meter(index: int, *, api: str) -> UnavailableMeter | ZeusMeter:
    """GPU ``index`` (torch's numbering) through Zeus; ``api`` names the vendor call Zeus makes, for the record."""
    try:
        from zeus.device import get_gpus
        from zeus.monitor import ZeusMonitor
    except ImportError as exc:
        return UnavailableMeter(f"no GPU energy reading: zeus is not installed (pip install 'accel-kit[energy]'), "
                                f"so {api} is not read ({type(exc).__name__}: {exc})")
    try:
        gpus = get_gpus()
        if index >= len(gpus):
            return UnavailableMeter(f"no GPU energy reading: zeus sees {len(gpus)} GPU(s), not GPU {index}")
        monitor = ZeusMonitor(gpu_indices=[index], cpu_indices=[])
        counter = gpus.supports_get_total_energy_consumption(index)
        name = gpus.get_name(index)
    except Exception as exc:  # no driver, no library, no permission: no figure, with the reason
        return UnavailableMeter(f"no GPU energy reading: zeus could not open GPU {index}: {type(exc).__name__}: {exc}")
    rated_w, rated_source = rated_power(
        lambda: gpus.get_power_management_limit_constraints(index)[1] / 1e3,
        "the GPU's maximum power-management limit (zeus get_power_management_limit_constraints)")
    period = getattr(getattr(monitor, "power_monitor", None), "update_period", None)
    source = EnergySource(
        counter=f"{api}, GPU {index} ({name})" if counter else f"power samples of GPU {index} ({name}), no energy counter",
        library=f"zeus {library_version('zeus')} ZeusMonitor", method=ENERGY_COUNTER if counter else SAMPLED_POWER,
        sampling_period_s=None if counter else period, rated_power_w=rated_w, rated_power_source=rated_source,
        min_window_s=GPU_COUNTER_MIN_WINDOW_S)
    return ZeusMeter(monitor, index, source)
