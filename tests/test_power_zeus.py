"""accel_kit.devices.power.zeus_gpu: NVIDIA and AMD GPUs through Zeus, against a stand-in for zeus's documented API
(and zeus's own ZeusMonitor over a fake GPU layer where the extra is installed)."""
import sys
import types

import pytest

from accel_kit import energy
from accel_kit.devices import get_adapter
from accel_kit.devices.power import zeus_gpu
from accel_kit.devices.power.meter import ENERGY_COUNTER


class FakeGPUs:
    def __init__(self, energy_mj, counter=True):
        self.energy_mj, self.counter = energy_mj, counter

    def __len__(self):
        return 1

    def supports_get_total_energy_consumption(self, i):
        return self.counter

    def get_total_energy_consumption(self, i):
        return next(self.energy_mj)

    def get_name(self, i):
        return "NVIDIA H200"

    def get_power_management_limit_constraints(self, i):
        return (200_000, 700_000)

    def get_instant_power_usage(self, i):
        return 300_000


def _fake_zeus(monkeypatch, gpus):
    """A stand-in for zeus's documented API (get_gpus, ZeusMonitor.begin_window/end_window, Measurement)."""
    class Measurement:
        def __init__(self, time, gpu_energy):
            self.time, self.gpu_energy = time, gpu_energy

    class ZeusMonitor:
        def __init__(self, gpu_indices=None, cpu_indices=None):
            self.gpu_indices, self.open = gpu_indices, {}
            self.power_monitor = None

        def begin_window(self, key, sync_execution=True):
            assert sync_execution is False  # the adapter synchronises
            self.open[key] = gpus.get_total_energy_consumption(0) / 1e3

        def end_window(self, key, sync_execution=True):
            start = self.open.pop(key)
            return Measurement(2.5, {i: gpus.get_total_energy_consumption(i) / 1e3 - start for i in self.gpu_indices})

    zeus = types.ModuleType("zeus")
    device = types.ModuleType("zeus.device")
    device.get_gpus = lambda: gpus
    monitor = types.ModuleType("zeus.monitor")
    monitor.ZeusMonitor = ZeusMonitor
    zeus.device, zeus.monitor = device, monitor
    for name, mod in {"zeus": zeus, "zeus.device": device, "zeus.monitor": monitor}.items():
        monkeypatch.setitem(sys.modules, name, mod)


def test_zeus_meter_reads_the_gpu_counter(monkeypatch):
    _fake_zeus(monkeypatch, FakeGPUs(iter([1_000_000, 2_250_000])))
    meter = get_adapter("cuda").energy_meter(0)
    assert meter.source.method == ENERGY_COUNTER and meter.source.rated_power_w == 700.0
    assert "nvmlDeviceGetTotalEnergyConsumption" in meter.source.counter and "H200" in meter.source.counter
    meter.start()
    window = meter.stop()
    assert window.energy_j == pytest.approx(1250.0) and window.window_s == 2.5
    fields = energy.energy_fields(window, work="tokens", amount=1e6)
    assert fields["power_avg_w"] == pytest.approx(500.0) and fields["tokens_per_j"] == pytest.approx(800.0)
    assert "zeus" in fields["energy_source"]


def test_zeus_meter_counter_reset_and_missing_gpu(monkeypatch):
    _fake_zeus(monkeypatch, FakeGPUs(iter([5_000_000, 1_000])))
    meter = get_adapter("rocm").energy_meter(0)
    assert "amdsmi_get_energy_count" in meter.source.counter
    meter.start()
    window = meter.stop()
    assert window.energy_j is None and "went backwards" in window.reason
    assert "zeus sees 1 GPU(s), not GPU 3" in get_adapter("cuda").energy_meter(3).reason


def test_without_zeus_or_nvml_the_reason_says_what_to_install(monkeypatch):
    for name in ("zeus", "zeus.device", "zeus.monitor", "pynvml"):
        monkeypatch.setitem(sys.modules, name, None)  # importing it raises ImportError
    reason = get_adapter("cuda").energy_meter(0).reason
    assert "neither zeus" in reason and "accel-kit[energy]" in reason and "nvidia-ml-py" in reason
    reason = get_adapter("rocm").energy_meter(0).reason
    assert "zeus is not installed" in reason and "amdsmi_get_energy_count" in reason


def test_real_zeus_with_a_fake_gpu(monkeypatch):
    """Where the extra is installed: our meter against zeus's own ZeusMonitor, its GPU layer faked."""
    gpu_module = pytest.importorskip("zeus.device.gpu")
    pytest.importorskip("zeus.monitor")
    monkeypatch.setattr(gpu_module, "_gpus", FakeGPUs(iter([1_000_000, 3_000_000])))
    meter = zeus_gpu.zeus_gpu_meter(0, api="NVML nvmlDeviceGetTotalEnergyConsumption")
    assert isinstance(meter, zeus_gpu.ZeusMeter), getattr(meter, "reason", "")
    meter.start()
    window = meter.stop()
    assert window.energy_j == pytest.approx(2000.0) and window.window_s >= 0
