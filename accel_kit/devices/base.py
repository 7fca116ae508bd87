"""The device-adapter protocol: everything a study needs from a device, in one place.

A *device* is one accelerator (a GPU, an IPU, a CPU socket); a *system* (params/systems/)
describes a machine built from devices. Adapters hide the vendor differences that matter
for honest timing: how to synchronise, how to read peak memory, which precisions run at
speed, which collective backend to use, which kernels exist. No module outside
``accel_kit/devices/`` asks which device it runs on: it asks the adapter.

``BaseAdapter`` gives the defaults of a torch device without vendor specifics, so a new
backend overrides only what differs (see ``docs/adding-a-device.md``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

from accel_kit.devices.power import EnergyMeter, UnavailableMeter

from accel_kit.precision import DTYPES, LOW_PRECISIONS, PRECISIONS, dtype_of  # noqa: F401  (re-exported)


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


@dataclass(frozen=True)
class PrecisionSupport:
    """How one precision runs on this device: natively at speed, or emulated (slow), and why.

    ``gflops`` is the probe's measured matmul rate where the adapter measured one.
    """

    precision: str
    native: bool
    reason: str
    gflops: float | None = None


@dataclass(frozen=True)
class PrecisionChoice:
    """A requested precision resolved on a device: what runs, and the reason recorded with it."""

    requested: str
    precision: str
    reason: str
    emulated: bool = False


@dataclass(frozen=True)
class Layout:
    """How a training point's devices map onto worker processes, data-parallel replicas and optimizer steps.

    torch's data parallelism (the default) is one process and one replica per device and one
    optimizer step per trainer call. A vendor runtime may hold every replica in one process (a
    replication factor), spread one replica over several devices (a pipeline), place several
    replicas on one device, or run several optimizer steps per host call (device iterations).
    """

    processes: int  # worker processes the point runs as
    replicas: int  # data-parallel replicas: the global batch is micro-batch x gas x replicas
    steps_per_call: int = 1  # optimizer steps one ``trainer.step()`` runs


@dataclass(frozen=True)
class JobLaunch:
    """What a system's job script needs beyond the scheduler's defaults (``accel-kit jobscript``)."""

    launcher: str | None = None  # -p launcher of the sweep; None: the scheduler's (mpiexec under PBS, srun under Slurm)
    setup: tuple[str, ...] = ()  # shell lines before ``accel-kit run`` (the vendor stack's environment)
    directives: tuple[str, ...] = ()  # extra scheduler lines (written as given, e.g. "##SBATCH --gres=...")
    params: tuple[tuple[str, str], ...] = ()  # -p overrides the launch needs (the user's own come after and win)


@runtime_checkable
class DeviceAdapter(Protocol):
    """One accelerator backend. Implementations import their vendor SDK lazily."""

    name: str  # registry name: "cpu", "cuda", "rocm", ...

    def availability(self) -> Availability:
        """Can this backend run on this machine? Never raises."""

    def torch_device(self, index: int = 0) -> torch.device:
        """The torch device tensors go to."""

    def prepare(self, local_rank: int = 0) -> torch.device:
        """Select this process's device (before any allocation) and return it."""

    def synchronize(self) -> None:
        """Block until all queued work on the device has finished (before reading a clock)."""

    def empty_cache(self) -> None:
        """Give cached, unused device memory back (between points)."""

    def supported_precisions(self) -> tuple[str, ...]:
        """Precisions this device can run at all (natively or emulated), from ``PRECISIONS``."""

    def precision_support(self, precision: str) -> PrecisionSupport:
        """Whether ``precision`` runs natively at speed here, and why (measured or probed)."""

    def resolve_precision(self, requested: str) -> PrecisionChoice:
        """``auto`` -> the lowest precision that runs natively at speed, else fp32; others as asked."""

    def reset_peak_memory(self) -> None:
        """Start a new peak-memory window (called before each measurement)."""

    def peak_memory_bytes(self) -> int | None:
        """Peak memory of the window since ``reset_peak_memory``; None when not measurable."""

    def total_memory_bytes(self) -> int | None:
        """Memory one device holds (for fit checks); None when unknown."""

    def peak_sizes(self) -> tuple[int, ...]:
        """Square matmul sizes the measured peak starts from (it stops growing past about a second)."""

    def distributed_backend(self) -> str:
        """torch.distributed backend name: gloo, nccl (RCCL on ROCm), hccl, ..."""

    def collective_device(self, device: torch.device) -> torch.device:
        """Where a tensor for a collective (e.g. an all-reduce of timings) must live."""

    def wrap_ddp(self, model: nn.Module, device: torch.device) -> nn.Module:
        """The model wrapped for data-parallel training on this device."""

    def fused_optimizer(self) -> bool:
        """Whether torch's fused AdamW runs here."""

    def threads_per_rank(self, ranks: int) -> int | None:
        """Host threads each of ``ranks`` local processes should use; None: leave the default."""

    def deepspeed_settings(self) -> tuple[dict[str, str], dict[str, Any]]:
        """(environment variables, optimizer params) DeepSpeed needs on this device."""

    def sparse_kernel(self, pattern: str, dtype: torch.dtype) -> tuple[str | None, str]:
        """The sparse matmul kernel kind ("2:4" or "csr") for pruned weights here, or (None, why not)."""

    def narrow_linear_fast_path(self, dtype: torch.dtype) -> bool:
        """Whether the block's narrow-output linears should use their NN-layout weight gradient."""

    def describe(self) -> DeviceDescription:
        """Device model, count and software versions, for provenance."""

    def math_mode(self) -> dict[str, Any]:
        """Settings that change numerics or speed of matmuls (e.g. TF32), for provenance."""

    def set_tf32(self, enabled: bool) -> None:
        """Allow or forbid TF32 (or the device's reduced-precision fp32 matmul)."""

    def energy_meter(self, index: int = 0) -> EnergyMeter:
        """A meter of device ``index``'s energy over a timed window (``accel_kit.devices.power``); one that
        returns None with the reason where the device exposes no reading."""

    def configure(self, options: dict[str, Any]) -> None:
        """Take the system YAML's ``options`` (vendor settings: a cluster address, a mode); reject unknown ones."""

    def unsupported_reason(self, point: Any) -> str | None:
        """Why ``point`` (its kind, engine, device count...) cannot run on this programming model; None if it can."""

    def layout(self, devices: int) -> Layout:
        """How a training point on ``devices`` devices runs: processes, data-parallel replicas, steps per call."""

    def attention_kernel(self, point: Any) -> dict[str, Any] | None:
        """The attention-kernel fields of a record where torch's SDPA dispatch does not decide them; None: probe it."""

    def launch_prefix(self, point: Any, launcher: str) -> list[str]:
        """Words put before a point's worker command (a vendor's process launcher); [] for none."""

    def worker_env(self) -> dict[str, str]:
        """Environment variables a point's worker process starts with: settings read before Python runs
        (the C allocator's), which no code in the worker can change any more; {} for none."""

    def job_launch(self, scheduler: str) -> JobLaunch:
        """What a job script for this device needs (launcher, environment, scheduler lines)."""

    def programming_model(self, eager: Any) -> Any:
        """What builds and steps a point here: ``eager`` (the engine's eager-PyTorch default, an
        ``accel_kit.engine.eager.EagerModel``) or a vendor's object with the same methods
        (``prepare_model``, ``make_sparsity``, ``make_trainer``, ``make_block_step``), which may wrap it."""


class BaseAdapter:
    """Defaults for a torch device; subclasses override what their device does differently."""

    name = "base"

    def availability(self) -> Availability:
        return Availability(False, "BaseAdapter is abstract")

    def torch_device(self, index: int = 0) -> torch.device:
        raise NotImplementedError

    def prepare(self, local_rank: int = 0) -> torch.device:
        return self.torch_device(local_rank)

    def synchronize(self) -> None:
        pass

    def empty_cache(self) -> None:
        pass

    def supported_precisions(self) -> tuple[str, ...]:
        return PRECISIONS

    def precision_support(self, precision: str) -> PrecisionSupport:
        return PrecisionSupport(precision, True, f"{precision}: listed as native for {self.name}")

    def resolve_precision(self, requested: str) -> PrecisionChoice:
        if requested != "auto":
            if requested not in self.supported_precisions():
                from accel_kit.errors import ParameterError

                raise ParameterError(f"precision {requested!r} does not run on adapter {self.name!r} "
                                     f"(runs {', '.join(self.supported_precisions())})")
            support = self.precision_support(requested)
            if support.native:
                return PrecisionChoice(requested, requested, f"{requested} as requested ({support.reason})")
            return PrecisionChoice(requested, requested, f"{requested} as requested, emulated: {support.reason}",
                                   emulated=True)
        skipped = []
        for low in LOW_PRECISIONS:
            if low not in self.supported_precisions():
                continue
            support = self.precision_support(low)
            if support.native:
                return PrecisionChoice("auto", low, f"auto: {support.reason}")
            skipped.append(f"{low} skipped: {support.reason}")
        return PrecisionChoice("auto", "fp32", "auto: fp32 (" + "; ".join(skipped or ["no lower precision"]) + ")")

    def reset_peak_memory(self) -> None:
        pass

    def peak_memory_bytes(self) -> int | None:
        return None

    def total_memory_bytes(self) -> int | None:
        return None

    def peak_sizes(self) -> tuple[int, ...]:
        # Accelerators need large operands to fill their matrix units.
        return (2048, 4096, 8192)

    def distributed_backend(self) -> str:
        return "gloo"

    def collective_device(self, device: torch.device) -> torch.device:
        return device

    def wrap_ddp(self, model: nn.Module, device: torch.device) -> nn.Module:
        from torch.nn.parallel import DistributedDataParallel as DDP

        return DDP(model)

    def fused_optimizer(self) -> bool:
        return False

    def threads_per_rank(self, ranks: int) -> int | None:
        return None

    def deepspeed_settings(self) -> tuple[dict[str, str], dict[str, Any]]:
        return {}, {}

    def sparse_kernel(self, pattern: str, dtype: torch.dtype) -> tuple[str | None, str]:
        return None, f"no sparse kernels are known for adapter {self.name!r}"

    def narrow_linear_fast_path(self, dtype: torch.dtype) -> bool:
        return False

    def math_mode(self) -> dict[str, Any]:
        return {}

    def set_tf32(self, enabled: bool) -> None:
        pass

    def energy_meter(self, index: int = 0) -> EnergyMeter:
        return UnavailableMeter(f"adapter {self.name!r} reads no energy (it has no energy_meter of its own)")

    # --- The programming model: how a point is built and stepped is the engine's (accel_kit.engine.eager);
    # a vendor whose model differs (a compiled graph, a session per step, a host-driven device loop)
    # returns its own from programming_model and nothing else changes.

    def configure(self, options: dict[str, Any]) -> None:
        if options:
            from accel_kit.errors import ParameterError

            raise ParameterError(f"adapter {self.name!r} takes no options; got {', '.join(sorted(options))}")

    def unsupported_reason(self, point: Any) -> str | None:
        return None

    def unsupported_train(self, point: Any) -> str | None:
        return None

    def unsupported_block(self, point: Any) -> str | None:
        return None

    def unsupported_peak(self, point: Any) -> str | None:
        return None

    def layout(self, devices: int) -> Layout:
        return Layout(processes=devices, replicas=devices)

    def attention_kernel(self, point: Any) -> dict[str, Any] | None:
        return None

    def launch_prefix(self, point: Any, launcher: str) -> list[str]:
        return []

    def worker_env(self) -> dict[str, str]:
        return {}

    def job_launch(self, scheduler: str) -> JobLaunch:
        return JobLaunch()

    def programming_model(self, eager: Any) -> Any:
        return eager
