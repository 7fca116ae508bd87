"""accel_kit.devices.power.rapl: CPU package counters against a fake powercap tree (wrap-around, permissions,
missing limits), and the null-with-reason path on this machine."""
from pathlib import Path

import pytest
from energy_standins import Clock

from accel_kit import energy
from accel_kit.devices import get_adapter
from accel_kit.devices.power import rapl
from accel_kit.devices.power.counter import CounterMeter
from accel_kit.devices.power.meter import ENERGY_COUNTER
from accel_kit.timing import measure

MAX_UJ = 262_143_328_850  # a real package's max_energy_range_uj (about 262 kJ)


def _zone(root: Path, name: str, label: str, energy_uj: int, *, limits_uw=(), max_uj=MAX_UJ) -> Path:
    zone = root / name
    zone.mkdir(parents=True)
    (zone / "name").write_text(label + "\n")
    (zone / "energy_uj").write_text(f"{energy_uj}\n")
    (zone / "max_energy_range_uj").write_text(f"{max_uj}\n")
    for k, (kind, uw) in enumerate(limits_uw):
        (zone / f"constraint_{k}_name").write_text(kind + "\n")
        (zone / f"constraint_{k}_power_limit_uw").write_text(f"{uw}\n")
    return zone


def _powercap(root: Path) -> tuple[Path, Path]:
    """Laid out as the kernel's /sys/class/powercap: two sockets, their sub-zones, and zones that must be ignored."""
    (root / "intel-rapl").mkdir(parents=True)  # the control type
    (root / "intel-rapl" / "enabled").write_text("1\n")
    p0 = _zone(root, "intel-rapl:0", "package-0", MAX_UJ - 1_000_000,
               limits_uw=[("long_term", 200_000_000), ("short_term", 250_000_000)])
    p1 = _zone(root, "intel-rapl:1", "package-1", 5_000_000,
               limits_uw=[("long_term", 200_000_000), ("short_term", 250_000_000)])
    _zone(root, "intel-rapl:0:0", "core", 123)  # a sub-zone: counted inside its package already
    _zone(root, "intel-rapl:0:1", "dram", 456)
    _zone(root, "intel-rapl:2", "psys", 789)  # the platform zone of client CPUs overlaps the packages
    _zone(root, "intel-rapl-mmio:0", "package-0", 1)  # the MMIO interface repeats package-0
    return p0, p1


def _set(zone: Path, uj: int) -> None:
    (zone / "energy_uj").write_text(f"{uj}\n")


def test_rapl_sums_packages_and_handles_wrap_around(tmp_path):
    p0, p1 = _powercap(tmp_path)
    clock = Clock()
    meter = rapl.rapl_meter(tmp_path, clock=clock)
    assert isinstance(meter, CounterMeter)
    src = meter.source
    assert src.counter.startswith("RAPL package-0 + package-1") and "psys" not in src.counter
    assert src.method == ENERGY_COUNTER and src.scope == "host" and src.rated_power_w == 500.0
    meter.start()
    clock.now += 1.0
    _set(p0, 2_000_000)  # wrapped at max_energy_range_uj: 1 J before the wrap + 2 J after it
    _set(p1, 9_000_000)  # 4 J
    meter.poll()
    clock.now += 1.0
    _set(p0, 4_000_000)  # 2 J
    window = meter.stop()
    assert window.reason is None and window.energy_j == pytest.approx(9.0) and window.window_s == pytest.approx(2.0)
    fields = energy.energy_fields(window, work="tokens", amount=900)
    assert fields["energy_j"] == pytest.approx(9.0) and fields["power_avg_w"] == pytest.approx(4.5)
    assert fields["tokens_per_j"] == pytest.approx(100.0) and fields["energy_reason"] is None
    assert fields["energy_method"] == "energy_counter" and "powercap" in fields["energy_source"]


def test_rapl_read_too_rarely_to_rule_out_a_second_wrap_has_no_figure(tmp_path):
    p0, _ = _powercap(tmp_path)
    clock = Clock()
    meter = rapl.rapl_meter(tmp_path, clock=clock)
    meter.start()
    clock.now += MAX_UJ / 1e6 / 250  # one range at the package's rated 250 W: at 1.5 x it could have wrapped twice
    _set(p0, 1_000)
    window = meter.stop()
    assert window.energy_j is None and "more than once" in window.reason


def test_rapl_needs_package_zones_and_read_access(tmp_path, monkeypatch):
    assert "does not exist" in rapl.rapl_meter(tmp_path / "absent").reason
    (tmp_path / "empty").mkdir()
    assert "no RAPL package zone" in rapl.rapl_meter(tmp_path / "empty").reason
    _powercap(tmp_path / "tree")
    real = rapl._read_int

    def denied(path):
        if path.name == "energy_uj":
            raise PermissionError(13, "Permission denied")
        return real(path)

    monkeypatch.setattr(rapl, "_read_int", denied)
    meter = rapl.rapl_meter(tmp_path / "tree")
    assert meter.source is None and "root only" in meter.reason


def test_rapl_without_power_limits_records_and_says_the_bound_is_unchecked(tmp_path):
    _zone(tmp_path, "intel-rapl:0", "package-0", 0)
    meter = rapl.rapl_meter(tmp_path)
    assert meter.source.rated_power_w is None and "not checked" in meter.source.rated_power_source


def test_this_machine_records_null_with_the_reason():
    """No /sys/class/powercap here (nor hwmon): the CPU adapter's window is None with why, never 0."""
    if Path("/sys/class/powercap").exists():
        pytest.skip("this machine exposes powercap")
    meter = get_adapter("cpu").energy_meter()
    timing = measure(lambda: None, lambda: None, warmup=1, trials=2, meter=meter)
    fields = energy.energy_fields(timing.energy, work="tokens", amount=10)
    assert fields["energy_j"] is None and fields["tokens_per_j"] is None and fields["power_avg_w"] is None
    assert "/sys/class/powercap does not exist" in fields["energy_reason"]
    assert set(energy.FIELDS) <= set(fields)

