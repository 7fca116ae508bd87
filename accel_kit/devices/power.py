"""Energy readers: a device's energy counter, read over exactly the timed window of a point.

An adapter's ``energy_meter(index)`` returns an ``EnergyMeter``; ``accel_kit.timing.measure``
starts it after the warm-up (the device idle), polls it after each timed trial and stops it
after the last one, so the reading covers the timed trials and nothing else. The window's
figure is an ``EnergyWindow``: joules, or None with the reason; never a zero standing in
for "not read".

The readers, each the smallest that covers its device:

- ``zeus_gpu_meter``: NVIDIA GPUs (NVML's ``nvmlDeviceGetTotalEnergyConsumption``) and AMD GPUs
  (amdsmi's ``amdsmi_get_energy_count``) through Zeus's ``ZeusMonitor`` (the optional extra
  ``accel-kit[energy]``), which also falls back to integrating sampled power on GPUs without a
  counter (NVIDIA before Volta).
- ``nvml_meter``: the same NVIDIA counter through NVIDIA's ``nvidia-ml-py`` alone, where Zeus is
  not installed (one small wheel instead of Zeus's scikit-learn, SciPy and AMD libraries).
- ``rapl_meter``: the CPU package energy counters of Linux's powercap interface
  (``/sys/class/powercap/intel-rapl:N``, also used for AMD Zen), read from sysfs. Zeus reads the
  same files, but it would pull scikit-learn and the GPU libraries into a CPU install for a
  few lines of file reading; the wrap-around of ``energy_uj`` at ``max_energy_range_uj`` is
  handled here.
- ``hlml_meter``: Intel Gaudi through ``habana-pyhlml`` (``hlmlDeviceGetTotalEnergyConsumption``,
  millijoules since the driver loaded), which no general library covers; for the Gaudi adapter.

Vendor libraries are imported inside the functions: importing this module loads none.
"""
from __future__ import annotations

import re
import time
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Literal, Protocol, runtime_checkable

ENERGY_COUNTER = "energy_counter"  # a cumulative counter read at both ends of the window
SAMPLED_POWER = "sampled_power"  # power samples integrated over the window
Method = Literal["energy_counter", "sampled_power"]

# A counter that updates every ~20-100 ms (NVML's, by public accounts; HLML's is not documented) is within
# about 10 % only over a window of at least ten updates: shorter windows are not recorded.
GPU_COUNTER_MIN_WINDOW_S = 1.0
# RAPL's counters update about every millisecond (Intel SDM, MSR_PKG_ENERGY_STATUS).
RAPL_MIN_WINDOW_S = 0.01
# A counter that wraps is read after every trial; a trial long enough to hold a whole wrap range at this
# multiple of the rated power could hide a second wrap.
WRAP_SAFETY = 1.5


@dataclass(frozen=True)
class EnergySource:
    """What an energy figure was read from, recorded with it."""

    counter: str  # the counter or call, and which device or zones
    library: str  # the library (with its version) or interface that read it
    method: Method
    sampling_period_s: float | None = None  # sampled power: the sampling period; a counter: None
    scope: Literal["device", "host"] = "device"  # host: one reading for the whole node (a CPU package)
    rated_power_w: float | None = None  # the device's power limit, for the plausibility check; None: unknown
    rated_power_source: str = ""
    min_window_s: float = 0.0  # shorter windows are too coarse for this counter to be recorded

    def describe(self) -> str:
        """One line for the record's ``energy_source``."""
        how = "energy counter" if self.method == ENERGY_COUNTER else f"sampled power every {self.sampling_period_s} s"
        return f"{self.counter}; {self.library}; {how}"


@dataclass(frozen=True)
class EnergyWindow:
    """The energy of one timed window: joules, or None and ``reason``."""

    energy_j: float | None
    window_s: float
    source: EnergySource | None = None  # None: nothing could be read on this device
    reason: str | None = None  # why energy_j is None

    def without_energy(self, reason: str) -> "EnergyWindow":
        return replace(self, energy_j=None, reason=reason)


@runtime_checkable
class EnergyMeter(Protocol):
    """Reads a device's energy over one window: ``start``, ``poll`` after each trial, ``stop``."""

    source: EnergySource | None

    def start(self) -> None:
        """Open the window (the device idle: the caller synchronised it)."""

    def poll(self) -> None:
        """Read counters that can wrap (between trials, outside the timed region)."""

    def stop(self) -> EnergyWindow:
        """Close the window (the device idle) and return its energy."""


class UnavailableMeter:
    """The device exposes no energy reading here: every window is None with ``reason``."""

    source = None

    def __init__(self, reason: str):
        self.reason = reason
        self._t0 = time.perf_counter()

    def start(self) -> None:
        self._t0 = time.perf_counter()

    def poll(self) -> None:
        pass

    def stop(self) -> EnergyWindow:
        return EnergyWindow(None, time.perf_counter() - self._t0, None, self.reason)


@dataclass(frozen=True)
class Counter:
    """One cumulative energy counter: ``read_j`` in joules; ``wrap_j``: where it wraps to 0 (None: never);
    ``rated_w``: the power limit of what it measures (None: the source's)."""

    name: str
    read_j: Callable[[], float]
    wrap_j: float | None = None
    rated_w: float | None = None


class CounterMeter:
    """Energy over a window from cumulative counters (summed), with wrap-around and resets handled.

    Each counter is read at the start, after every trial (``poll``) and at the stop, and the
    differences are summed. A reading below the previous one is a wrap where the counter has a
    range (the difference plus the range is added) and a reset otherwise (a driver reload: the
    window has no figure). A wrapping counter polled less often than its range lasts at the
    device's rated power could have wrapped twice unseen: that window has no figure either.
    """

    def __init__(self, counters: list[Counter], source: EnergySource, clock: Callable[[], float] = time.perf_counter):
        self.counters, self.source, self.clock = counters, source, clock
        self._last: list[float] = []
        self._total_j = 0.0
        self._problem: str | None = None
        self._t0 = self._t_last = 0.0

    def start(self) -> None:
        self._t0 = self._t_last = self.clock()
        self._last = [c.read_j() for c in self.counters]
        self._total_j, self._problem = 0.0, None

    def poll(self) -> None:
        now = self.clock()
        values = [c.read_j() for c in self.counters]
        for counter, before, after in zip(self.counters, self._last, values):
            delta = after - before
            if counter.wrap_j is not None:
                rated = counter.rated_w or self.source.rated_power_w
                if rated and (now - self._t_last) * rated * WRAP_SAFETY >= counter.wrap_j and not self._problem:
                    self._problem = (f"{counter.name} was read {now - self._t_last:.0f} s apart, long enough at "
                                     f"{WRAP_SAFETY} x the rated {rated:.0f} W to wrap its {counter.wrap_j:.0f} J "
                                     "range more than once unseen")
                if delta < 0:
                    delta += counter.wrap_j
            elif delta < 0 and not self._problem:
                self._problem = (f"{counter.name} went backwards ({before:.3f} J to {after:.3f} J) during the window: "
                                 "the counter was reset (a driver reload?)")
            self._total_j += delta
        self._last, self._t_last = values, now

    def stop(self) -> EnergyWindow:
        self.poll()
        window_s = self._t_last - self._t0
        if self._problem:
            return EnergyWindow(None, window_s, self.source, self._problem)
        return EnergyWindow(self._total_j, window_s, self.source)


# ---- CPU: RAPL through Linux's powercap sysfs -------------------------------------------------------

POWERCAP = Path("/sys/class/powercap")
_PACKAGE_ZONE = re.compile(r"^intel-rapl:\d+$")  # top-level zones; intel-rapl:N:M are their sub-zones


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


# ---- NVIDIA and AMD GPUs: Zeus ----------------------------------------------------------------------


def _version(*dists: str) -> str:
    from accel_kit.devices._vendor import package_version

    return package_version(*dists) or "(version unknown)"


class ZeusMeter:
    """One GPU's energy over a window through Zeus's ``ZeusMonitor`` (NVML / amdsmi).

    The device is synchronised by the caller (the adapter), so Zeus is told not to; its index
    is the framework's (after ``CUDA_VISIBLE_DEVICES``), as torch's.
    """

    def __init__(self, monitor, index: int, source: EnergySource):
        self.monitor, self.index, self.source = monitor, index, source
        self._windows = 0
        self._t0 = time.perf_counter()

    @property
    def _key(self) -> str:
        return f"accel-kit-window-{self._windows}"

    def start(self) -> None:
        self._windows += 1  # a fresh key: a window left open by a failed measurement does not block the next
        self._t0 = time.perf_counter()
        self.monitor.begin_window(self._key, sync_execution=False)

    def poll(self) -> None:
        pass  # NVML's and amdsmi's counters are 64-bit: no wrap within a run

    def stop(self) -> EnergyWindow:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Zeus warns on a zero reading; the record says it instead
            try:
                m = self.monitor.end_window(self._key, sync_execution=False)
            except Exception as exc:  # a sampling fallback with no samples, a lost GPU: no figure, say why
                return EnergyWindow(None, time.perf_counter() - self._t0, self.source, f"zeus could not close the window: {type(exc).__name__}: {exc}")
        energy = m.gpu_energy.get(self.index)
        if energy is None:
            return EnergyWindow(None, m.time, self.source, f"zeus returned no energy for GPU {self.index}")
        if energy < 0:
            return EnergyWindow(None, m.time, self.source,
                                f"the energy counter of GPU {self.index} went backwards ({energy:.3f} J over the window): "
                                "it was reset (a driver reload?)")
        return EnergyWindow(float(energy), m.time, self.source)


def zeus_gpu_meter(index: int, *, api: str) -> UnavailableMeter | ZeusMeter:
    """GPU ``index`` (torch's numbering) through Zeus; ``api`` names the vendor call Zeus makes, for the record."""
    try:
        from zeus.device import get_gpus
        from zeus.monitor import ZeusMonitor
    except ImportError as exc:
        return UnavailableMeter(f"no GPU energy reading: zeus is not installed (pip install 'accel-kit[energy]'), "
                                f"so {api} is not read ({type(exc).__name__}: {exc})")
    try:
        gpus = get_gpus()
        if index >= len(gpus):
            return UnavailableMeter(f"no GPU energy reading: zeus sees {len(gpus)} GPU(s), not GPU {index}")
        monitor = ZeusMonitor(gpu_indices=[index], cpu_indices=[])
        counter = gpus.supports_get_total_energy_consumption(index)
        name = gpus.get_name(index)
    except Exception as exc:  # no driver, no library, no permission: no figure, with the reason
        return UnavailableMeter(f"no GPU energy reading: zeus could not open GPU {index}: {type(exc).__name__}: {exc}")
    try:
        rated_w, rated_source = gpus.get_power_management_limit_constraints(index)[1] / 1e3, \
            "the GPU's maximum power-management limit (zeus get_power_management_limit_constraints)"
    except Exception as exc:
        rated_w, rated_source = None, f"power limit not readable ({type(exc).__name__}): upper bound not checked"
    period = getattr(getattr(monitor, "power_monitor", None), "update_period", None)
    source = EnergySource(
        counter=f"{api}, GPU {index} ({name})" if counter else f"power samples of GPU {index} ({name}), no energy counter",
        library=f"zeus {_version('zeus')} ZeusMonitor", method=ENERGY_COUNTER if counter else SAMPLED_POWER,
        sampling_period_s=None if counter else period, rated_power_w=rated_w, rated_power_source=rated_source,
        min_window_s=GPU_COUNTER_MIN_WINDOW_S)
    return ZeusMeter(monitor, index, source)


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
    try:
        rated_w = pynvml.nvmlDeviceGetPowerManagementLimitConstraints(handle)[1] / 1e3
        rated_source = "the GPU's maximum power-management limit (nvmlDeviceGetPowerManagementLimitConstraints)"
    except Exception as exc:
        rated_w, rated_source = None, f"power limit not readable ({type(exc).__name__}): upper bound not checked"
    source = EnergySource(
        counter=f"NVML nvmlDeviceGetTotalEnergyConsumption, GPU {index} ({name})",
        library=f"nvidia-ml-py {_version('nvidia-ml-py')}", method=ENERGY_COUNTER, rated_power_w=rated_w,
        rated_power_source=rated_source, min_window_s=GPU_COUNTER_MIN_WINDOW_S)
    counter = Counter(f"NVML energy of GPU {index}", lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(handle) / 1e3)
    return CounterMeter([counter], source)


# ---- Intel Gaudi: habana-pyhlml ---------------------------------------------------------------------


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
    try:
        rated_w = pyhlml.hlmlDeviceGetPowerManagementDefaultLimit(handle) / 1e3
        rated_source = "the device's default power-management limit (hlmlDeviceGetPowerManagementDefaultLimit)"
    except Exception as exc:
        rated_w, rated_source = None, f"power limit not readable ({type(exc).__name__}): upper bound not checked"
    source = EnergySource(
        counter=f"hlmlDeviceGetTotalEnergyConsumption, device {index} ({name})",
        library=f"habana-pyhlml {_version('habana-pyhlml', 'pyhlml')}", method=ENERGY_COUNTER, rated_power_w=rated_w,
        rated_power_source=rated_source, min_window_s=GPU_COUNTER_MIN_WINDOW_S)
    counter = Counter(f"HLML energy of device {index}",
                      lambda: pyhlml.hlmlDeviceGetTotalEnergyConsumption(handle) / 1e3)
    return CounterMeter([counter], source)
