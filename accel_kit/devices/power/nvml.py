"""NVIDIA GPUs through NVIDIA's own bindings (``nvidia-ml-py``, imported as ``pynvml``) where Zeus is not installed.

The same counter Zeus reads, with one small wheel instead of Zeus's scikit-learn, SciPy and AMD
libraries. ``pynvml`` is imported when a meter is asked for, not before.
"""
from __future__ import annotations

from typing import Callable

from accel_kit.devices.power.counter import GPU_COUNTER_MIN_WINDOW_S, Counter, CounterMeter, rated_power
from accel_kit.devices.power.meter import ENERGY_COUNTER, EnergySource, UnavailableMeter, library_version


def nvml_meter(index: int, *, uuid: Callable[[], str] | None = None) -> UnavailableMeter | CounterMeter:
    """NVIDIA GPU ``index`` through NVIDIA's own bindings (``nvidia-ml-py``) where Zeus is not installed.

    The same counter Zeus reads (``nvmlDeviceGetTotalEnergyConsumption``, mJ since the driver
    loaded, 64-bit: a smaller reading is a reload, not a wrap), without Zeus's dependencies; no
    sampled fallback (GPUs before Volta have no counter and get the reason). NVML numbers the
    GPUs in PCI order, CUDA may not: ``uuid`` (the torch device's) picks the same GPU.
    """
    try:
        import pynvml
    except ImportError as exc:
        return UnavailableMeter("no GPU energy reading: neither zeus (pip install 'accel-kit[energy]') nor "
                                f"nvidia-ml-py is installed ({type(exc).__name__}: {exc})")
    try:
        pynvml.nvmlInit()
        if uuid is not None:
            key = uuid()
            handle = pynvml.nvmlDeviceGetHandleByUUID(key if key.startswith(("GPU-", "MIG-")) else f"GPU-{key}")
        else:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        name = pynvml.nvmlDeviceGetName(handle)
        name = name.decode() if isinstance(name, bytes) else str(name)
        pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)  # NotSupported before Volta
    except Exception as exc:
        return UnavailableMeter(f"no GPU energy reading: NVML could not read the energy counter of GPU {index}: "
                                f"{type(exc).__name__}: {exc}")
    rated_w, rated_source = rated_power(
        lambda: pynvml.nvmlDeviceGetPowerManagementLimitConstraints(handle)[1] / 1e3,
        "the GPU's maximum power-management limit (nvmlDeviceGetPowerManagementLimitConstraints)")
    source = EnergySource(
        counter=f"NVML nvmlDeviceGetTotalEnergyConsumption, GPU {index} ({name})",
        library=f"nvidia-ml-py {library_version('nvidia-ml-py')}", method=ENERGY_COUNTER, rated_power_w=rated_w,
        rated_power_source=rated_source, min_window_s=GPU_COUNTER_MIN_WINDOW_S)
    counter = Counter(f"NVML energy of GPU {index}", lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(handle) / 1e3)
    return CounterMeter([counter], source)
