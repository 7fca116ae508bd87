"""Peak FLOP rates: datasheet figures (one table, every entry sourced) and a measured matmul peak.

Every result reports MFU two ways: against the vendor's dense datasheet peak (``mfu_pct``,
the figure papers quote) and against the best matmul rate measured on the same device in
the same run (``mfu_measured_pct``: what the device really delivers, so clocks, power caps
and library quality are factored out). A device missing from the table gets no datasheet
MFU and the record says why; it never falls back to some other device's number.
"""
from __future__ import annotations

import functools
import re
from dataclasses import asdict, dataclass, field


import torch

from accel_kit.devices.base import DeviceAdapter
from accel_kit.precision import PRECISIONS, dtype_of
from accel_kit.timing import measure


# The keys a datasheet entry may hold: the precisions a run asks for, TF32 (fp32 matmuls on tensor
# cores, looked up when a run allows TF32) and fp8, which no study trains in yet: it is kept so that
# an fp8 run finds its peak here, and so that the table says what the device offers.
DATASHEET_KEYS: tuple[str, ...] = (*PRECISIONS, "tf32", "fp8")


@dataclass(frozen=True)
class DatasheetPeak:
    """Dense (no structured sparsity) peak of one device for each precision, in TFLOP/s."""

    device: str  # canonical name
    pattern: str  # regex matched (case-insensitive) against the adapter's device model string
    tflops: dict[str, float]  # keys from DATASHEET_KEYS: the dense figures
    source: str
    note: str = ""
    # The 2:4-sparse figures where the vendor publishes them too (often the headline ones): kept only so
    # that a test can check the table holds the dense half, never looked up.
    sparse_tflops: dict[str, float] = field(default_factory=dict)
    # Memory (HBM) bandwidth in GB/s (10^9 bytes/s) per variant: (regex on the device model string, GB/s,
    # source), the first match wins; a part sold with several memories (A100 40 and 80 GB) lists each, and a
    # name that says none of them gets no figure (``datasheet_bandwidth_gbps``).
    memory_gbps: tuple[tuple[str, float, str], ...] = ()


# One entry per device *as torch sees it*: an MI250 package is two GCDs, i.e. two torch devices.
# The first pattern that matches wins, so a name that contains another's comes first where it must.
DATASHEET: tuple[DatasheetPeak, ...] = (
    DatasheetPeak(
        "NVIDIA A100", r"\bA100\b",
        {"fp32": 19.5, "tf32": 156.0, "fp16": 312.0, "bf16": 312.0},
        "NVIDIA A100 Tensor Core GPU datasheet (2021), dense figures (the starred ones are 2:4 sparse)",
        sparse_tflops={"tf32": 312.0, "fp16": 624.0, "bf16": 624.0},
        memory_gbps=((r"80\s?GB.*PCIe|PCIe.*80\s?GB", 1935.0,
                      "NVIDIA A100 datasheet (2021), 80GB PCIe: 1,935 GB/s HBM2e"),
                     (r"80\s?GB", 2039.0, "NVIDIA A100 datasheet (2021), 80GB SXM: 2,039 GB/s HBM2e"),
                     (r"40\s?GB", 1555.0, "NVIDIA A100 datasheet (2021), 40GB: 1,555 GB/s HBM2")),
    ),
    DatasheetPeak(
        "NVIDIA H100 SXM", r"\bH100\b(?!.*PCIe)",
        {"fp32": 67.0, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4, "fp8": 1978.9},
        "NVIDIA H100 Tensor Core GPU datasheet, SXM5 column, dense (half the sparse figures)",
        sparse_tflops={"tf32": 989.4, "fp16": 1978.9, "bf16": 1978.9, "fp8": 3957.8},
        memory_gbps=(("", 3350.0, "NVIDIA H100 datasheet, SXM5 column: 3.35 TB/s HBM3"),),
    ),
    DatasheetPeak(
        "NVIDIA H100 PCIe", r"\bH100\b.*PCIe",
        {"fp32": 51.2, "tf32": 378.0, "fp16": 756.0, "bf16": 756.0, "fp8": 1513.0},
        "NVIDIA H100 Tensor Core GPU datasheet, PCIe column, dense (half the sparse figures)",
        sparse_tflops={"tf32": 756.0, "fp16": 1513.0, "bf16": 1513.0, "fp8": 3026.0},
        memory_gbps=(("", 2000.0, "NVIDIA H100 datasheet, PCIe column: 2 TB/s HBM2e"),),
    ),
    DatasheetPeak(
        "NVIDIA H200", r"\bH200\b",
        {"fp32": 67.0, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4, "fp8": 1978.9},
        "NVIDIA H200 Tensor Core GPU datasheet, SXM column, dense (half the sparse figures)",
        sparse_tflops={"tf32": 989.4, "fp16": 1978.9, "bf16": 1978.9, "fp8": 3957.8},
        memory_gbps=(("", 4800.0, "NVIDIA H200 datasheet, SXM column: 4.8 TB/s HBM3e"),),
    ),
    DatasheetPeak(
        # \b keeps "NVIDIA GB200" (the Grace-Blackwell part, clocked higher at 1,200 W) out of this entry.
        "NVIDIA B200 (HGX, 1,000 W)", r"\bB200\b",
        {"fp32": 75.0, "tf32": 1100.0, "fp16": 2250.0, "bf16": 2250.0, "fp8": 4500.0},
        "NVIDIA HGX B200 datasheet, per-GPU figures; its tensor-core figures are 2:4 sparse, the table holds half",
        note="the datasheet's TF32 2.2, FP16/BF16 4.5 and FP8 9 PFLOPS are sparse figures; dense is half of each",
        sparse_tflops={"tf32": 2200.0, "fp16": 4500.0, "bf16": 4500.0, "fp8": 9000.0},
        memory_gbps=(("", 8000.0, "NVIDIA HGX B200 datasheet, per GPU: 8 TB/s HBM3e"),),
    ),
    DatasheetPeak(
        "AMD MI250 (per GCD)", r"MI250(?!X)",
        {"fp32": 45.25, "fp16": 181.05, "bf16": 181.05},
        "AMD Instinct MI250 datasheet: 90.5 TFLOPS FP32 matrix, 362.1 FP16/BF16 per package of 2 GCDs",
        note="torch sees each GCD as one device, so the package figures are halved; fp32 is the matrix-core rate",
        memory_gbps=(("", 1638.4, "AMD Instinct MI250 datasheet: 3,276.8 GB/s HBM2e per package of 2 GCDs, "
                                 "halved per GCD as the FLOP/s are"),),
    ),
    DatasheetPeak(
        "AMD MI250X (per GCD)", r"MI250X",
        {"fp32": 47.85, "fp16": 191.5, "bf16": 191.5},
        "AMD Instinct MI250X datasheet: 95.7 TFLOPS FP32 matrix, 383 FP16/BF16 per package of 2 GCDs",
        note="torch sees each GCD as one device, so the package figures are halved",
        memory_gbps=(("", 1638.4, "AMD Instinct MI250X datasheet: 3,276.8 GB/s HBM2e per package of 2 GCDs, "
                                 "halved per GCD"),),
    ),
    DatasheetPeak(
        "AMD MI300X", r"MI300X",
        {"fp32": 163.4, "fp16": 1307.4, "bf16": 1307.4, "fp8": 2614.9},
        "AMD Instinct MI300X datasheet, dense matrix figures",
        note="the datasheet's 'with structured sparsity' figures are twice these; fp32 is the matrix-core rate",
        sparse_tflops={"fp16": 2614.9, "bf16": 2614.9, "fp8": 5229.8},
        memory_gbps=(("", 5300.0, "AMD Instinct MI300X datasheet: 5.3 TB/s HBM3"),),
    ),
    DatasheetPeak(
        "AMD MI325X", r"MI325X",
        {"fp32": 163.4, "fp16": 1307.4, "bf16": 1307.4, "fp8": 2614.9},
        "AMD Instinct MI325X datasheet, dense matrix figures (the MI300X's compute with 256 GB HBM3E)",
        note="the datasheet's 'with structured sparsity' figures are twice these; fp32 is the matrix-core rate",
        sparse_tflops={"fp16": 2614.9, "bf16": 2614.9, "fp8": 5229.8},
        memory_gbps=(("", 6000.0, "AMD Instinct MI325X datasheet: 6 TB/s HBM3E"),),
    ),
    DatasheetPeak(
        "AMD MI355X", r"MI355X",
        {"fp32": 157.3, "fp16": 2516.6, "bf16": 2516.6, "fp8": 5033.2},
        "AMD Instinct MI355X datasheet, dense matrix figures",
        note="about 5 PFLOPS FP16/BF16 is the structured-sparsity figure, about 5 PFLOPS FP8 the dense one: the "
             "table holds the dense ones; CDNA 4 has no TF32 matrix path, so there is no tf32 entry",
        sparse_tflops={"fp16": 5033.2, "bf16": 5033.2, "fp8": 10066.4},
        memory_gbps=(("", 8000.0, "AMD Instinct MI355X datasheet: 8 TB/s HBM3E"),),
    ),
    DatasheetPeak(
        "Intel Gaudi2", r"Gaudi ?2|HL-225",
        {"bf16": 432.0},
        "Habana Gaudi2 MME bf16 peak as used in public MFU comparisons (docs/study.md, reference figures)",
        memory_gbps=(("", 2450.0, "Habana Gaudi2 datasheet: 96 GB HBM2E at 2.45 TB/s"),),
    ),
    DatasheetPeak(
        "Intel Gaudi 3", r"Gaudi ?3|HL-325",
        {"bf16": 1835.0, "fp8": 1835.0},
        "Intel Gaudi 3 AI Accelerator white paper: 1,835 TFLOPS BF16 and FP8 on its matrix engines (MME)",
        note="Gaudi 3 publishes no sparse figure; its fp32 and fp16 matmuls are not given as matrix-engine peaks",
        memory_gbps=(("", 3670.0, "Intel Gaudi 3 AI Accelerator white paper: 128 GB HBM2e at 3.67 TB/s"),),
    ),
    DatasheetPeak(
        "Intel Data Center GPU Max 1550 (per stack)", r"Max 1550",
        {"fp32": 26.2, "tf32": 209.7, "fp16": 419.4, "bf16": 419.4},
        "Intel Data Center GPU Max Series product brief, Max 1550: 52.4 TFLOPS FP32 vector, 419.4 TF32 and 838.9 BF16/FP16 "
        "XMX per GPU of 2 stacks at 1.6 GHz",
        note="each of the 2 stacks is one torch device under Level Zero's flat hierarchy (Aurora's default), so the "
             "GPU's figures are halved; no sparse figure is published. The figure is at the 1.6 GHz peak clock: "
             "a tool that counts a lower sustained clock (1.3 GHz) reads a higher MFU from the same run",
        memory_gbps=(("", 1638.4, "Intel Data Center GPU Max Series product brief, Max 1550: 3,276.8 GB/s "
                                 "HBM2e per GPU of 2 stacks, halved per stack"),),
    ),
)

# Devices whose vendor publishes no peak at all: no datasheet MFU, with this reason (and the MFU
# against the measured peak as on every device).
NO_DATASHEET: tuple[tuple[str, str], ...] = (
    (r"\bApple\b", "Apple publishes no matrix-throughput (TFLOP/s) figure for its GPUs"),
)


class MFUError(RuntimeError):
    """An MFU above 100 %: the FLOP count, the timing or the peak is wrong."""


def lookup_datasheet(device_model: str) -> DatasheetPeak | None:
    """The datasheet entry whose pattern matches ``device_model``, or None."""
    for entry in DATASHEET:
        if re.search(entry.pattern, device_model, flags=re.IGNORECASE):
            return entry
    return None


def datasheet_peak_tflops(device_model: str, precision: str, *, tf32: bool = False) -> tuple[float | None, str]:
    """(peak TFLOP/s, source) for a device and precision; (None, reason) when not known.

    With ``tf32`` on, fp32 matmuls run on TF32 tensor cores, so the tf32 peak applies.
    """
    entry = lookup_datasheet(device_model)
    if entry is None:
        for pattern, reason in NO_DATASHEET:
            if re.search(pattern, device_model, flags=re.IGNORECASE):
                return None, f"{reason} (device {device_model!r})"
        return None, f"no datasheet peak known for device {device_model!r}"
    key = "tf32" if precision == "fp32" and tf32 and "tf32" in entry.tflops else precision
    if key not in entry.tflops:
        return None, f"datasheet for {entry.device} gives no {key} peak"
    return entry.tflops[key], entry.source


def mfu_pct(achieved_tflops: float, peak_tflops: float | None) -> float | None:
    """Model FLOPs utilisation in percent; None when the peak is unknown.

    Raises MFUError above 100 %: a physically impossible figure means a bug upstream.
    """
    if peak_tflops is None:
        return None
    value = 100.0 * achieved_tflops / peak_tflops
    if value > 100.0:
        raise MFUError(f"MFU {value:.1f} % exceeds 100 % ({achieved_tflops:.3f} of {peak_tflops:.3f} TFLOP/s): "
                       "the FLOP count, the timing or the peak is wrong")
    return value


def mfu_metrics(achieved_tflops: float, device_model: str, precision: str, measured: dict | None, *,
                tf32: bool = False) -> dict:
    """A point's MFU both ways, as record metrics: against the datasheet (with its source, or the
    reason there is none; above 100 % raises MFUError) and against the run's measured peak
    (``measured``: a ``MeasuredPeak`` as a dict, or None)."""
    peak, source = datasheet_peak_tflops(device_model, precision, tf32=tf32)
    metrics = {"peak_tflops_datasheet": peak, "mfu_pct": mfu_pct(achieved_tflops, peak),
               "datasheet_source" if peak is not None else "mfu_reason": source}
    return metrics | mfu_measured(achieved_tflops, MeasuredPeak(**measured) if measured else None)


def mfu_measured(achieved_tflops: float, peak: "MeasuredPeak | None") -> dict:
    """MFU against the measured matmul peak, as record metrics.

    Unlike the datasheet, a measured peak can be unlucky (another process ran while it was
    measured, or no probed shape found the device's best kernel): a point above 100 % of it
    keeps its times and figure, flagged ``mfu_measured_unreliable`` with the reason.
    """
    if peak is None:
        return {"peak_tflops_measured": None, "mfu_measured_pct": None,
                "mfu_measured_reason": "matmul peak not measured (measure_peak is false)"}
    value = 100.0 * achieved_tflops / peak.tflops
    out = {"peak_tflops_measured": peak.tflops, "mfu_measured_pct": value, "peak_measured_shape": peak.best_shape}
    if value > 100.0:
        out["mfu_measured_unreliable"] = True
        out["mfu_measured_reason"] = (
            f"the workload ran at {value:.0f} % of the measured matmul peak ({achieved_tflops:.4f} against "
            f"{peak.tflops:.4f} TFLOP/s, best of {len(peak.per_shape_tflops)} shapes): the peak measurement "
            "was unlucky (a busy machine) or missed the device's best kernel; the point's times stand")
    return out


@dataclass
class MeasuredPeak:
    """Best matmul rate measured on this device for one precision, over square sizes and workload shapes."""

    precision: str
    tflops: float
    best_shape: str  # "n" for a square product, "MxKxN" for a workload shape
    per_shape_tflops: dict[str, float] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)  # shapes predicted to take over the product time limit

    def best_of(self, other: "MeasuredPeak | None") -> "MeasuredPeak":
        """The higher of two measurements (before and after a sweep: a busy moment only lowers a peak)."""
        if other is None or other.tflops <= self.tflops:
            return self
        return other

    def to_dict(self) -> dict:
        return asdict(self)


Shape = tuple[int, int, int]  # (M, K, N): an (M, K) @ (K, N) product

# Stop growing a product once one takes longer than this: the peak never takes minutes.
MAX_PRODUCT_S = 1.0


def measure_matmul_peak(adapter: DeviceAdapter, precision: str, *, sizes: tuple[int, ...] | None = None,
                        shapes: tuple[Shape, ...] = (), max_product_s: float = MAX_PRODUCT_S,
                        warmup: int = 1, trials: int = 3) -> MeasuredPeak:
    """Measure the best matmul rate of the device for ``precision``.

    Square products of ``sizes`` (default: the adapter's), ascending, then ``shapes`` (the
    workload's own GEMMs: a block's products are far from square, and on some CPUs they run
    faster than any square size). A product predicted, from the best rate so far, to take
    longer than ``max_product_s`` is skipped and listed; so is every larger square once one
    has taken that long. Each product's rate is its best of ``trials`` (a peak is what the
    device can do; interference only lowers it).
    """
    device = adapter.torch_device()
    dtype = dtype_of(precision)
    gen = torch.Generator(device="cpu").manual_seed(0)
    candidates: list[tuple[str, Shape]] = [(str(n), (n, n, n)) for n in sorted(sizes or adapter.peak_sizes())]
    candidates += [(f"{m}x{k}x{n}", (m, k, n)) for m, k, n in dict.fromkeys(shapes)]
    per_shape: dict[str, float] = {}
    skipped: list[str] = []
    best_rate = 0.0  # FLOP/s
    squares_done = False
    for label, (m, k, n) in candidates:
        flop = 2 * m * k * n
        square = m == k == n and label == str(m)
        if (square and squares_done) or (best_rate and flop / best_rate > max_product_s):
            skipped.append(label)
            continue
        a = torch.randn(m, k, generator=gen).to(device=device, dtype=dtype)
        b = torch.randn(k, n, generator=gen).to(device=device, dtype=dtype)
        timing = measure(functools.partial(torch.mm, a, b), adapter.synchronize, warmup=warmup, trials=trials)
        per_shape[label] = flop / timing.min_s / 1e12
        best_rate = max(best_rate, flop / timing.min_s)
        if square and timing.min_s > max_product_s:
            squares_done = True
        del a, b  # free this shape's operands before the next one is allocated
    best = max(per_shape, key=per_shape.__getitem__)
    return MeasuredPeak(precision, per_shape[best], best, per_shape, skipped)


# --- memory bandwidth: the datasheet's and a measured one, and MBU against each

class MBUError(RuntimeError):
    """An MBU above 100 % of the datasheet bandwidth: the byte count, the timing or the figure is wrong."""


def datasheet_bandwidth_gbps(device_model: str) -> tuple[float | None, str]:
    """(memory bandwidth GB/s, source) for a device; (None, reason) when not known."""
    entry = lookup_datasheet(device_model)
    if entry is None:
        return None, f"no datasheet memory bandwidth known for device {device_model!r}"
    for pattern, gbps, source in entry.memory_gbps:
        if re.search(pattern, device_model, flags=re.IGNORECASE):
            return gbps, source
    if entry.memory_gbps:
        variants = ", ".join(f"{g:g} GB/s ({s})" for _, g, s in entry.memory_gbps)
        return None, (f"{entry.device}'s bandwidth depends on its memory, which {device_model!r} does not say: "
                      f"{variants}")
    return None, f"datasheet for {entry.device} gives no memory bandwidth"


def mbu_pct(achieved_gbps: float, peak_gbps: float | None) -> float | None:
    """Memory bandwidth utilisation in percent; None when the bandwidth is unknown.

    Raises MBUError above 100 %, as ``mfu_pct`` raises MFUError: a step cannot read faster than its memory."""
    if peak_gbps is None:
        return None
    value = 100.0 * achieved_gbps / peak_gbps
    if value > 100.0:
        raise MBUError(f"MBU {value:.1f} % exceeds 100 % ({achieved_gbps:.1f} of {peak_gbps:.1f} GB/s): "
                       "the byte count, the timing or the bandwidth is wrong")
    return value


@dataclass
class MeasuredBandwidth:
    """Best memory bandwidth measured on this device: a copy (b = a: 2 bytes moved per byte) and a triad
    (a = b + s c: 3), over arrays of several sizes, best of the trials of each."""

    gbps: float
    best_kernel: str  # "copy 256MiB", "triad 256MiB"
    per_kernel_gbps: dict[str, float] = field(default_factory=dict)

    def best_of(self, other: "MeasuredBandwidth | None") -> "MeasuredBandwidth":
        """The higher of two measurements (a busy moment only lowers a bandwidth)."""
        return self if other is None or other.gbps <= self.gbps else other

    def to_dict(self) -> dict:
        return asdict(self)


# Arrays well past every last-level cache (an H200's L2 is 60 MB, an EPYC's L3 up to 384 MB per socket).
BANDWIDTH_ARRAY_MIB: tuple[int, ...] = (512,)


def measure_memory_bandwidth(adapter: DeviceAdapter, *, sizes_mib: tuple[int, ...] = BANDWIDTH_ARRAY_MIB,
                             warmup: int = 1, trials: int = 5) -> MeasuredBandwidth:
    """Measure the device's memory bandwidth through torch: ``copy_`` and a triad (``torch.add(b, c, alpha=s,
    out=a)``) on fp32 arrays of ``sizes_mib`` each, timed by ``accel_kit.timing.measure`` (synchronised), the
    best trial's rate kept. Bytes moved: copy reads one array and writes one; the triad reads two, writes one."""
    device = adapter.torch_device()
    per_kernel: dict[str, float] = {}
    for mib in sizes_mib:
        n = mib * 2**20 // 4
        a, b, c = (torch.ones(n, device=device) for _ in range(3))
        kernels = {"copy": (functools.partial(a.copy_, b), 2),
                   "triad": (functools.partial(torch.add, b, c, alpha=2.0, out=a), 3)}
        for name, (fn, arrays) in kernels.items():
            timing = measure(fn, adapter.synchronize, warmup=warmup, trials=trials)
            per_kernel[f"{name} {mib}MiB"] = arrays * n * 4 / timing.min_s / 1e9
        del a, b, c
    best = max(per_kernel, key=per_kernel.__getitem__)
    return MeasuredBandwidth(per_kernel[best], best, per_kernel)


def mbu_metrics(achieved_gbps: float, device_model: str, measured: dict | None) -> dict:
    """A decode's MBU both ways, as record metrics: against the datasheet bandwidth (with its source, or the
    reason there is none; above 100 % raises MBUError) and against the measured one (``measured``: a
    ``MeasuredBandwidth`` as a dict, or None; above 100 % of it is flagged unreliable, as the measured MFU is)."""
    peak, source = datasheet_bandwidth_gbps(device_model)
    out = {"bandwidth_gbps_datasheet": peak, "mbu_pct": mbu_pct(achieved_gbps, peak),
           "bandwidth_source" if peak is not None else "mbu_reason": source}
    if measured is None:
        return out | {"bandwidth_gbps_measured": None, "mbu_measured_pct": None,
                      "mbu_measured_reason": "memory bandwidth not measured"}
    bandwidth = MeasuredBandwidth(**measured)
    value = 100.0 * achieved_gbps / bandwidth.gbps
    out |= {"bandwidth_gbps_measured": bandwidth.gbps, "mbu_measured_pct": value}
    if value > 100.0:
        out["mbu_measured_unreliable"] = True
        out["mbu_measured_reason"] = (
            f"the step read at {value:.0f} % of the measured bandwidth ({achieved_gbps:.1f} against "
            f"{bandwidth.gbps:.1f} GB/s, {bandwidth.best_kernel}): a busy machine during the measurement, or the "
            "step's bytes stayed in a cache; the point's times stand")
    return out
