"""accel_kit.devices.power.nvml: NVIDIA's counter through nvidia-ml-py alone, against a stand-in pynvml."""
import sys
import types

import pytest

from accel_kit.devices.power import nvml


def _fake_pynvml(monkeypatch, readings_mj, *, supported=True):
    mod = types.ModuleType("pynvml")
    mod.opened = []
    mod.nvmlInit = lambda: None

    def by_uuid(uuid):
        mod.opened.append(uuid)
        return "handle"

    def energy(handle):
        if not supported:
            raise RuntimeError("NVMLError_NotSupported: Not Supported")
        return next(readings_mj)

    mod.nvmlDeviceGetHandleByUUID = by_uuid
    mod.nvmlDeviceGetName = lambda h: "NVIDIA H200"
    mod.nvmlDeviceGetTotalEnergyConsumption = energy
    mod.nvmlDeviceGetPowerManagementLimitConstraints = lambda h: [200_000, 700_000]
    monkeypatch.setitem(sys.modules, "pynvml", mod)
    return mod


def test_nvml_meter_without_zeus(monkeypatch):
    mod = _fake_pynvml(monkeypatch, iter([1, 10_000, 1_010_000]))
    meter = nvml.nvml_meter(1, uuid=lambda: "58c0a2c5-0000-1111-2222-333344445555")
    assert mod.opened == ["GPU-58c0a2c5-0000-1111-2222-333344445555"]  # the torch device's GPU, not NVML's index 1
    assert meter.source.rated_power_w == 700.0 and "nvidia-ml-py" in meter.source.library
    meter.start()
    assert meter.stop().energy_j == pytest.approx(1000.0)
    _fake_pynvml(monkeypatch, iter([]), supported=False)
    assert "NotSupported" in nvml.nvml_meter(0, uuid=lambda: "GPU-x").reason  # GPUs before Volta have no counter
