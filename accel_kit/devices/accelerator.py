"""Every torch backend that ``torch.accelerator`` serves (Intel GPUs' ``xpu``, Apple's ``mps``, ``cuda``, ...), in one adapter.

Since torch 2.6 a backend registers itself with ``torch.accelerator``: current device, device count,
synchronize, memory statistics and streams are then the same calls whatever the device. An
accelerator that behaves like that needs no module of its own here: its system file names
``adapter: accelerator`` (and ``options: {device_type: xpu}`` to insist on one backend), and what
differs between backends is *found from torch*, not written per device:

- the collective: the backend torch.distributed maps the device type to
  (``Backend.default_device_backend_map``: nccl for cuda, xccl for xpu, gloo for mps; a vendor
  plugin that registers its own adds to it), gloo where none is registered;
- autocast: ``torch.amp.is_autocast_available(device_type)`` (fp16 trains under autocast here);
- torch's fused AdamW: whether the device type is among those its fused kernels support.

``cuda`` and ``rocm`` are thin subclasses (``accel_kit.devices.cuda``) that keep only what their
GPUs add (TF32, NVML / AMD SMI energy, 2:4 sparse kernels). Nothing here has run on an Intel or
Apple GPU: on this project's CPU-only torch, ``current_accelerator()`` is None and the adapter says so.
"""
from __future__ import annotations

import contextlib
import subprocess
import sys
from typing import Mapping

import torch
from pydantic import BaseModel, ConfigDict, field_validator
from torch import nn

from accel_kit.devices._vendor import parse_options
from accel_kit.devices.base import Availability, BaseAdapter, DeviceDescription, PrecisionSupport
from accel_kit.errors import UnavailableError
from accel_kit.json_types import JSONObject

# Where no collective is registered for a device type, torch.distributed's host backend still works
# (tensors go through host memory), so a point runs, slower, rather than not at all.
FALLBACK_COLLECTIVE = "gloo"


def collective_backend(device_type: str, registry: Mapping[str, str] | None = None) -> str:
    """The torch.distributed backend for tensors of ``device_type``: the one ``registry`` maps it to
    (default: torch's own map, which vendor plugins extend when they register a backend), else gloo."""
    if registry is None:
        registry = _torch_collectives()
    return registry.get(device_type, FALLBACK_COLLECTIVE)


def _torch_collectives() -> Mapping[str, str]:
    import torch.distributed as dist

    if not dist.is_available():
        return {}
    return dict(dist.Backend.default_device_backend_map)


def fused_adamw_available(device_type: str) -> bool:
    """Whether torch's fused AdamW has kernels for ``device_type`` (torch's own list of such devices)."""
    try:  # a private helper of torch.optim; if it moves, say "no" rather than guess
        from torch.utils._foreach_utils import _get_fused_kernels_supported_devices
    except ImportError:
        return False
    return device_type in _get_fused_kernels_supported_devices()


def autocast_available(device_type: str) -> bool:
    """Whether ``torch.autocast`` runs on ``device_type``."""
    return bool(torch.amp.is_autocast_available(device_type))


class AcceleratorOptions(BaseModel):
    """``options:`` of a system on the generic adapter (params/systems/max1550.yaml, mps.yaml)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # The torch device type the system is (xpu, mps, ...): a torch built for another backend is then
    # "not available" with the reason, instead of running the system's points on a different device.
    # None: whichever backend this torch was built with.
    device_type: str | None = None

    @field_validator("device_type")
    @classmethod
    def _torch_knows_it(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                torch.device(value)
            except RuntimeError:
                raise ValueError(f"{value!r} is not a torch device type") from None
        return value


class AcceleratorAdapter(BaseAdapter):
    name = "accelerator"
    device_type: str | None = None  # a subclass for one backend pins it (cuda)

    def configure(self, options: JSONObject) -> None:
        self.options = parse_options(self.name, AcceleratorOptions, options)
        self.device_type = self.options.device_type

    # --- presence and placement

    def availability(self) -> Availability:
        current = torch.accelerator.current_accelerator()
        wanted = f"; the system needs {self.device_type}" if self.device_type else ""
        if current is None:
            return Availability(False, "this torch is built for no accelerator "
                                       f"(torch.accelerator.current_accelerator() is None){wanted}")
        if self.device_type and current.type != self.device_type:
            return Availability(False, f"this torch's accelerator is {current.type}, not {self.device_type}")
        if not torch.accelerator.is_available():
            return Availability(False, f"no {current.type} device is visible (torch.accelerator.is_available() is False)")
        return Availability(True)

    def backend(self) -> str:
        """The torch device type this adapter runs on; an UnavailableError where torch has no accelerator."""
        if self.device_type:
            return self.device_type
        current = torch.accelerator.current_accelerator()
        if current is None:
            raise UnavailableError(self.availability().reason)
        return current.type

    def torch_device(self, index: int = 0) -> torch.device:
        return torch.device(self.backend(), index)

    def prepare(self, local_rank: int = 0) -> torch.device:
        device = self.torch_device(local_rank)
        torch.accelerator.set_device_index(device)  # before the collective initialises and before any allocation
        return device

    def synchronize(self) -> None:
        torch.accelerator.synchronize()

    def empty_cache(self) -> None:
        torch.accelerator.empty_cache()

    def decode_compile_mode(self) -> str | None:
        # CUDA (and ROCm, behind torch.cuda) replay the step as one captured graph: on an H200, 4.8 ms a token
        # against 18.8 eager for Llama 3.1 8B (docs/benchmarks.md); elsewhere compiling buys little for its minutes
        return "reduce-overhead" if self.backend() == "cuda" else None

    def timing_event(self) -> torch.Event | None:
        # torch's device-generic event: CUDA's, ROCm's (HIP behind torch.cuda) and XPU's alike
        return torch.Event(device=self.backend(), enable_timing=True)

    # --- precision: what the backend can run; how fast each runs is the measured matmul peak's to say

    def supported_precisions(self) -> tuple[str, ...]:
        return tuple(p for p in ("fp32", "fp16", "bf16") if self._runs(p)[0])

    def precision_support(self, precision: str) -> PrecisionSupport:
        runs, why = self._runs(precision)
        return PrecisionSupport(precision, runs, why)

    def _runs(self, precision: str) -> tuple[bool, str]:
        kind = self.backend()
        if precision == "fp32":
            return True, f"fp32 on {kind}"
        if precision == "fp16" and not autocast_available(kind):
            return False, f"fp16 trains under autocast, which torch does not offer on {kind}"
        dtype = torch.float16 if precision == "fp16" else torch.bfloat16
        module = torch.get_device_module(kind)
        if precision == "bf16" and hasattr(module, "is_bf16_supported") and not module.is_bf16_supported():
            return False, f"torch.{kind}.is_bf16_supported() is False on this device"
        try:  # the backend's own answer: a small product in the dtype runs or raises
            a = torch.ones(8, 8, dtype=dtype, device=self.torch_device())
            (a @ a).sum().item()
        except (RuntimeError, TypeError) as exc:
            return False, f"a {precision} product does not run on {kind}: {str(exc).splitlines()[0] if str(exc) else exc}"
        return True, f"{precision} products run on {kind} (speed: see the measured matmul peak)"

    def math_mode(self) -> JSONObject:
        return {"fp32_matmul_precision": torch.get_float32_matmul_precision()}

    # --- memory: torch.accelerator's allocator statistics, None where a backend keeps none

    def reset_peak_memory(self) -> None:
        with contextlib.suppress(RuntimeError, NotImplementedError):
            torch.accelerator.reset_peak_memory_stats()

    def peak_memory_bytes(self) -> int | None:
        try:
            return torch.accelerator.max_memory_allocated()
        except (RuntimeError, NotImplementedError):
            return None

    def total_memory_bytes(self) -> int | None:
        try:
            return torch.accelerator.get_memory_info()[1]  # (free, total) of the current device
        except (RuntimeError, NotImplementedError):
            return None

    def peak_sizes(self) -> tuple[int, ...]:
        return (4096, 8192)  # a GPU's matrix units need operands this large to fill

    # --- collectives and optimizer, from the backend

    def distributed_backend(self) -> str:
        return collective_backend(self.backend())

    def wrap_ddp(self, model: nn.Module, device: torch.device) -> nn.Module:
        from torch.nn.parallel import DistributedDataParallel as DDP

        return DDP(model, device_ids=[device.index] if device.index is not None else None)

    def fused_optimizer(self) -> bool:
        return fused_adamw_available(self.backend())

    def unsupported_context_parallel(self) -> str | None:
        # torch's ring attention takes over the fused SDPA ops of the cuda device type (flash, memory-efficient,
        # cuDNN; a ROCm build dispatches the same ops); no other backend's kernels have a handler there.
        backend = self.backend()
        if backend == "cuda":
            return None
        return (f"context parallelism does not run on {backend}: torch's context_parallel shards only the cuda "
                "device type's fused SDPA kernels (flash, memory-efficient, cuDNN)")

    # --- provenance

    def device_name(self, index: int = 0) -> str:
        """What the vendor calls the device: the backend's ``get_device_name`` where it has one; on a
        system-on-chip without one (Apple's), the chip's name, which names its GPU."""
        module = torch.get_device_module(self.backend())
        if hasattr(module, "get_device_name"):
            return module.get_device_name(index)
        return _chip_name() or f"{self.backend()} device"

    def describe(self) -> DeviceDescription:
        kind = self.backend()
        versions = {"torch": torch.__version__}
        if isinstance(getattr(torch.version, kind, None), str):  # torch.version.xpu, ...: the backend's toolkit
            versions[kind] = getattr(torch.version, kind)
        total = self.total_memory_bytes()
        extra: JSONObject = {
            "device_type": kind,
            "collective": self.distributed_backend(),
            "autocast": autocast_available(kind),
            "fused_adamw": self.fused_optimizer(),
            "stream": str(torch.accelerator.current_stream()),
            "total_memory_gib": round(total / 2**30, 2) if total else None,
        }
        with contextlib.suppress(RuntimeError, NotImplementedError):
            extra["capability"] = {k: str(v) for k, v in torch.accelerator.get_device_capability().items()}
        return DeviceDescription(adapter=self.name, device_model=self.device_name(),
                                 device_count=torch.accelerator.device_count(), versions=versions, extra=extra)


def _chip_name() -> str | None:
    """The host chip's marketing name on macOS (e.g. "Apple M3 Max"); None elsewhere or when unreadable."""
    if sys.platform != "darwin":
        return None
    try:
        out = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None
