"""The Cerebras adapter: what the device is (cstorch's CPU backend on the host, or a CS-2 cluster), what
it cannot run and why, and how its job script reads. It needs no cerebras-pytorch: how a point is
built and stepped there (``programming_model``) lives in ``accel_kit.devices.cerebras.model``, imported
only when a point runs.
"""
from __future__ import annotations

import importlib.metadata
import os
import re
import sys

import torch

from accel_kit.devices._vendor import package_version
from accel_kit.devices.base import Availability, BaseAdapter, DeviceDescription, JobLaunch, Placement, PrecisionSupport
from accel_kit.devices.cerebras.jobscript import APPLIANCE_TEMPLATE
from accel_kit.devices.cerebras.options import ENV_PREFIX, MISSING, PACKAGE, USERNODE_CONFIG, CerebrasOptions
from accel_kit.devices.types import BlockPointFields, EagerRuntime, PointFields, TrainPointFields
from accel_kit.json_types import JSONObject


def required_torch(package: str = PACKAGE) -> str | None:
    """The torch version ``package`` pins (``torch (==2.4.0)`` in its metadata), or None."""
    for req in importlib.metadata.requires(package) or []:
        match = re.match(r"torch\s*\(?==\s*([\w.]+)", req)
        if match:
            return match.group(1)
    return None


class CerebrasAdapter(BaseAdapter):
    """A Cerebras system through cstorch: its backend (``options.backend``) says CPU (the host) or CSX (a cluster)."""

    name = "cerebras"

    def __init__(self) -> None:
        self.options = CerebrasOptions()
        self._host = None  # the CPU adapter: the CPU backend runs on the host, so it measures the host

    # ----------------------------------------------------------------------- settings and presence

    def configure(self, options: JSONObject) -> None:
        self.options = CerebrasOptions.from_sources(options)

    @property
    def backend_type(self) -> str:
        return self.options.backend

    @property
    def host(self):
        if self._host is None:
            from accel_kit.devices.cpu import CPUAdapter

            self._host = CPUAdapter()
        return self._host

    def availability(self) -> Availability:
        version = package_version(PACKAGE)
        if version is None:
            return Availability(False, MISSING)
        pinned = required_torch()
        if pinned and not torch.__version__.startswith(pinned):
            return Availability(False, f"{PACKAGE} {version} needs torch {pinned}, this Python ({sys.executable}) "
                                       f"has torch {torch.__version__}; use the environment `make cerebras` builds "
                                       "(.venv-cerebras)")
        if self.backend_type == "CSX" and not self._cluster_configured():
            return Availability(False, "backend CSX needs a Cerebras cluster: set option mgmt_address (or "
                                       f"{ENV_PREFIX}MGMT_ADDRESS), or run on a user node with {USERNODE_CONFIG}")
        return Availability(True)

    def _cluster_configured(self) -> bool:
        return bool(self.options.mgmt_address or os.environ.get("CSCONFIG_PATH") or USERNODE_CONFIG.exists())

    # ----------------------------------------------------------------------- the device

    def torch_device(self, index: int = 0) -> torch.device:
        # Models are built and batches made on the host; cstorch.compile and the executor move
        # them to the backend's device (the host itself for CPU, a lazy tracing device for CSX).
        return torch.device("cpu")

    def synchronize(self) -> None:
        # Values are read in step closures, which the executor runs after each step; on the CPU
        # backend every op has run by then, on CSX the closure waits for the step's outputs.
        pass

    def supported_precisions(self) -> tuple[str, ...]:
        # cstorch.amp.autocast on the CPU backend accepts bf16 only (cstorch/amp/autocast.py).
        return ("fp32", "bf16") if self.backend_type == "CPU" else ("fp32", "fp16", "bf16")

    def precision_support(self, precision: str) -> PrecisionSupport:
        if self.backend_type == "CPU":
            host = self.host.precision_support(precision)  # the host's matrix units do the work
            return PrecisionSupport(precision, host.native, f"cstorch CPU backend on the host: {host.reason}",
                                    host.gflops)
        return PrecisionSupport(precision, True, f"{precision}: mixed precision of the CS-2 compiler "
                                                 "(cstorch.amp), as Cerebras states; not measured here")

    def reset_peak_memory(self) -> None:
        if self.backend_type == "CPU":
            self.host.reset_peak_memory()

    def peak_memory_bytes(self) -> int | None:
        # CSX streams the weights from MemoryX: there is no device memory figure to read.
        return self.host.peak_memory_bytes() if self.backend_type == "CPU" else None

    def total_memory_bytes(self) -> int | None:
        return self.host.total_memory_bytes() if self.backend_type == "CPU" else None

    def peak_sizes(self) -> tuple[int, ...]:
        return self.host.peak_sizes()

    def threads_per_rank(self, ranks: int) -> int | None:
        return self.host.threads_per_rank(1) if self.backend_type == "CPU" else None

    def set_tf32(self, enabled: bool) -> None:
        if self.backend_type == "CPU":
            self.host.set_tf32(enabled)

    def math_mode(self) -> JSONObject:
        return self.host.math_mode() if self.backend_type == "CPU" else {}

    def describe(self) -> DeviceDescription:
        from accel_kit.devices.cpu import _cpu_model

        cstorch = package_version(PACKAGE)
        versions = {"torch": torch.__version__, PACKAGE: cstorch, "cerebras-appliance":
                    package_version("cerebras-appliance")}
        extra: JSONObject = {"cstorch_backend": self.backend_type}
        if self.backend_type == "CPU":
            model = f"cstorch CPU backend on {_cpu_model()}"
            extra["threads"] = torch.get_num_threads()
        else:
            model = "Cerebras CS-2"
            extra |= {"num_csx_available": self.options.num_csx, "compile_only": self.options.compile_only,
                      "validate_only": self.options.validate_only,
                      "compiler_micro_batch_size": self.options.compiler_micro_batch_size}
        return DeviceDescription(adapter=self.name, device_model=model, device_count=1, versions=versions,
                                 extra=extra)

    def placement(self, devices: int) -> Placement:
        # One client process drives every CS-2 of a point (ClusterConfig.num_csx), one data-parallel
        # replica per CS-2: never a rank per device.
        return Placement(processes=1, replicas=devices)

    # ----------------------------------------------------------------------- what runs, and how

    def unsupported_peak(self, point: PointFields) -> str | None:
        if self.backend_type == "CSX":
            return ("a matmul peak is timed eagerly on the host; on a CS-2 every computation is a compiled "
                    "step, so there is no measured peak to compare with")
        return None  # the CPU backend computes on the host: the host's matmul peak is its reference

    def unsupported_block(self, point: BlockPointFields) -> str | None:
        if point.torch_compile:
            return "torch.compile does not apply: cstorch.compile compiles the block for the Cerebras backend"
        if point.precision not in self.supported_precisions():
            return f"precision {point.precision} does not run on the cstorch {self.backend_type} backend"
        return None

    def engine_layouts(self) -> bool:
        return False  # cstorch compiles the step and places the model itself

    def unsupported_train(self, point: TrainPointFields) -> str | None:
        if point.engine != "ddp":
            return (f"engine {point.engine!r} is an eager-PyTorch engine; cstorch trains through its own compiled "
                    "step (cstorch.compile, @cstorch.trace)")
        if point.tp * point.pp > 1:
            return (f"tp {point.tp}, pp {point.pp}: a CS-2 takes a whole model without tensor or pipeline "
                    "parallelism (weight streaming from MemoryX holds the weights; several CS-2 systems are data "
                    "parallel, ClusterConfig num_csx)")
        if point.torch_compile:
            return "torch.compile does not apply: cstorch.compile compiles the model for the Cerebras backend"
        if point.devices > 1:
            if self.backend_type == "CPU":
                return (f"{point.devices} devices: scaling over CS-2 systems (ClusterConfig num_csx) needs a "
                        "Cerebras cluster (backend CSX); the CPU backend runs one host process")
            if point.devices > self.options.num_csx:
                return (f"{point.devices} CS-2 systems: this cluster lends {self.options.num_csx} "
                        f"(option num_csx, or {ENV_PREFIX}NUM_CSX)")
        if point.sparsity > 0 and point.sparsity_pattern != "unstructured":
            return (f"sparsity pattern {point.sparsity_pattern!r} is NVIDIA's sparse tensor-core pattern; "
                    "cstorch.sparse prunes unstructured (Static, GMP, SET, RigL)")
        if point.sparsity > 0 and point.dense_finetune_steps and self.backend_type == "CSX":
            return ("dense fine-tuning replaces the cstorch.sparse masks mid-run, but the CS-2 compiler takes a "
                    "Static sparsity level as a constant of the compiled step (min = max sparsity "
                    "annotations): the dense phase needs a second run from a checkpoint")
        return None

    def programming_model(self, eager: EagerRuntime) -> EagerRuntime:
        # cstorch's compiled model and traced step replace eager PyTorch; imported only now, since it
        # imports cerebras-pytorch (and the engine's building blocks come through ``eager``).
        from accel_kit.devices.cerebras.model import CstorchModel

        return CstorchModel(self.options, eager)

    def job_launch(self, scheduler: str) -> JobLaunch:
        # A cluster run as an appliance: the script is this adapter's own (a batch scheduler's is refused
        # by the system's ``schedulers: [appliance]``).
        return JobLaunch(template=APPLIANCE_TEMPLATE) if scheduler == "appliance" else JobLaunch()
