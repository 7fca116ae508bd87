"""Device adapters, found by name and imported only when asked for.

Adding a backend is one line in ``ADAPTERS`` plus its module: this file never imports a
vendor SDK, and neither does ``import accel_kit``.
"""
from __future__ import annotations

import importlib

from accel_kit.devices.base import DTYPES, PRECISIONS, BaseAdapter, DeviceAdapter, ProgrammingModel, dtype_of
from accel_kit.devices.types import (
    Availability,
    DeviceDescription,
    JobLaunch,
    Placement,
    PrecisionChoice,
    PrecisionSupport,
)
from accel_kit.devices.power import EnergyMeter, EnergySource, EnergyWindow, UnavailableMeter
from accel_kit.errors import ParameterError, UnavailableError

# name -> "module:Class", imported on first use.
ADAPTERS: dict[str, str] = {
    "cpu": "accel_kit.devices.cpu:CPUAdapter",
    # any backend torch.accelerator serves (xpu, mps, ...); its options may pin one device type
    "accelerator": "accel_kit.devices.accelerator:AcceleratorAdapter",
    "cuda": "accel_kit.devices.cuda:CUDAAdapter",
    "rocm": "accel_kit.devices.rocm:ROCmAdapter",
    "habana": "accel_kit.devices.habana:HabanaAdapter",
    "poptorch": "accel_kit.devices.graphcore:PopTorchAdapter",
    "sambaflow": "accel_kit.devices.sambanova:SambaFlowAdapter",
    "cerebras": "accel_kit.devices.cerebras:CerebrasAdapter",
}


def get_adapter(name: str, options: dict | None = None) -> DeviceAdapter:
    """Instantiate the adapter registered under ``name`` with its system's ``options`` (no availability check)."""
    try:
        target = ADAPTERS[name]
    except KeyError:
        raise ParameterError(f"unknown device adapter {name!r}; known: {', '.join(sorted(ADAPTERS))}") from None
    module_name, cls_name = target.split(":")
    adapter = getattr(importlib.import_module(module_name), cls_name)()
    adapter.configure(dict(options or {}))
    return adapter


def require_adapter(name: str, *, system: str | None = None, options: dict | None = None) -> DeviceAdapter:
    """The adapter ``name``, or an UnavailableError naming the system and the reason."""
    adapter = get_adapter(name, options)
    avail = adapter.availability()
    if not avail:
        who = f"system {system!r} (adapter {name})" if system else f"adapter {name!r}"
        raise UnavailableError(f"{who} is not available here: {avail.reason}")
    return adapter


__all__ = [
    "ADAPTERS", "DTYPES", "PRECISIONS", "Availability", "BaseAdapter", "DeviceAdapter", "DeviceDescription",
    "EnergyMeter", "EnergySource", "EnergyWindow", "JobLaunch", "Placement", "PrecisionChoice", "PrecisionSupport",
    "ProgrammingModel", "UnavailableMeter",
    "dtype_of", "get_adapter", "require_adapter",
]
