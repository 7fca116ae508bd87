"""The machine's load over a point's timed window: how much of the CPUs other work took while it ran.

A step timed while another job shares the machine is slower for a reason the times alone do not
show, so every record says how busy the machine was (``accel_kit.engine.measurement`` samples
around the timed trials, through ``LoadMeter``, the same window as the energy's):

- the machine's CPU time over all logical CPUs (``psutil.cpu_times``): busy is every field but
  idle and iowait (waiting on I/O runs nothing), with steal (time a hypervisor gave these CPUs to
  other guests) kept apart where the kernel reports it; guest and guest_nice are left out, as
  Linux already counts them in user and nice;
- the point's own CPU time: this process's threads, its reaped children and its live descendants
  (a compiler's worker pool, data-loader workers): all of it is the point's work, not others';
- the 1-minute load average, and the logical CPU count.

``load_others_cpu_pct`` is the busy time less the point's own, over (logical CPUs x the window's
wall time). Under a group of ranks, the ranks on one host are one point: ``point_fields`` sums
their own times before subtracting (a sibling rank is not another process's load).
Where psutil or the kernel lacks a figure, or the window is too short for the kernel's counters to
resolve it, the figure is null with ``load_reason``, never 0.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import psutil

if TYPE_CHECKING:
    import torch

    from accel_kit.devices.power import EnergyMeter, EnergyWindow

# A record's load metrics (``fields``): figures, a flag, and the reason where they are missing.
LoadFields = dict[str, float | bool | str | None]

# A machine is busy when others (and steal) took, on average over the window, more than a quarter of
# one logical CPU or a tenth of all of them, whichever is more. On a CPU point, which runs threads on
# every core, others' share of the machine is about the share of time it lost: a tenth is beyond
# what we call noise (timing's default noisy_cv is 5 %). The quarter-core floor keeps a 1- or 2-core
# machine's daemons and short bursts (an editor, a shell) from flagging every point: on 2 cores it is
# 12.5 % of the machine.
BUSY_MIN_CORES = 0.25
BUSY_MIN_SHARE = 0.10
# The kernel counts CPU time in clock ticks (1/USER_HZ, 10 ms on Linux): each CPU's counters and the
# process's are each off by up to about a tick over a window, so others' time in a window is uncertain
# by about (CPUs + 2) ticks. The flag needs others' time to exceed the threshold by that; the share is
# given where that is at most a tenth of the window's CPU time (10 points of %): on 2 CPUs, windows of
# 0.2 s and more. A shorter window's share would read 0 or 100 % by where a tick fell.
_TICK_S = 1 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") and "SC_CLK_TCK" in os.sysconf_names else 0.01
MAX_UNCERTAINTY = 0.10


@dataclass(frozen=True)
class Sample:
    """One reading of the machine's and the point's CPU counters (seconds of CPU time; None: not reported)."""

    wall_s: float                # time.monotonic()
    busy_s: float | None         # the machine's CPU time that ran work, steal excluded
    steal_s: float | None        # None where the kernel reports no steal
    own_s: float | None          # this process's CPU time, its children's and its live descendants'
    load_1m: float | None
    cpus: int | None             # logical CPUs (the ones psutil.cpu_times sums over)


def _system() -> tuple[float | None, float | None]:
    try:
        t = psutil.cpu_times()
    except (psutil.Error, OSError, NotImplementedError):
        return None, None
    fields = t._asdict()
    steal = fields.get("steal")
    idle = sum(fields.get(k, 0.0) for k in ("idle", "iowait", "steal", "guest", "guest_nice"))
    return sum(fields.values()) - idle, steal


def _own() -> float | None:
    try:
        me = psutil.Process()
        t = me.cpu_times()
        own = t.user + t.system + t.children_user + t.children_system
        kids = me.children(recursive=True)
    except (psutil.Error, OSError):
        return None
    for kid in kids:
        try:
            k = kid.cpu_times()
            own += k.user + k.system
        except psutil.Error:  # ended meanwhile: once reaped, its time is in children_user/system
            pass
    return own


def _load_1m() -> float | None:
    try:
        return psutil.getloadavg()[0]
    except (OSError, AttributeError):
        return None


def sample() -> Sample:
    """The counters now."""
    busy, steal = _system()
    return Sample(wall_s=time.monotonic(), busy_s=busy, steal_s=steal, own_s=_own(), load_1m=_load_1m(),
                  cpus=psutil.cpu_count(logical=True))


def own_delta_s(before: Sample, after: Sample) -> float | None:
    """The point's own CPU time over the window (this process and its descendants)."""
    return None if before.own_s is None or after.own_s is None else after.own_s - before.own_s


def uncertainty_s(cpus: int) -> float:
    """How far others' CPU time over a window can be off, from the counters' ticks alone."""
    return (cpus + 2) * _TICK_S


def is_busy(taken_s: float, wall_s: float, cpus: int) -> bool:
    """Whether ``taken_s`` of CPU time (others' and steal) over ``wall_s`` makes the machine busy (see BUSY_*)."""
    threshold_s = max(BUSY_MIN_CORES, BUSY_MIN_SHARE * cpus) * wall_s
    return taken_s - uncertainty_s(cpus) > threshold_s


def fields(before: Sample, after: Sample, own_s: float | None = None) -> LoadFields:
    """The record's load metrics over the window; ``own_s``: the point's own CPU time over it (every rank of
    the point on this host), by default this process's."""
    own_s = own_delta_s(before, after) if own_s is None else own_s
    wall_s, cpus = after.wall_s - before.wall_s, after.cpus
    out: LoadFields = {"load_others_cpu_pct": None, "load_steal_pct": None, "machine_busy": None,
                       "load_avg_1m_before": before.load_1m, "load_avg_1m_after": after.load_1m,
                       "load_cpu_count": cpus, "load_window_s": wall_s, "load_reason": None}
    if not cpus or wall_s <= 0:
        return out | {"load_reason": "no window or no CPU count to measure the load over"}
    capacity_s = cpus * wall_s
    if uncertainty_s(cpus) > MAX_UNCERTAINTY * capacity_s:
        return out | {"load_reason": f"a window of {wall_s:.3g} s is too short for the kernel's CPU counters "
                                     f"({_TICK_S * 1e3:.0f} ms ticks) on {cpus} CPUs: the shares would be off by "
                                     f"more than {100 * MAX_UNCERTAINTY:.0f} points"}
    # Counters are read a moment apart and in ticks: a small negative difference is 0, not a credit.
    steal_s = None if before.steal_s is None or after.steal_s is None else max(0.0, after.steal_s - before.steal_s)
    if steal_s is not None:
        out["load_steal_pct"] = min(100.0, 100 * steal_s / capacity_s)
    if before.busy_s is None or after.busy_s is None or own_s is None:
        return out | {"load_reason": "psutil reports no machine-wide or no process CPU times here"}
    others_s = min(capacity_s, max(0.0, after.busy_s - before.busy_s - own_s))
    out["load_others_cpu_pct"] = 100 * others_s / capacity_s
    out["machine_busy"] = is_busy(others_s + (steal_s or 0.0), wall_s, cpus)
    return out


class LoadMeter:
    """An energy meter with the machine's load sampled around its window: the same timed trials as the energy's."""

    def __init__(self, meter: EnergyMeter) -> None:
        self.meter = meter
        self.before: Sample | None = None
        self.after: Sample | None = None

    def start(self) -> None:
        self.before = sample()
        self.meter.start()

    def poll(self) -> None:
        self.meter.poll()

    def stop(self) -> EnergyWindow:
        window = self.meter.stop()
        self.after = sample()
        return window


def host_own_s(owns: list[float], host_of: list[int], host: int) -> float:
    """The own CPU time of the ranks on ``host`` (a rank's host: its global rank less its local rank)."""
    return sum(own for own, h in zip(owns, host_of) if h == host)


def point_fields(before: Sample, after: Sample, device: torch.device, world: int, rank: int,
                 local_rank: int) -> LoadFields:
    """``fields`` of the point over all its ranks: each host's own time summed over its ranks, then each figure's
    maximum over the hosts (the busiest host is what the record reports; every rank must call this)."""
    own = own_delta_s(before, after)
    if world == 1:
        return fields(before, after, own)
    import torch
    import torch.distributed as dist

    # Every rank's own time and host in its slot (a launcher numbers a host's ranks contiguously, so
    # rank - local_rank names the host); float32: not every accelerator has float64.
    t = torch.zeros(2 * world, dtype=torch.float32, device=device)
    t[rank], t[world + rank] = float("nan") if own is None else own, rank - local_rank
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    owns, hosts = t[:world].tolist(), [int(h) for h in t[world:].tolist()]
    host_own = host_own_s(owns, hosts, rank - local_rank)
    mine = fields(before, after, None if host_own != host_own else host_own)  # NaN: a rank had no own time
    numeric = ["load_others_cpu_pct", "load_steal_pct", "load_avg_1m_before", "load_avg_1m_after", "machine_busy",
               "load_window_s"]
    # -1 stands for null in the maximum (every figure is >= 0); gloo's MAX is not defined on NaN.
    m = torch.tensor([-1.0 if mine[k] is None else float(mine[k]) for k in numeric], device=device)
    dist.all_reduce(m, op=dist.ReduceOp.MAX)
    most = {k: None if v < 0 else v for k, v in zip(numeric, m.tolist())}
    if most["machine_busy"] is not None:
        most["machine_busy"] = bool(most["machine_busy"])
    return mine | most
