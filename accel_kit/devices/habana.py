"""Intel (Habana) Gaudi HPUs through the Intel Gaudi PyTorch bridge, ``habana_frameworks.torch``.

Gaudi trains the way Habana documents it, not CUDA's way:

- Execution mode, chosen before the bridge is imported (``PT_HPU_LAZY_MODE``): ``lazy`` (1)
  records operations into a graph that ``htcore.mark_step()`` cuts, compiles (once, then from
  its cache) and launches; ``eager`` (0) runs them as issued, and ``-p torch_compile true``
  compiles the model with ``torch.compile(backend="hpu_backend")``. The two cannot mix.
  ``auto`` (the default) follows the installed bridge: eager from Intel Gaudi software 1.21, whose
  default it became, lazy before; a ``PT_HPU_LAZY_MODE`` already set wins. The mode and why are recorded.
- In lazy mode, ``mark_step`` after each backward and after the optimizer step, where
  Optimum Habana's GaudiTrainer puts them.
- bf16 by autocast around forward and loss only (backward outside), weights in fp32.
- Habana's fused optimizer and clipping: ``hpex.optimizers.FusedAdamW``,
  ``hpex.normalization.FusedClipNorm``.
- Clocks are read after ``torch.hpu.synchronize()``: ``mark_step`` (even with ``sync=True``)
  waits for the host only. Peak memory from the HPU allocator's statistics.
- Data parallel over HCCL (importing ``habana_frameworks.torch.distributed.hccl`` registers
  the backend); ZeRO through DeepSpeed with its HPU accelerator (``DS_ACCELERATOR=hpu``).

The step is the engine's (``Trainer``, handed in as ``eager.Trainer``: its accumulation,
schedule and ``graph_break``); ``HabanaTrainer`` replaces only the optimizer, the clipping,
the autocast and what bf16 means.

Nothing here has run on a Gaudi. ``tests/test_vendor_adapters.py`` checks the order of these
calls against small recording stand-ins of Habana's modules: the order, not the hardware.
"""
from __future__ import annotations

import contextlib
import functools
import os
import sys
from dataclasses import replace
from typing import Callable, Literal

import torch
from pydantic import BaseModel, ConfigDict
from torch import nn

from accel_kit.devices._vendor import first_line, missing, missing_reason, package_version, parse_options
from accel_kit.devices.base import (Availability, BaseAdapter, DeviceDescription, JobLaunch, PrecisionSupport,
                                    ProgrammingModel)
from accel_kit.devices.types import Batches, EagerRuntime, PointTrainer, TrainPointFields
from accel_kit.errors import UnavailableError
from accel_kit.json_types import JSONObject
from accel_kit.precision import PrecisionSpec

BRIDGE = "habana_frameworks.torch"
SOURCE = "Intel Gaudi's software stack (habana-torch-plugin, from Intel's Gaudi installer or Docker images)"
MODE_VAR = "PT_HPU_LAZY_MODE"
PLUGIN = "habana-torch-plugin"  # the bridge's distribution, whose version is the Gaudi software release
# Intel Gaudi software 1.21: the bridge runs eager (PT_HPU_LAZY_MODE=0) unless told otherwise.
EAGER_DEFAULT_SINCE = (1, 21)


def default_mode(version: str | None) -> tuple[str, str]:
    """(mode, why) the bridge of release ``version`` runs by default; eager where the release is unknown
    (the current releases' default)."""
    if version is None:
        return "eager", (f"auto: {PLUGIN} is not installed here, so its release is unknown; eager, the default "
                         "since Intel Gaudi software 1.21")
    try:
        release = tuple(int(part) for part in version.split(".")[:2])
    except ValueError:
        return "eager", f"auto: {PLUGIN} {version} is not a release number read here; eager, the current default"
    if release >= EAGER_DEFAULT_SINCE:
        return "eager", f"auto: {PLUGIN} {version}, whose bridge runs eager by default (since 1.21)"
    return "lazy", f"auto: {PLUGIN} {version} predates 1.21, whose bridge runs lazy by default"


class HabanaOptions(BaseModel):
    """``options:`` of a Gaudi system (params/systems/gaudi2.yaml)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # lazy: as the paper's Optimum Habana runs (--use_lazy_mode); eager: PT_HPU_LAZY_MODE=0, with
    # torch.compile(backend="hpu_backend") for points with torch_compile; auto: the installed bridge's
    # default (eager from 1.21), or PT_HPU_LAZY_MODE where the environment sets it.
    execution_mode: Literal["auto", "lazy", "eager"] = "auto"


class HabanaAdapter(BaseAdapter):
    name = "habana"

    def __init__(self) -> None:
        self.options = HabanaOptions()
        self._htcore = None

    def configure(self, options: JSONObject) -> None:
        self.options = parse_options(self.name, HabanaOptions, options)

    def execution_mode(self) -> tuple[str, str]:
        """(lazy or eager, why): the system's choice, or for ``auto`` the environment's or the bridge's default."""
        chosen = self.options.execution_mode
        if chosen != "auto":
            return chosen, f"execution_mode {chosen} in the system file"
        current = os.environ.get(MODE_VAR)
        if current in ("0", "1"):
            return ("lazy" if current == "1" else "eager"), f"auto: {MODE_VAR}={current} in the environment"
        return default_mode(package_version(PLUGIN))

    @property
    def lazy(self) -> bool:
        return self.execution_mode()[0] == "lazy"

    def _bridge(self):
        """``habana_frameworks.torch.core``, imported with the execution mode set first (the bridge reads it once)."""
        if self._htcore is None:
            wanted = "1" if self.lazy else "0"
            current = os.environ.get(MODE_VAR)
            if current is not None and current != wanted:
                raise UnavailableError(f"{MODE_VAR}={current} in the environment contradicts execution_mode "
                                       f"{self.execution_mode()[0]!r} of this system ({MODE_VAR}={wanted})")
            if current is None and BRIDGE in sys.modules:
                raise UnavailableError(f"{BRIDGE} was imported before {MODE_VAR} was set: its execution mode is "
                                       "the bridge's default, not this system's")
            os.environ[MODE_VAR] = wanted
            import habana_frameworks.torch.core as htcore

            self._htcore = htcore
        return self._htcore

    def mark_step(self) -> None:
        """Cut the lazy graph here and launch it (eager mode: nothing to cut)."""
        if self.lazy:
            self._bridge().mark_step()

    def availability(self) -> Availability:
        if missing(BRIDGE):
            return Availability(False, missing_reason(BRIDGE, SOURCE))
        try:
            self._bridge()
        except UnavailableError as exc:
            return Availability(False, str(exc))
        except Exception as exc:  # a broken install: say what failed, in one line
            return Availability(False, f"{BRIDGE} failed to import: {first_line(exc)}")
        if not torch.hpu.is_available():
            return Availability(False, "no Gaudi is visible (torch.hpu.is_available() is False)")
        return Availability(True)

    def torch_device(self, index: int = 0) -> torch.device:
        # Habana's examples use the bare "hpu" device: each process acquires a Gaudi of its own.
        return torch.device("hpu")

    def synchronize(self) -> None:
        self.mark_step()  # lazy: launch what is still recorded, so that the wait below covers it
        torch.hpu.synchronize()

    def supported_precisions(self) -> tuple[str, ...]:
        return ("fp32", "fp16", "bf16")

    def precision_support(self, precision: str) -> PrecisionSupport:
        reasons = {"bf16": "bf16 native on Gaudi's matrix engines (Habana's training precision)",
                   "fp16": "fp16 runs on Gaudi2's matrix engines (the bridge covers fewer ops than in bf16)",
                   "fp32": "fp32, the reference precision"}
        return PrecisionSupport(precision, True, reasons[precision])

    def reset_peak_memory(self) -> None:
        torch.hpu.reset_peak_memory_stats()

    def peak_memory_bytes(self) -> int | None:
        return torch.hpu.max_memory_allocated()

    def total_memory_bytes(self) -> int | None:
        return torch.hpu.memory_stats().get("Limit")  # bytes the allocator may use, as DeepSpeed reads it

    def distributed_backend(self) -> str:
        import habana_frameworks.torch.distributed.hccl  # noqa: F401  registers "hccl"; reads RANK etc., set by then

        return "hccl"

    def deepspeed_settings(self) -> tuple[dict[str, str], JSONObject]:
        return {"DS_ACCELERATOR": "hpu"}, {}

    def energy_meter(self, index: int = 0):
        # HLML numbers every Gaudi in the host; with HABANA_VISIBLE_MODULES set, the rank's device is
        # the index-th module listed there, not the index-th card.
        from accel_kit.devices.power import hlml_meter

        visible = [int(m) for m in os.environ.get("HABANA_VISIBLE_MODULES", "").split(",") if m.strip().isdigit()]
        return hlml_meter(visible[index] if index < len(visible) else index)

    def describe(self) -> DeviceDescription:
        from importlib import metadata

        versions = {"torch": torch.__version__}
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions["habana-torch-plugin"] = metadata.version("habana-torch-plugin")
        limit = self.total_memory_bytes()
        return DeviceDescription(adapter=self.name, device_model=torch.hpu.get_device_name(),
                                 device_count=torch.hpu.device_count(), versions=versions,
                                 extra={"execution_mode": self.execution_mode()[0],
                                        "execution_mode_reason": self.execution_mode()[1],
                                        "total_memory_gib": round(limit / 2**30, 2) if limit else None})

    def math_mode(self) -> JSONObject:
        mode, why = self.execution_mode()
        return {"execution_mode": mode, "execution_mode_reason": why}

    # --- the programming model

    def programming_model(self, eager: EagerRuntime) -> EagerRuntime:
        return GaudiModel(self, eager)

    def unsupported_train(self, point: TrainPointFields) -> str | None:
        # The block and the matmul peak run as eager PyTorch on the hpu device (the defaults).
        if point.precision == "fp16":
            return ("fp16 training on Gaudi is not written here: Habana's documented mixed precision is bf16 "
                    "autocast (fp16 would need a loss scaler on HPU); use -p precision bf16")
        if point.torch_compile and self.lazy:
            return ("torch.compile and lazy mode are exclusive on Gaudi: set execution_mode: eager in the system "
                    "file for torch.compile(backend='hpu_backend')")
        if point.engine == "fsdp" and self.lazy:
            return ("Intel documents FSDP on Gaudi in eager mode (with torch.compile), not in lazy mode: set "
                    "execution_mode: eager in the system file")
        if point.tp * point.pp > 1:
            return (f"tp {point.tp}, pp {point.pp}: Intel documents tensor and pipeline parallelism on Gaudi through "
                    "DeepSpeed and Megatron-DeepSpeed, not torch's DTensor plans and pipelines that this engine uses")
        return None

    def job_launch(self, scheduler: str) -> JobLaunch:
        mode = "1" if self.lazy else "0"
        return JobLaunch(launcher="mpirun", setup=(
            "# Intel Gaudi software: the PyTorch bridge (habana_frameworks.torch) comes with Intel's Gaudi installer",
            "# or Docker images, not from PyPI; activate the environment that has it and accel-kit.",
            f"export {MODE_VAR}={mode}  # execution_mode {self.execution_mode()[0]} ({self.execution_mode()[1]}); "
            "set before the bridge is imported",
            "# Each point's ranks start with Open MPI's mpirun and meet over HCCL. ZeRO-1: add -p engine deepspeed",
            "# (DeepSpeed's HPU accelerator, DS_ACCELERATOR=hpu, set by accel-kit).",
        ))


class GaudiModel(ProgrammingModel):
    """The engine's eager step on the hpu device, with Habana's parts: fp32 weights (bf16 comes from
    autocast), ``HabanaTrainer``, ``torch.compile(backend="hpu_backend")``, and the adapter's
    ``mark_step`` as the graph break (DeepSpeed's engine included). Sparsity and the block step are
    the eager ones."""

    adapter: HabanaAdapter

    def prepare_model(self, model: nn.Module, point: TrainPointFields, device: torch.device) -> nn.Module:
        return model.to(device)  # fp32 weights: bf16 comes from autocast (DeepSpeed applies its own mode)

    def make_trainer(self, point: TrainPointFields, model: nn.Module, batches: Batches, device: torch.device,
                     world: int, *, after_step: Callable[[], None] | None = None) -> PointTrainer:
        return self.eager.make_trainer(point, model, batches, device, world, after_step=after_step,
                                       trainer=self._trainer, compile_backend="hpu_backend",
                                       graph_break=self.adapter.mark_step)

    def _trainer(self, *args: object, **kwargs: object) -> PointTrainer:
        # Imported here, not in make_trainer: a DeepSpeed point uses DeepSpeed's optimizer instead.
        from habana_frameworks.torch.hpex.normalization import FusedClipNorm
        from habana_frameworks.torch.hpex.optimizers import FusedAdamW

        cls = habana_trainer(self.eager.Trainer, self.eager.param_groups)
        return cls(*args, adamw=FusedAdamW, clip_norm=FusedClipNorm, **kwargs)


def gaudi_precision(kind: PrecisionSpec) -> PrecisionSpec:
    """What a precision means on Gaudi: one the engine holds as 16-bit weights with fp32 masters (bf16) runs
    instead as autocast around forward and loss over fp32 weights (Habana's mixed precision)."""
    if not kind.master_weights:
        return kind
    return replace(kind, model_dtype=torch.float32, autocast_dtype=kind.dtype, master_weights=False)


@functools.cache
def habana_trainer(trainer: type, param_groups: Callable[..., list[dict]]) -> type:
    """``HabanaTrainer``: a subclass of the engine's ``trainer`` (handed to devices/ as ``eager.Trainer``,
    with its ``param_groups``), built once per base class."""

    class HabanaTrainer(trainer):
        """One optimizer step on a Gaudi, the way Habana documents it (see the module docstring): the engine's
        step (its ``graph_break`` the adapter's ``mark_step``) with Habana's optimizer, clipping and autocast.

        Args: those of the engine's ``Trainer``, and
            adamw, clip_norm: Habana's ``FusedAdamW`` and ``FusedClipNorm`` classes.
        """

        def __init__(self, *args: object, adamw: type[torch.optim.Optimizer], clip_norm: type, **kwargs: object):
            self._adamw = adamw
            super().__init__(*args, **kwargs)
            self.clip = clip_norm(self.params, self.optim_cfg.grad_clip) if self.optim_cfg.grad_clip > 0 else None

        def precision_spec(self, precision: str) -> PrecisionSpec:
            return gaudi_precision(super().precision_spec(precision))

        def make_optimizer(self, params: nn.Module | list[torch.Tensor]) -> torch.optim.Optimizer:
            cfg = self.optim_cfg
            return self._adamw(param_groups(params, cfg.weight_decay), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2))

        def autocast(self, dtype: torch.dtype) -> torch.autocast:
            # Forward and loss under autocast, backward outside it (Habana's autocast guide; the engine's
            # step runs the backward outside it too).
            return torch.autocast(device_type="hpu", dtype=dtype)

        def clip_gradients(self, params: list[torch.Tensor], max_norm: float) -> None:
            self.clip.clip_norm(params)  # FusedClipNorm holds its max_norm

    return HabanaTrainer
