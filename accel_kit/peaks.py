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
from dataclasses import dataclass, field

import torch

from accel_kit.devices.base import DeviceAdapter, dtype_of
from accel_kit.timing import measure


@dataclass(frozen=True)
class DatasheetPeak:
    """Dense (no structured sparsity) peak of one device for each precision, in TFLOP/s."""

    device: str  # canonical name
    pattern: str  # regex matched (case-insensitive) against the adapter's device model string
    tflops: dict[str, float]  # keys: fp32, tf32, fp16, bf16
    source: str
    note: str = ""


# One entry per device *as torch sees it*: an MI250 package is two GCDs, i.e. two torch devices.
DATASHEET: tuple[DatasheetPeak, ...] = (
    DatasheetPeak(
        "NVIDIA A100", r"\bA100\b",
        {"fp32": 19.5, "tf32": 156.0, "fp16": 312.0, "bf16": 312.0},
        "NVIDIA A100 Tensor Core GPU datasheet (2021), dense figures (the starred ones are 2:4 sparse)",
    ),
    DatasheetPeak(
        "NVIDIA H100 SXM", r"\bH100\b(?!.*PCIe)",
        {"fp32": 67.0, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4},
        "NVIDIA H100 Tensor Core GPU datasheet, SXM5 column, dense (half the sparse figures)",
    ),
    DatasheetPeak(
        "NVIDIA H100 PCIe", r"\bH100\b.*PCIe",
        {"fp32": 51.2, "tf32": 378.0, "fp16": 756.0, "bf16": 756.0},
        "NVIDIA H100 Tensor Core GPU datasheet, PCIe column, dense (half the sparse figures)",
    ),
    DatasheetPeak(
        "NVIDIA H200", r"\bH200\b",
        {"fp32": 67.0, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4},
        "NVIDIA H200 Tensor Core GPU datasheet, SXM column, dense (half the sparse figures)",
    ),
    DatasheetPeak(
        "AMD MI250 (per GCD)", r"MI250(?!X)",
        {"fp32": 45.25, "fp16": 181.05, "bf16": 181.05},
        "AMD Instinct MI250 datasheet: 90.5 TFLOPS FP32 matrix, 362.1 FP16/BF16 per package of 2 GCDs",
        note="torch sees each GCD as one device, so the package figures are halved; fp32 is the matrix-core rate",
    ),
    DatasheetPeak(
        "AMD MI250X (per GCD)", r"MI250X",
        {"fp32": 47.85, "fp16": 191.5, "bf16": 191.5},
        "AMD Instinct MI250X datasheet: 95.7 TFLOPS FP32 matrix, 383 FP16/BF16 per package of 2 GCDs",
        note="torch sees each GCD as one device, so the package figures are halved",
    ),
    DatasheetPeak(
        "AMD MI300X", r"MI300X",
        {"fp32": 163.4, "fp16": 1307.4, "bf16": 1307.4},
        "AMD Instinct MI300X datasheet, dense matrix figures",
    ),
    DatasheetPeak(
        "Intel Gaudi2", r"Gaudi ?2|HL-225",
        {"bf16": 432.0},
        "Habana Gaudi2 MME bf16 peak as used in public MFU comparisons (docs/study.md, reference figures)",
    ),
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


@dataclass
class MeasuredPeak:
    """Best matmul rate measured on this device for one precision."""

    precision: str
    tflops: float
    best_size: int
    per_size_tflops: dict[int, float] = field(default_factory=dict)
    trials: int = 0

    def to_dict(self) -> dict:
        return {"precision": self.precision, "tflops": self.tflops, "best_size": self.best_size,
                "per_size_tflops": {str(k): v for k, v in self.per_size_tflops.items()}, "trials": self.trials}


def default_peak_sizes(adapter: DeviceAdapter) -> tuple[int, ...]:
    # Large enough to saturate the device, small enough to finish in seconds: a GPU needs
    # 8192^2 operands to fill its tensor cores; 2 CPU cores are saturated by 2048-4096.
    return (1024, 2048, 4096) if adapter.name == "cpu" else (4096, 8192)


def measure_matmul_peak(adapter: DeviceAdapter, precision: str, *, sizes: tuple[int, ...] | None = None,
                        warmup: int = 3, trials: int = 5) -> MeasuredPeak:
    """Measure the best square-GEMM rate (C = A @ B, n x n) of the device for ``precision``.

    The median of ``trials`` timed products is taken per size; the peak is the best size.
    """
    device = adapter.torch_device()
    dtype = dtype_of(precision)
    per_size: dict[int, float] = {}
    gen = torch.Generator(device="cpu").manual_seed(0)
    for n in sizes or default_peak_sizes(adapter):
        a = torch.randn(n, n, generator=gen).to(device=device, dtype=dtype)
        b = torch.randn(n, n, generator=gen).to(device=device, dtype=dtype)
        timing = measure(functools.partial(torch.mm, a, b), adapter.synchronize, warmup=warmup, trials=trials)
        per_size[n] = 2 * n**3 / timing.median_s / 1e12
        del a, b  # free this size's operands before the next, larger size is allocated
    best = max(per_size, key=per_size.__getitem__)
    return MeasuredPeak(precision, per_size[best], best, per_size, trials)
