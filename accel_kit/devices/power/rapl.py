"""CPU package energy: RAPL through Linux's powercap sysfs (``/sys/class/powercap/intel-rapl:N``, AMD Zen too).

Read from the files directly: Zeus reads the same ones, but would pull scikit-learn and the GPU
libraries into a CPU install for a few lines of file reading. ``energy_uj`` wraps at
``max_energy_range_uj``, which the ``CounterMeter`` handles.
"""
from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Callable

from accel_kit.devices.power.counter import Counter, CounterMeter
from accel_kit.devices.power.meter import ENERGY_COUNTER, EnergySource, UnavailableMeter

POWERCAP = Path("/sys/class/powercap")
_PACKAGE_ZONE = re.compile(r"^intel-rapl:\d+$")  # top-level zones; intel-rapl:N:M are their sub-zones
# RAPL's counters update about every millisecond (Intel SDM, MSR_PKG_ENERGY_STATUS).
RAPL_MIN_WINDOW_S = 0.01


def _read_int(path: Path) -> int:
    return int(path.read_text().strip())


def _rapl_rated_w(zone: Path) -> float | None:
    """The zone's highest power limit or maximum (long- and short-term constraints), in watts."""
    values = []
    for path in zone.glob("constraint_*_*_uw"):
        if path.name.endswith(("_power_limit_uw", "_max_power_uw")):
            try:
                values.append(_read_int(path))
            except (OSError, ValueError):
                continue
    values = [v for v in values if v > 0]
    return max(values) / 1e6 if values else None


def _package_zones(root: Path) -> list[tuple[Path, str]]:
    """The top-level zones under ``root`` named ``package-N`` (not psys, not the MMIO copy), with their names."""
    zones = []
    for zone in sorted(root.iterdir(), key=lambda p: p.name):
        if not _PACKAGE_ZONE.match(zone.name):
            continue
        try:
            name = (zone / "name").read_text().strip()
        except OSError:
            continue
        if name.startswith("package"):
            zones.append((zone, name))
    return zones


def rapl_meter(root: str | Path = POWERCAP, *, clock: Callable[[], float] = time.perf_counter
               ) -> UnavailableMeter | CounterMeter:
    """The summed package energy of every CPU socket (RAPL ``package-N`` zones under ``root``).

    The package zones cover cores, caches and the uncore, not DRAM, and everything running on
    the sockets (other processes too): the figure is the host's, shared by every rank on it.
    """
    root = Path(root)
    if not root.is_dir():
        return UnavailableMeter(f"no CPU energy counter: {root} does not exist (no RAPL powercap interface "
                                "on this machine: a virtual machine, a container without it, or a CPU without RAPL)")
    zones = _package_zones(root)
    if not zones:
        return UnavailableMeter(f"no CPU energy counter: no RAPL package zone (intel-rapl:N named package-N) under {root}")
    counters, rated = [], []
    for zone, name in zones:
        energy = zone / "energy_uj"
        try:
            _read_int(energy)
            wrap_uj = _read_int(zone / "max_energy_range_uj")
        except PermissionError:
            return UnavailableMeter(f"no CPU energy reading: {energy} is readable by root only (Linux 5.10 and later "
                                    "restrict RAPL counters; run as root or grant read access)")
        except (OSError, ValueError) as exc:
            return UnavailableMeter(f"no CPU energy reading: {energy}: {exc}")
        rated.append(_rapl_rated_w(zone))
        counters.append(Counter(f"RAPL {name}", lambda path=energy: _read_int(path) / 1e6, wrap_uj / 1e6, rated[-1]))
    known = None if None in rated else sum(rated)
    source = EnergySource(
        counter="RAPL " + " + ".join(name for _, name in zones) + " energy_uj (CPU packages, every process on them)",
        library=f"Linux powercap sysfs ({root})", method=ENERGY_COUNTER, scope="host", rated_power_w=known,
        rated_power_source="RAPL power-limit constraints (highest of long and short term)" if known else
        "no RAPL power-limit constraint readable: upper bound not checked", min_window_s=RAPL_MIN_WINDOW_S)
    return CounterMeter(counters, source, clock)
