"""accel_kit.devices.power.hlml: Intel Gaudi's counter through habana-pyhlml, against a stand-in pyhlml."""
import sys
import types

import pytest

from accel_kit.devices.power import hlml


def _fake_pyhlml(monkeypatch, readings_mj):
    mod = types.ModuleType("pyhlml")
    mod.hlmlInit = lambda: None
    mod.hlmlDeviceGetHandleByIndex = lambda i: ("handle", i)
    mod.hlmlDeviceGetName = lambda h: b"HL-225"
    mod.hlmlDeviceGetTotalEnergyConsumption = lambda h: next(readings_mj)
    mod.hlmlDeviceGetPowerManagementDefaultLimit = lambda h: 600_000
    monkeypatch.setitem(sys.modules, "pyhlml", mod)


def test_hlml_meter_reads_millijoules(monkeypatch):
    _fake_pyhlml(monkeypatch, iter([7, 10_000, 25_000, 40_000]))  # the first read checks the call works
    meter = hlml.hlml_meter(0)
    assert meter.source.rated_power_w == 600.0 and "HL-225" in meter.source.counter
    meter.start()
    meter.poll()
    window = meter.stop()
    assert window.energy_j == pytest.approx(30.0)


def test_hlml_driver_reload_and_missing_library(monkeypatch):
    _fake_pyhlml(monkeypatch, iter([7, 10_000, 500]))
    meter = hlml.hlml_meter(0)
    meter.start()
    assert "went backwards" in meter.stop().reason
    monkeypatch.setitem(sys.modules, "pyhlml", None)
    assert "habana-pyhlml is not installed" in hlml.hlml_meter(0).reason
