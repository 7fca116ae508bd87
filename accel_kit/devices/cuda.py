"""NVIDIA GPUs (CUDA build of torch) and AMD GPUs (ROCm/HIP build, same torch.cuda API).

The generic ``torch.accelerator`` adapter (``accel_kit.devices.accelerator``) does the placement,
synchronisation, memory statistics, collective (nccl, RCCL on ROCm), DDP and fused AdamW; this
subclass adds only what CUDA GPUs have beyond it: the build check, bf16 by compute capability,
TF32, NVML energy and the 2:4 sparse tensor-core kernels.
"""
from __future__ import annotations

import torch

from accel_kit.devices.accelerator import AcceleratorAdapter
from accel_kit.devices.base import Availability, BaseAdapter, DeviceDescription, PrecisionSupport
from accel_kit.json_types import JSONObject

# torch's 2:4 semi-structured sparse kernels need Ampere (8.0) or newer.
SEMI_STRUCTURED_MIN_CC = (8, 0)


class CUDAAdapter(AcceleratorAdapter):
    name = "cuda"
    device_type = "cuda"
    configure = BaseAdapter.configure  # no options: the backend is fixed

    def availability(self) -> Availability:
        if torch.version.cuda is None:
            why = "this torch is a ROCm build" if torch.version.hip else "this torch has no CUDA support"
            return Availability(False, why)
        if not torch.cuda.is_available():
            return Availability(False, "no NVIDIA GPU is visible (torch.cuda.is_available() is False)")
        return Availability(True)

    def supported_precisions(self) -> tuple[str, ...]:
        precisions = ["fp32", "fp16"]
        if torch.cuda.is_bf16_supported():
            precisions.append("bf16")
        return tuple(precisions)

    def precision_support(self, precision: str) -> PrecisionSupport:
        # Tensor cores run fp16 on every GPU torch supports, bf16 from Ampere (is_bf16_supported).
        name = torch.cuda.get_device_name()
        if precision == "bf16" and not torch.cuda.is_bf16_supported():
            return PrecisionSupport("bf16", False, f"bf16 has no native path on {name}")
        return PrecisionSupport(precision, True, f"{precision} native on {name}")

    def total_memory_bytes(self) -> int | None:
        return torch.cuda.get_device_properties(0).total_memory

    def sparse_kernel(self, pattern: str, dtype: torch.dtype) -> tuple[str | None, str]:
        name = str(dtype).removeprefix("torch.")
        if pattern != "2:4":
            return "csr", "cuSPARSE CSR products (used only where timed faster than dense)"
        if torch.version.cuda is None:
            return None, "2:4 sparse kernels are NVIDIA tensor-core kernels; this torch is not a CUDA build"
        cc = torch.cuda.get_device_capability()
        if cc < SEMI_STRUCTURED_MIN_CC:
            return None, f"2:4 sparse tensor cores need compute capability >= 8.0, this GPU has {cc[0]}.{cc[1]}"
        if dtype not in (torch.float16, torch.bfloat16):
            return None, f"torch's 2:4 kernels run fp16/bf16 (and int8/fp8), not {name}"
        return "2:4", f"2:4 semi-structured sparse tensor cores (compute capability {cc[0]}.{cc[1]})"

    # The vendor call Zeus makes for this GPU's energy counter (named in the record).
    energy_api = "NVML nvmlDeviceGetTotalEnergyConsumption"

    def energy_meter(self, index: int = 0):
        # Zeus where installed (the "energy" extra); else NVIDIA's bindings read the same counter.
        from accel_kit.devices import power
        from accel_kit.devices._vendor import missing

        if not missing("zeus"):
            return power.zeus_gpu_meter(index, api=self.energy_api)
        return power.nvml_meter(index, uuid=lambda: str(torch.cuda.get_device_properties(index).uuid))

    def describe(self) -> DeviceDescription:
        props = torch.cuda.get_device_properties(0)
        versions = {"torch": torch.__version__}
        if torch.version.cuda:
            versions["cuda"] = torch.version.cuda
        if torch.version.hip:
            versions["hip"] = torch.version.hip
        cudnn = torch.backends.cudnn.version()
        if cudnn:
            versions["cudnn"] = str(cudnn)
        return DeviceDescription(
            adapter=self.name,
            device_model=props.name,
            device_count=torch.cuda.device_count(),
            versions=versions,
            extra={
                "total_memory_gib": round(props.total_memory / 2**30, 2),
                "multiprocessors": props.multi_processor_count,
                "compute_capability": f"{props.major}.{props.minor}",
            },
        )

    def math_mode(self) -> JSONObject:
        return {
            "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
            "tf32_cudnn": torch.backends.cudnn.allow_tf32,
        }

    def set_tf32(self, enabled: bool) -> None:
        torch.backends.cuda.matmul.allow_tf32 = enabled
        torch.backends.cudnn.allow_tf32 = enabled
