"""Cerebras through cerebras-pytorch (``cstorch``): a CS-2 cluster (backend CSX) or the host CPU (backend CPU).

One adapter for both, the same code path: only the cstorch backend differs. The CPU backend
executes the Cerebras programming model on the host (it needs no Cerebras hardware), so it
is what runs here and in CI; the CSX backend sends the same compiled step to a Wafer-Scale
Cluster. The programming model replaces eager PyTorch (``accel_kit.devices.cerebras_train``):
``cstorch.compile`` of the model, one ``@cstorch.trace`` training step (forward and backward,
clipping, ``cstorch.optim.AdamW``), the loss read in a
``@cstorch.step_closure``, batches from ``cstorch.utils.data.DataLoader(input_fn)`` driven by a
``DataExecutor``, and weight sparsity through ``cstorch.sparse``.

cerebras-pytorch 2.10 pins torch 2.4, so it lives in its own environment (``make cerebras``:
``.venv-cerebras``); nothing here imports it before a point runs, and ``availability`` reads
only package metadata.

Settings come from the system YAML's ``options:`` (``CerebrasOptions``), each overridable by
an environment variable ``ACCEL_KIT_CEREBRAS_<NAME>`` (a cluster's address and paths belong to
the site, not to the committed file).
"""
from __future__ import annotations

import importlib.metadata
import os
import re
import sys
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, PositiveInt, model_validator

from accel_kit.devices._vendor import package_version, parse_options
from accel_kit.devices.base import Availability, BaseAdapter, DeviceDescription, Layout, PrecisionSupport

ENV_PREFIX = "ACCEL_KIT_CEREBRAS_"
PACKAGE = "cerebras-pytorch"
PACKAGE_VERSION = "2.10.0"  # what `make cerebras` installs (constraints-cerebras.txt)
# One line for every way of not having it: what to install and with which command.
MISSING = (f"{PACKAGE} is not installed in this Python ({sys.executable}): build the Cerebras environment "
           f"with `make cerebras` ({PACKAGE}=={PACKAGE_VERSION} in .venv-cerebras) and run from it "
           "(.venv-cerebras/bin/accel-kit or papermill, or the Jupyter kernel 'accel-kit-cerebras')")
# The user node's cluster configuration, where cerebras-appliance looks when no address is given
# (cerebras/appliance/cluster/config.py: CSCONFIG_PATH, overridden by $CSCONFIG_PATH).
USERNODE_CONFIG = Path("/opt/cerebras/config_v2")
CSX_ONLY = ("mgmt_address", "mgmt_namespace", "credentials_path", "mount_dirs", "python_paths", "compile_dir",
            "compile_only", "validate_only", "job_time_sec", "max_wgt_servers", "max_act_per_csx",
            "num_workers_per_csx", "compiler_micro_batch_size")


class CerebrasOptions(BaseModel):
    """The ``options:`` of a Cerebras system (``params/systems/cs2.yaml``, ``cerebras-cpu.yaml``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    backend: Literal["CPU", "CSX"] = "CPU"
    # Where cstorch writes its logs and compile artifacts; None: a temporary folder per point.
    artifact_dir: str | None = None
    # CS-2 systems the cluster lends this run: a point of the scaling study may use up to this many (num_csx).
    num_csx: PositiveInt = 1
    # --- backend CSX only: cstorch.distributed.ClusterConfig and the backend's modes.
    mgmt_address: str | None = None  # None: the user node's /opt/cerebras/config_v2
    mgmt_namespace: str | None = None
    credentials_path: str | None = None
    mount_dirs: list[str] = []  # folders the cluster's workers mount: the data and this checkout
    python_paths: list[str] = []  # where the workers import accel_kit from (this checkout)
    compile_dir: str | None = None
    compile_only: bool = False  # compile the step on the cluster, run nothing (records say skipped, why)
    validate_only: bool = False  # trace and validate the step, compile and run nothing (ran here without a cluster)
    job_time_sec: PositiveInt | None = None
    max_wgt_servers: PositiveInt | None = None
    max_act_per_csx: PositiveInt | None = None
    num_workers_per_csx: PositiveInt | None = None
    # The CS-2 compiler's micro-batch (cstorch.backends.csx.performance.micro_batch_size), over which it
    # accumulates gradients: None is the point's micro_batch_size (its GAS as asked); "auto" lets the
    # compiler choose, as the paper's CS-2 runs did ("GAS chosen by the software").
    compiler_micro_batch_size: None | Literal["auto", "explore"] | PositiveInt = None

    @model_validator(mode="after")
    def _consistent(self) -> "CerebrasOptions":
        if self.backend == "CPU":
            given = [name for name in CSX_ONLY if name in self.model_fields_set]
            if given:
                raise ValueError(f"{', '.join(given)} applies to backend CSX only (this system's backend is CPU)")
        if self.compile_only and self.validate_only:
            raise ValueError("compile_only and validate_only exclude each other")
        return self

    @classmethod
    def from_sources(cls, options: dict[str, Any], environ: dict[str, str] | None = None) -> "CerebrasOptions":
        """The YAML ``options`` with each ``ACCEL_KIT_CEREBRAS_<NAME>`` variable (parsed as YAML) on top."""
        from accel_kit.params import parse_value

        environ = os.environ if environ is None else environ
        values = dict(options)
        for name in cls.model_fields:
            text = environ.get(ENV_PREFIX + name.upper())
            if text is None:
                continue
            value = parse_value(text)
            if name in ("mount_dirs", "python_paths") and isinstance(value, str):
                value = [part for part in value.split(os.pathsep) if part]  # a PATH-like list
            values[name] = value
        return parse_options("cerebras", cls, values, given_in=f"the system YAML, or {ENV_PREFIX}<NAME>")


def required_torch(package: str = PACKAGE) -> str | None:
    """The torch version ``package`` pins (``torch (==2.4.0)`` in its metadata), or None."""
    for req in importlib.metadata.requires(package) or []:
        match = re.match(r"torch\s*\(?==\s*([\w.]+)", req)
        if match:
            return match.group(1)
    return None


class CerebrasAdapter(BaseAdapter):
    name = "cerebras"

    def __init__(self) -> None:
        self.options = CerebrasOptions()
        self._host = None  # the CPU adapter: the CPU backend runs on the host, so it measures the host
        self._sparsity = None  # the point's cstorch sparsity, from make_sparsity to make_trainer

    # ----------------------------------------------------------------------- settings and presence

    def configure(self, options: dict[str, Any]) -> None:
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

    def math_mode(self) -> dict[str, Any]:
        return self.host.math_mode() if self.backend_type == "CPU" else {}

    def describe(self) -> DeviceDescription:
        from accel_kit.devices.cpu import _cpu_model

        cstorch = package_version(PACKAGE)
        versions = {"torch": torch.__version__, PACKAGE: cstorch, "cerebras-appliance":
                    package_version("cerebras-appliance")}
        extra: dict[str, Any] = {"cstorch_backend": self.backend_type}
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

    def layout(self, devices: int) -> Layout:
        # One client process drives every CS-2 of a point (ClusterConfig.num_csx), one data-parallel
        # replica per CS-2: never a rank per device.
        return Layout(processes=1, replicas=devices)

    # ----------------------------------------------------------------------- the programming model

    def unsupported_reason(self, point: Any) -> str | None:
        kind = getattr(point, "kind", None)
        if kind == "peak":
            if self.backend_type == "CSX":
                return ("a matmul peak is timed eagerly on the host; on a CS-2 every computation is a compiled "
                        "step, so there is no measured peak to compare with")
            return None  # the CPU backend computes on the host: the host's matmul peak is its reference
        if kind == "block":
            return self._block_unsupported(point)
        if kind != "train":
            return f"point kind {kind!r} has no Cerebras implementation"
        if point.engine != "ddp":
            return (f"engine {point.engine!r} is an eager-PyTorch engine; cstorch trains through its own compiled "
                    "step (cstorch.compile, @cstorch.trace)")
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

    def _block_unsupported(self, point: Any) -> str | None:
        if point.torch_compile:
            return "torch.compile does not apply: cstorch.compile compiles the block for the Cerebras backend"
        if point.precision not in self.supported_precisions():
            return f"precision {point.precision} does not run on the cstorch {self.backend_type} backend"
        return None

    def prepare_model(self, model, point, device):
        from accel_kit.devices import cerebras_train

        cerebras_train.open_backend(self.options, point)
        cerebras_train.set_precision(point.precision)
        return model  # fp32: cstorch's mixed precision casts inside the compiled step, not the weights

    def make_sparsity(self, model, point, device):
        from accel_kit.devices import cerebras_train

        self._sparsity = cerebras_train.CstorchSparsity(model, point, self.backend_type)
        return self._sparsity

    def make_trainer(self, point, model, batches, device, world, *, after_step=None):
        from accel_kit.devices import cerebras_train

        # after_step (re-zeroing pruned weights) is not needed: cstorch.sparse prunes the weights
        # before each forward, and the gradients and AdamW state through its hooks.
        sparsity, self._sparsity = self._sparsity, None
        return cerebras_train.CstorchTrainer(point, model, self.options, sparsity=sparsity)

    def make_block_step(self, point, module, x, grad_out):
        from accel_kit.devices import cerebras_train

        cerebras_train.open_backend(self.options, point)
        return cerebras_train.BlockStep(point, module, x, grad_out)
