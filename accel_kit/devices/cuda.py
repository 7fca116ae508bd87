"""NVIDIA GPUs (CUDA build of torch) and AMD GPUs (ROCm/HIP build, same torch.cuda API)."""
from __future__ import annotations

from typing import Any

import torch

from accel_kit.devices.base import Availability, DeviceDescription


class CUDAAdapter:
    name = "cuda"

    def availability(self) -> Availability:
        if torch.version.cuda is None:
            why = "this torch is a ROCm build" if torch.version.hip else "this torch has no CUDA support"
            return Availability(False, why)
        if not torch.cuda.is_available():
            return Availability(False, "no NVIDIA GPU is visible (torch.cuda.is_available() is False)")
        return Availability(True)

    def torch_device(self, index: int = 0) -> torch.device:
        return torch.device("cuda", index)

    def synchronize(self) -> None:
        torch.cuda.synchronize()

    def supported_precisions(self) -> tuple[str, ...]:
        precisions = ["fp32", "fp16"]
        if torch.cuda.is_bf16_supported():
            precisions.append("bf16")
        return tuple(precisions)

    def reset_peak_memory(self) -> None:
        torch.cuda.reset_peak_memory_stats()

    def peak_memory_bytes(self) -> int | None:
        return torch.cuda.max_memory_allocated()

    def total_memory_bytes(self) -> int | None:
        return torch.cuda.get_device_properties(0).total_memory

    def distributed_backend(self) -> str:
        return "nccl"  # on ROCm builds torch maps "nccl" to RCCL

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

    def math_mode(self) -> dict[str, Any]:
        return {
            "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
            "tf32_cudnn": torch.backends.cudnn.allow_tf32,
        }

    def set_tf32(self, enabled: bool) -> None:
        torch.backends.cuda.matmul.allow_tf32 = enabled
        torch.backends.cudnn.allow_tf32 = enabled
