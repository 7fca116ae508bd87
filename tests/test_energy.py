"""accel_kit.energy: a window's reading turned into the record's fields, and the plausibility check."""
import pytest
from energy_standins import source

from accel_kit import energy
from accel_kit.devices.power import EnergyWindow


def test_plausibility():
    src = source(rated_power_w=700.0, rated_power_source="NVML limit", min_window_s=1.0)
    ok = energy.energy_fields(EnergyWindow(2000.0, 4.0, src), work="flops", amount=4e15)
    assert ok["power_avg_w"] == 500.0 and ok["flops_per_j"] == 2e12 and ok["energy_rated_power_w"] == 700.0
    with pytest.raises(energy.ImplausibleEnergy, match="above 1.5 x the rated 700 W"):
        energy.energy_fields(EnergyWindow(4400.0, 4.0, src), work="flops", amount=1.0)  # 1100 W
    with pytest.raises(energy.ImplausibleEnergy, match="negative"):
        energy.energy_fields(EnergyWindow(-1.0, 4.0, src), work="tokens", amount=1.0)
    zero = energy.energy_fields(EnergyWindow(0.0, 4.0, src), work="tokens", amount=1.0)
    assert zero["energy_j"] is None and "did not advance" in zero["energy_reason"]
    short = energy.energy_fields(EnergyWindow(20.0, 0.05, src), work="tokens", amount=1.0)
    assert short["energy_j"] is None and "shorter than the 1 s" in short["energy_reason"]
    unknown = energy.energy_fields(EnergyWindow(9000.0, 4.0, source()), work="tokens", amount=1.0)
    assert unknown["energy_j"] == 9000.0  # no rated power known: only the sign is checked


