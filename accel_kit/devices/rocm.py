"""AMD GPUs through PyTorch's ROCm (HIP) build: the torch.cuda API, told apart by torch.version.hip."""
from __future__ import annotations

import torch

from accel_kit.devices.base import Availability
from accel_kit.devices.cuda import CUDAAdapter


class ROCmAdapter(CUDAAdapter):
    name = "rocm"
    # Through Zeus as on NVIDIA. An MI250's second die reports no power of its own (its package's is on
    # the first), so its windows read zero and are recorded as null with that reason.
    energy_api = "amdsmi amdsmi_get_energy_count"

    def energy_meter(self, index: int = 0):
        from accel_kit.devices.power import zeus_gpu_meter

        return zeus_gpu_meter(index, api=self.energy_api)  # Zeus alone: it converts amdsmi's units per version

    def availability(self) -> Availability:
        if not torch.version.hip:
            return Availability(False, "this torch is not a ROCm build (torch.version.hip is None)")
        if not torch.cuda.is_available():
            return Availability(False, "no AMD GPU is visible (torch.cuda.is_available() is False)")
        return Availability(True)

    def supported_precisions(self) -> tuple[str, ...]:
        return ("fp32", "fp16", "bf16")  # CDNA2+ computes all three in its matrix cores

    def sparse_kernel(self, pattern: str, dtype: torch.dtype) -> tuple[str | None, str]:
        return None, "torch's sparse kernels that beat dense (2:4 semi-structured) are NVIDIA-only"

    def math_mode(self) -> dict:
        # MI200/MI300 have no TF32 path in rocBLAS for torch's flag; record it anyway.
        return {"tf32_matmul": torch.backends.cuda.matmul.allow_tf32}
