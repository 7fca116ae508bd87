"""The matmul-peak and memory-bandwidth kinds: many products (copies), each timed by ``accel_kit.timing``, the
best rate kept.

Its own path (no FLOPs of one workload, no MFU, no energy window), so no ``KindMeasurement``; the
sweep runner measures it in a child process before a sweep (``accel_kit.engine.sweep.PeakReference``).
"""
from __future__ import annotations

from accel_kit.engine.kinds import register_kind
from accel_kit.engine.measurement import Context
from accel_kit.engine.point import BandwidthPoint, PeakPoint
from accel_kit.engine.result import Result


def measure_peak(point: PeakPoint, ctx: Context) -> Result:
    """The best matmul rate over the point's shapes (``accel_kit.peaks.MeasuredPeak``, in the payload)."""
    from accel_kit.peaks import measure_matmul_peak

    peak = measure_matmul_peak(ctx.adapter, point.precision, shapes=tuple(map(tuple, point.shapes)))
    return Result(status="ok", payload=peak.to_dict())


register_kind("peak", PeakPoint, measure_peak)


def measure_bandwidth(point: BandwidthPoint, ctx: Context) -> Result:
    """The best copy or triad rate (``accel_kit.peaks.MeasuredBandwidth``, in the payload)."""
    from accel_kit.peaks import measure_memory_bandwidth

    bandwidth = measure_memory_bandwidth(ctx.adapter, sizes_mib=tuple(point.sizes_mib))
    return Result(status="ok", payload=bandwidth.to_dict())


register_kind("bandwidth", BandwidthPoint, measure_bandwidth)
