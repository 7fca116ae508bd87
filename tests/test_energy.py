"""accel_kit.energy: a window's reading turned into the record's fields, the plausibility check, and the nulls
with the reason where nothing was read."""
import pandas as pd
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



def test_fields_of_a_point_without_a_meter_or_a_figure():
    assert energy.per_j_field("tokens") == "tokens_per_j" and energy.per_j_field(None) is None
    none = energy.energy_fields(None, work="tokens", amount=1.0)
    assert set(energy.FIELDS) | {"tokens_per_j"} <= set(none) and none["tokens_per_j"] is None
    assert none["energy_reason"] == "no energy meter was run for this point"
    unread = energy.energy_fields(EnergyWindow(None, 3.0, source(), "no counter"), work="flops", amount=1.0)
    assert unread["energy_j"] is None and unread["flops_per_j"] is None and unread["energy_reason"] == "no counter"
    assert unread["energy_window_s"] == 3.0 and unread["energy_source"] == "fake; test; energy counter"


def test_fill_missing_keeps_a_measured_point_and_says_why_another_has_none():
    measured = {"energy_j": 5.0, "tokens_per_s": 1.0}
    assert energy.fill_missing(measured, "tokens", "ok", None) is measured
    ok = energy.fill_missing({"tokens_per_s": 1.0}, "tokens", "ok", None)
    assert ok["tokens_per_s"] == 1.0 and ok["tokens_per_j"] is None and "reads no energy" in ok["energy_reason"]
    failed = energy.fill_missing({}, "flops", "error", "out of memory")
    assert failed["energy_reason"] == "not measured: the point ended error (out of memory)" and "flops_per_j" in failed
    assert set(energy.fill_missing({}, None, "unsupported", None)) == set(energy.FIELDS)


def test_table_columns_only_where_a_record_has_a_figure():
    df = pd.DataFrame({"tokens_per_j": [None, 2.0], "power_avg_w": [None, 300.0], "energy_j": [None, 50.0]})
    assert energy.table_columns(df) == ["tokens_per_j", "power_avg_w", "energy_j"]
    assert energy.table_columns(df.iloc[:1]) == [] and energy.table_columns(df, "flops") == []
