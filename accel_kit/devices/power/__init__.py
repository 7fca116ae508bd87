"""Energy readers: a device's energy counter, read over exactly the timed window of a point.

An adapter's ``energy_meter(index)`` returns an ``EnergyMeter``; ``accel_kit.timing.measure``
starts it after the warm-up (the device idle), polls it after each timed trial and stops it
after the last one, so the reading covers the timed trials and nothing else. The window's
figure is an ``EnergyWindow``: joules, or None with the reason; never a zero standing in
for "not read".

The parts:

- ``meter``: the types every reader returns (``EnergyMeter``, ``EnergySource``, ``EnergyWindow``,
  ``UnavailableMeter``);
- ``counter``: the counter algorithm (``Counter``, ``CounterMeter``: a cumulative counter read
  around the window, wrap-around, resets, the rated power);
- one module per reader, each the smallest that covers its device:

  - ``zeus_gpu.zeus_gpu_meter``: NVIDIA GPUs (NVML's ``nvmlDeviceGetTotalEnergyConsumption``) and AMD
    GPUs (amdsmi's ``amdsmi_get_energy_count``) through Zeus's ``ZeusMonitor`` (the optional extra
    ``accel-kit[energy]``), which also falls back to integrating sampled power on GPUs without a
    counter (NVIDIA before Volta);
  - ``nvml.nvml_meter``: the same NVIDIA counter through NVIDIA's ``nvidia-ml-py`` alone, where Zeus
    is not installed;
  - ``rapl.rapl_meter``: the CPU package energy counters of Linux's powercap interface
    (``/sys/class/powercap/intel-rapl:N``, also used for AMD Zen), read from sysfs;
  - ``hlml.hlml_meter``: Intel Gaudi through ``habana-pyhlml``, for the Gaudi adapter.

Vendor libraries are imported inside the reader functions: importing this package loads none.
The names of every part are re-exported here, where the adapters and the engine import them.
"""
from __future__ import annotations

from accel_kit.devices.power.counter import GPU_COUNTER_MIN_WINDOW_S, WRAP_SAFETY, Counter, CounterMeter, rated_power
from accel_kit.devices.power.hlml import hlml_meter
from accel_kit.devices.power.meter import (ENERGY_COUNTER, SAMPLED_POWER, EnergyMeter, EnergySource, EnergyWindow,
                                           Method, UnavailableMeter, library_version)
from accel_kit.devices.power.nvml import nvml_meter
from accel_kit.devices.power.rapl import POWERCAP, RAPL_MIN_WINDOW_S, rapl_meter
from accel_kit.devices.power.zeus_gpu import ZeusMeter, zeus_gpu_meter

__all__ = [
    "ENERGY_COUNTER", "SAMPLED_POWER", "Method", "EnergySource", "EnergyWindow", "EnergyMeter", "UnavailableMeter",
    "library_version", "GPU_COUNTER_MIN_WINDOW_S", "WRAP_SAFETY", "Counter", "CounterMeter", "rated_power",
    "POWERCAP", "RAPL_MIN_WINDOW_S", "rapl_meter", "ZeusMeter", "zeus_gpu_meter", "nvml_meter", "hlml_meter",
]
