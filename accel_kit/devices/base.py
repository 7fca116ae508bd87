"""The device-adapter protocol: what every accelerator backend must answer.

A *device* is one accelerator (a GPU, an IPU, a CPU socket); a *system* (params/systems/)
describes a machine built from devices. Adapters hide the vendor differences that matter
for honest timing: how to synchronise, how to read peak memory, which precisions exist,
which collective backend to use.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch

PRECISIONS = ("fp32", "fp16", "bf16")
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def dtype_of(precision: str) -> torch.dtype:
    """torch dtype for a precision name (fp32 / fp16 / bf16)."""
    return DTYPES[precision]


@dataclass
class Availability:
    """Whether an adapter can run here; ``reason`` says why not."""

    ok: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok


@dataclass
class DeviceDescription:
    """What a result record says about the hardware it ran on."""

    adapter: str
    device_model: str
    device_count: int
    versions: dict[str, str] = field(default_factory=dict)  # driver / SDK / runtime versions
    extra: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class DeviceAdapter(Protocol):
    """One accelerator backend. Implementations import their vendor SDK lazily."""

    name: str  # registry name: "cpu", "cuda", "rocm", ...

    def availability(self) -> Availability:
        """Can this backend run on this machine? Never raises."""

    def torch_device(self, index: int = 0) -> torch.device:
        """The torch device tensors go to."""

    def synchronize(self) -> None:
        """Block until all queued work on the device has finished (before reading a clock)."""

    def supported_precisions(self) -> tuple[str, ...]:
        """Precisions this device computes natively, from ``PRECISIONS``."""

    def reset_peak_memory(self) -> None:
        """Start a new peak-memory window (called before each measurement)."""

    def peak_memory_bytes(self) -> int | None:
        """Peak memory of the window since ``reset_peak_memory``; None when not measurable."""

    def total_memory_bytes(self) -> int | None:
        """Memory one device holds (for fit checks); None when unknown."""

    def distributed_backend(self) -> str:
        """torch.distributed backend name: gloo, nccl (RCCL on ROCm), hccl, ..."""

    def describe(self) -> DeviceDescription:
        """Device model, count and software versions, for provenance."""

    def math_mode(self) -> dict[str, Any]:
        """Settings that change numerics or speed of matmuls (e.g. TF32), for provenance."""

    def set_tf32(self, enabled: bool) -> None:
        """Allow or forbid TF32 (or the device's reduced-precision fp32 matmul)."""
