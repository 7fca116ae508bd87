"""Intel Gaudi through ``habana-pyhlml`` (imported as ``pyhlml``), which no general library covers.

``hlmlDeviceGetTotalEnergyConsumption`` counts millijoules since the driver loaded; the Gaudi
adapter asks for it. ``pyhlml`` is imported when a meter is asked for, not before.
"""
from __future__ import annotations

from accel_kit.devices.power.counter import GPU_COUNTER_MIN_WINDOW_S, Counter, CounterMeter, rated_power
from accel_kit.devices.power.meter import ENERGY_COUNTER, EnergySource, UnavailableMeter, library_version


def hlml_meter(index: int) -> UnavailableMeter | CounterMeter:
    """Gaudi device ``index`` (HLML's numbering) through ``hlmlDeviceGetTotalEnergyConsumption`` (mJ since the
    driver loaded; a 64-bit count, so a smaller reading means a reload, not a wrap).

    HLML numbers every Gaudi in the host, whatever ``HABANA_VISIBLE_MODULES`` hides from the
    framework: the adapter passes the index of the module its rank runs on.
    """
    try:
        import pyhlml
    except ImportError as exc:
        return UnavailableMeter(f"no Gaudi energy reading: habana-pyhlml is not installed ({type(exc).__name__}: {exc})")
    try:
        pyhlml.hlmlInit()
        handle = pyhlml.hlmlDeviceGetHandleByIndex(index)
        name = pyhlml.hlmlDeviceGetName(handle)
        name = name.decode() if isinstance(name, bytes) else str(name)
        pyhlml.hlmlDeviceGetTotalEnergyConsumption(handle)
    except Exception as exc:
        return UnavailableMeter(f"no Gaudi energy reading: HLML could not read device {index}: {type(exc).__name__}: {exc}")
    rated_w, rated_source = rated_power(
        lambda: pyhlml.hlmlDeviceGetPowerManagementDefaultLimit(handle) / 1e3,
        "the device's default power-management limit (hlmlDeviceGetPowerManagementDefaultLimit)")
    source = EnergySource(
        counter=f"hlmlDeviceGetTotalEnergyConsumption, device {index} ({name})",
        library=f"habana-pyhlml {library_version('habana-pyhlml', 'pyhlml')}", method=ENERGY_COUNTER,
        rated_power_w=rated_w, rated_power_source=rated_source, min_window_s=GPU_COUNTER_MIN_WINDOW_S)
    counter = Counter(f"HLML energy of device {index}",
                      lambda: pyhlml.hlmlDeviceGetTotalEnergyConsumption(handle) / 1e3)
    return CounterMeter([counter], source)
