"""The device-adapter protocol: everything a study needs from a device, in one place.

A *device* is one accelerator (a GPU, an IPU, a CPU socket); a *system* (params/systems/)
describes a machine built from devices. Adapters hide the vendor differences that matter
for honest timing: how to synchronise, how to read peak memory, which precisions run at
speed, which collective backend to use, which kernels exist. No module outside
``accel_kit/devices/`` asks which device it runs on: it asks the adapter.

The protocol is written once, as ``BaseAdapter``: each method says what it answers and gives
the default of a torch device without vendor specifics, so a new backend overrides only
what differs (see ``docs/adding-a-device.md``). ``DeviceAdapter`` is the same class under the
name type hints use. How a point is built and stepped is not the device's: it is the
engine's (``accel_kit.engine.eager``), which an adapter replaces through one hook,
``programming_model(eager)``; ``ProgrammingModel`` is the base of such a replacement.
``accel_kit.devices`` imports nothing of the engine (``tests/test_device_guard.py``).
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from accel_kit.devices.power import EnergyMeter, UnavailableMeter
from accel_kit.devices.types import (  # noqa: F401  (re-exported: adapters import them from here)
    Availability,
    Batches,
    BlockPointFields,
    BlockStep,
    DeviceDescription,
    EagerRuntime,
    JobLaunch,
    Placement,
    PointFields,
    PointSparsity,
    PointTrainer,
    PrecisionChoice,
    PrecisionSupport,
    TrainPointFields,
)
from accel_kit.errors import ParameterError
from accel_kit.json_types import JSONObject
from accel_kit.precision import DTYPES, LOW_PRECISIONS, PRECISIONS, dtype_of  # noqa: F401  (re-exported)


class BaseAdapter:
    """One accelerator backend, with the defaults of a torch device; subclasses override what their device
    does differently. Implementations import their vendor SDK inside methods, never at module level."""

    name = "base"  # registry name: "cpu", "cuda", "rocm", ...

    # --- presence and placement

    def availability(self) -> Availability:
        """Can this backend run on this machine? Never raises."""
        return Availability(False, "BaseAdapter is abstract")

    def configure(self, options: JSONObject) -> None:
        """Take the system YAML's ``options`` (vendor settings: a cluster address, a mode); reject unknown ones."""
        if options:
            raise ParameterError(f"adapter {self.name!r} takes no options; got {', '.join(sorted(options))}")

    def torch_device(self, index: int = 0) -> torch.device:
        """The torch device tensors go to."""
        raise NotImplementedError

    def prepare(self, local_rank: int = 0) -> torch.device:
        """Select this process's device (before any allocation) and return it."""
        return self.torch_device(local_rank)

    def synchronize(self) -> None:
        """Block until all queued work on the device has finished (before reading a clock)."""

    def decode_compile_mode(self) -> str | None:
        """``torch.compile``'s mode for a compiled decode step (``accel_kit.models.generate``): ``reduce-overhead``
        where the device replays a captured graph (CUDA graphs), else None (inductor's default)."""
        return None

    def timing_event(self) -> torch.Event | None:
        """A new timing event of the current stream (``torch.cuda.Event(enable_timing=True)``'s kind), for a
        ``timing.Timeline`` that reads steps without stalling the device; None where the device has none
        (the host's clock is then right: a CPU finishes each operation before returning)."""
        return None

    def decode_impl(self) -> str:
        """The generate kind's default decode step (``accel_kit.models.generate.IMPLS``): compiled where the device
        replays a captured step without launching its kernels one by one (``decode_compile_mode``), else eager."""
        return "compiled" if self.decode_compile_mode() == "reduce-overhead" else "eager"

    def empty_cache(self) -> None:
        """Give cached, unused device memory back (between points)."""

    # --- precision

    def supported_precisions(self) -> tuple[str, ...]:
        """Precisions this device can run at all (natively or emulated), from ``PRECISIONS``."""
        return PRECISIONS

    def precision_support(self, precision: str) -> PrecisionSupport:
        """Whether ``precision`` runs natively at speed here, and why (measured or probed)."""
        return PrecisionSupport(precision, True, f"{precision}: listed as native for {self.name}")

    def resolve_precision(self, requested: str) -> PrecisionChoice:
        """``auto`` -> the lowest precision that runs natively at speed, else fp32; others as asked (an
        explicit slow one runs and says "emulated")."""
        if requested != "auto":
            if requested not in self.supported_precisions():
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

    def math_mode(self) -> JSONObject:
        """Settings that change numerics or speed of matmuls (e.g. TF32), for provenance."""
        return {}

    def set_tf32(self, enabled: bool) -> None:
        """Allow or forbid TF32 (or the device's reduced-precision fp32 matmul)."""

    # --- memory and the measured peak

    def reset_peak_memory(self) -> None:
        """Start a new peak-memory window (called before each measurement)."""

    def peak_memory_bytes(self) -> int | None:
        """Peak memory of the window since ``reset_peak_memory``; None when not measurable."""
        return None

    def total_memory_bytes(self) -> int | None:
        """Memory one device holds (for fit checks); None when unknown."""
        return None

    def peak_sizes(self) -> tuple[int, ...]:
        """Square matmul sizes the measured peak starts from (it stops growing past about a second)."""
        return (2048, 4096, 8192)  # accelerators need large operands to fill their matrix units

    # --- collectives, optimizer, kernels

    def distributed_backend(self) -> str:
        """torch.distributed backend name: gloo, nccl (RCCL on ROCm), hccl, ..."""
        return "gloo"

    def collective_device(self, device: torch.device) -> torch.device:
        """Where a tensor for a collective (e.g. an all-reduce of timings) must live."""
        return device

    def wrap_ddp(self, model: nn.Module, device: torch.device) -> nn.Module:
        """The model wrapped for data-parallel training on this device."""
        from torch.nn.parallel import DistributedDataParallel as DDP

        return DDP(model)

    def fused_optimizer(self) -> bool:
        """Whether torch's fused AdamW runs here."""
        return False

    def threads_per_rank(self, ranks: int) -> int | None:
        """Host threads each of ``ranks`` local processes should use; None: leave the default."""
        return None

    def is_host_cpu(self) -> bool:
        """Whether this device is the host's own CPU: an engine then runs its CPU build here, with that build's
        limits (vLLM's CPU attention kernels, ``accel_kit.engine.serve_measure.unsupported_serve``). False for
        an accelerator, whatever torch device its client process holds."""
        return False

    def deepspeed_settings(self) -> tuple[dict[str, str], JSONObject]:
        """(environment variables, optimizer params) DeepSpeed needs on this device."""
        return {}, {}

    def sparse_kernel(self, pattern: str, dtype: torch.dtype) -> tuple[str | None, str]:
        """The sparse matmul kernel kind ("2:4" or "csr") for pruned weights here, or (None, why not)."""
        return None, f"no sparse kernels are known for adapter {self.name!r}"

    def nn_weight_gradient_pays(self, dtype: torch.dtype) -> bool:
        """Whether a linear's weight gradient in ``dtype`` runs faster here as an NN matrix product on a
        transposed copy of the output gradient than as the TN product torch runs (a family whose linears
        can take that path asks, ``Family.kernel_overrides``)."""
        return False

    def few_rows_linears(self, dtype: torch.dtype) -> dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]:
        """Kernels, by name, that may run a linear on a few rows (a decode step's: one row per sequence) faster
        here than torch's ``x @ W^T``: each takes x (rows, in) and W (out, in) and returns (rows, out). The eager
        decode step times each against torch's own on the model's weight shapes and keeps the fastest
        (``accel_kit.models.generate.choose_few_rows_kernels``). Empty: torch's own everywhere."""
        return {}

    # --- provenance and energy

    def describe(self) -> DeviceDescription:
        """Device model, count and software versions, for provenance."""
        raise NotImplementedError

    def energy_meter(self, index: int = 0) -> EnergyMeter:
        """A meter of device ``index``'s energy over a timed window (``accel_kit.devices.power``); one that
        returns None with the reason where the device exposes no reading."""
        return UnavailableMeter(f"adapter {self.name!r} reads no energy (it has no energy_meter of its own)")

    # --- the programming model: how a point is built and stepped is the engine's (accel_kit.engine.eager);
    # a vendor whose model differs (a compiled graph, a session per step, a host-driven device loop)
    # returns its own from programming_model and nothing else changes.

    def programming_model(self, eager: EagerRuntime) -> EagerRuntime:
        """What builds and steps a point here: ``eager`` (the engine's eager-PyTorch default, an
        ``accel_kit.engine.eager.EagerModel``) or a vendor's ``ProgrammingModel`` over ``eager``, which
        answers every method of ``eager`` (``prepare_model``, ``make_sparsity``, ``make_trainer``,
        ``make_block_step``, and any a new kind of work adds there) and overrides those its device does
        differently."""
        return eager

    def unsupported(self, kind: str, point: PointFields) -> str | None:
        """Why the point ``point`` of kind ``kind`` cannot run on this programming model (recorded as
        ``unsupported``); None if it can. It asks the adapter's ``unsupported_<kind>(point)`` where it has
        one (``unsupported_train``: a training point's engine, device count, precision...;
        ``unsupported_block``, ``unsupported_peak``), else answers None: a new kind of work needs no
        method here, and an adapter that cannot run it adds its ``unsupported_<kind>``."""
        check = getattr(self, f"unsupported_{kind}", None) if kind.isidentifier() else None
        return check(point) if check is not None else None

    def unsupported_context_parallel(self) -> str | None:
        """Why a training point with context parallelism (cp above 1: torch's ``context_parallel``, ring
        attention over the ranks' sequence shards) cannot run here; None if it can. torch's context
        parallelism shards only the fused SDPA kernels of CUDA (flash, memory-efficient, cuDNN), so a device
        says None only where those run."""
        return (f"context parallelism is not known to run on adapter {self.name!r}: torch's context_parallel "
                "shards only CUDA's fused SDPA kernels (flash, memory-efficient, cuDNN)")

    def placement(self, devices: int) -> Placement:
        """How a training point on ``devices`` devices runs: processes, data-parallel replicas, steps per call."""
        return Placement(processes=devices, replicas=devices)

    def pipeline_degree(self, pp: int) -> int:
        """The pipeline stages a training point asking for ``pp`` runs, which it records as its ``pp``: its own,
        unless the programming model sets it (an IPU replica's pipeline over its IPUs)."""
        return pp

    def engine_layouts(self) -> bool:
        """Whether the engine's parallel layouts and their checks (``accel_kit.engine.layout``: DDP, FSDP2,
        DTensor tensor parallelism, torch's pipelines) apply here. False where the programming model maps a
        point's layout itself: its ``unsupported_train`` (``unsupported("train", point)``) then answers ``tp``, ``pp`` and ``engine``."""
        return True

    def attention_kernel(self, point: TrainPointFields) -> dict[str, str | None] | None:
        """The attention-kernel fields of a record where torch's SDPA dispatch does not decide them; None: probe it."""
        return None

    # --- how a point's processes start

    def launch_prefix(self, point: PointFields, launcher: str) -> list[str]:
        """Words put before a point's worker command (a vendor's process launcher); [] for none."""
        return []

    def worker_env(self) -> dict[str, str]:
        """Environment variables a point's worker process starts with: settings read before Python runs
        (the C allocator's), which no code in the worker can change any more; {} for none."""
        return {}

    def job_launch(self, scheduler: str) -> JobLaunch:
        """What a job script for this device needs (launcher, environment, scheduler lines)."""
        return JobLaunch()


# The protocol's name in type hints and isinstance checks: every adapter is a BaseAdapter, so the
# protocol is not written a second time.
DeviceAdapter = BaseAdapter


class ProgrammingModel:
    """A vendor's programming model over the engine's eager one: each method a kind's measurement calls
    does what ``eager`` does unless a subclass overrides it. The four below are the training and block
    kinds'; a new kind's method (e.g. an inference kind's ``make_generate_step``) is added to ``eager``
    only, and every vendor model answers it as eager does until its adapter's package overrides it here.

    ``eager`` (an ``accel_kit.engine.eager.EagerModel``) also carries the engine's building blocks a
    vendor trainer reuses (``Trainer``, ``optim_for_point``, ``param_groups``, ``learning_rate``,
    ``NonFiniteLoss``, ``NotMeasured``, ``deepspeed_trainer``): devices/ reaches them through it
    instead of importing the engine.
    """

    def __init__(self, adapter: BaseAdapter, eager: EagerRuntime):
        self.adapter, self.eager = adapter, eager

    def __getattr__(self, name: str) -> object:
        # Only for names this class and its subclass lack: a kind's method that the vendor does not override.
        if name in ("adapter", "eager"):  # (not set yet: unpickling, copying)
            raise AttributeError(name)
        return getattr(self.eager, name)

    def build_model(self, point: TrainPointFields, device: torch.device, **overrides: object) -> nn.Module:
        """The point's freshly built fp32 model (seed the generator first), whole, on ``device``: a vendor's
        toolchain takes the model as it is built."""
        from accel_kit.models import build_model

        return build_model(point.preset, activation_checkpointing=point.activation_checkpointing, device=device,
                           **overrides)

    def prepare_model(self, model: nn.Module, point: TrainPointFields, device: torch.device) -> nn.Module:
        """The freshly built fp32 model, placed and cast as this device trains it."""
        return self.eager.prepare_model(model, point, device)

    def make_sparsity(self, model: nn.Module, point: TrainPointFields, device: torch.device) -> PointSparsity:
        """The object that prunes ``model`` for ``point.sparsity`` and keeps its masks through training."""
        return self.eager.make_sparsity(model, point, device)

    def make_trainer(self, point: TrainPointFields, model: nn.Module, batches: Batches, device: torch.device,
                     world: int, *, after_step: Callable[[], None] | None = None) -> PointTrainer:
        """The object whose ``step()`` runs the point's optimizer steps of one call and returns the loss."""
        return self.eager.make_trainer(point, model, batches, device, world, after_step=after_step)

    def make_block_step(self, point: BlockPointFields, module: nn.Module, x: torch.Tensor,
                        grad_out: torch.Tensor | None) -> BlockStep:
        """One microbenchmark iteration of ``module`` on ``x`` as a callable."""
        return self.eager.make_block_step(point, module, x, grad_out)
