"""Intel (Habana) Gaudi HPUs through the Intel Gaudi PyTorch bridge, ``habana_frameworks.torch``.

Gaudi trains the way Habana documents it, not CUDA's way:

- Execution mode, chosen before the bridge is imported (``PT_HPU_LAZY_MODE``): ``lazy`` (1)
  records operations into a graph that ``htcore.mark_step()`` cuts, compiles (once, then from
  its cache) and launches; ``eager`` (0) runs them as issued, and ``-p torch_compile true``
  compiles the model with ``torch.compile(backend="hpu_backend")``. The two cannot mix.
- In lazy mode, ``mark_step`` after each backward and after the optimizer step, where
  Optimum Habana's GaudiTrainer puts them.
- bf16 by autocast around forward and loss only (backward outside), weights in fp32.
- Habana's fused optimizer and clipping: ``hpex.optimizers.FusedAdamW``,
  ``hpex.normalization.FusedClipNorm``.
- Clocks are read after ``torch.hpu.synchronize()``: ``mark_step`` (even with ``sync=True``)
  waits for the host only. Peak memory from the HPU allocator's statistics.
- Data parallel over HCCL (importing ``habana_frameworks.torch.distributed.hccl`` registers
  the backend); ZeRO through DeepSpeed with its HPU accelerator (``DS_ACCELERATOR=hpu``).

Nothing here has run on a Gaudi. ``tests/test_vendor_adapters.py`` checks the order of these
calls against small recording stand-ins of Habana's modules: the order, not the hardware.
"""
from __future__ import annotations

import contextlib
import math
import os
import sys
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict
from torch import nn

from accel_kit.devices._vendor import first_line, missing, missing_reason, parse_options
from accel_kit.devices.base import Availability, BaseAdapter, DeviceDescription, JobLaunch, PrecisionSupport
from accel_kit.errors import UnavailableError

BRIDGE = "habana_frameworks.torch"
SOURCE = "Intel Gaudi's software stack (habana-torch-plugin, from Intel's Gaudi installer or Docker images)"
MODE_VAR = "PT_HPU_LAZY_MODE"


class HabanaOptions(BaseModel):
    """``options:`` of a Gaudi system (params/systems/gaudi2.yaml)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # lazy: as the paper's Optimum Habana runs (--use_lazy_mode); eager: PT_HPU_LAZY_MODE=0, with
    # torch.compile(backend="hpu_backend") for points with torch_compile.
    execution_mode: Literal["lazy", "eager"] = "lazy"


class HabanaAdapter(BaseAdapter):
    name = "habana"

    def __init__(self) -> None:
        self.options = HabanaOptions()
        self._htcore = None

    def configure(self, options: dict[str, Any]) -> None:
        self.options = parse_options(self.name, HabanaOptions, options)

    @property
    def lazy(self) -> bool:
        return self.options.execution_mode == "lazy"

    def _bridge(self):
        """``habana_frameworks.torch.core``, imported with the execution mode set first (the bridge reads it once)."""
        if self._htcore is None:
            wanted = "1" if self.lazy else "0"
            current = os.environ.get(MODE_VAR)
            if current is not None and current != wanted:
                raise UnavailableError(f"{MODE_VAR}={current} in the environment contradicts execution_mode "
                                       f"{self.options.execution_mode!r} of this system ({MODE_VAR}={wanted})")
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

    def deepspeed_settings(self) -> tuple[dict[str, str], dict[str, Any]]:
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
                                 extra={"execution_mode": self.options.execution_mode,
                                        "total_memory_gib": round(limit / 2**30, 2) if limit else None})

    def math_mode(self) -> dict[str, Any]:
        return {"execution_mode": self.options.execution_mode}

    # --- the programming model

    def unsupported_reason(self, point: Any) -> str | None:
        if getattr(point, "kind", None) != "train":
            return None  # the block and the matmul peak run as eager PyTorch on the hpu device
        if point.precision == "fp16":
            return ("fp16 training on Gaudi is not written here: Habana's documented mixed precision is bf16 "
                    "autocast (fp16 would need a loss scaler on HPU); use -p precision bf16")
        if point.torch_compile and self.lazy:
            return ("torch.compile and lazy mode are exclusive on Gaudi: set execution_mode: eager in the system "
                    "file for torch.compile(backend='hpu_backend')")
        return None

    def prepare_model(self, model: nn.Module, point: Any, device: torch.device) -> nn.Module:
        return model.to(device)  # fp32 weights: bf16 comes from autocast (DeepSpeed applies its own mode)

    def make_trainer(self, point: Any, model: nn.Module, batches: Any, device: torch.device, world: int, *,
                     after_step: Any = None) -> Any:
        from accel_kit.engine.step import optim_for_point

        optim = optim_for_point(point)
        if point.engine == "deepspeed":
            from accel_kit.engine.deepspeed_engine import DeepSpeedTrainer

            return DeepSpeedTrainer(point, model, batches, device, optim, world, self, graph_break=self.mark_step)
        if world > 1:
            model = self.wrap_ddp(model, device)
        if point.torch_compile:
            model = torch.compile(model, backend="hpu_backend")
        from habana_frameworks.torch.hpex.normalization import FusedClipNorm
        from habana_frameworks.torch.hpex.optimizers import FusedAdamW

        return HabanaTrainer(model, iter(batches), device, point.precision, point.gas, optim,
                             mark_step=self.mark_step, adamw=FusedAdamW, clip_norm=FusedClipNorm,
                             after_step=after_step)

    def job_launch(self, scheduler: str) -> JobLaunch:
        mode = "1" if self.lazy else "0"
        return JobLaunch(launcher="mpirun", setup=(
            "# Intel Gaudi software: the PyTorch bridge (habana_frameworks.torch) comes with Intel's Gaudi installer",
            "# or Docker images, not from PyPI; activate the environment that has it and accel-kit.",
            f"export {MODE_VAR}={mode}  # execution_mode {self.options.execution_mode} (params/systems); set before "
            "the bridge is imported",
            "# Each point's ranks start with Open MPI's mpirun and meet over HCCL. ZeRO-1: add -p engine deepspeed",
            "# (DeepSpeed's HPU accelerator, DS_ACCELERATOR=hpu, set by accel-kit).",
        ))


class HabanaTrainer:
    """One optimizer step on a Gaudi, the way Habana documents it (see the module docstring).

    Args:
        model: the model on the hpu device (DDP-wrapped or compiled as the point asks).
        batches: yields ``(x, y)`` micro-batches.
        device: the hpu device.
        precision: fp32 or bf16 (bf16: autocast around forward and loss).
        gas: micro-batches per optimizer step.
        optim: optimizer settings (lr schedule, weight decay, clipping).
        mark_step: the adapter's graph cut (a no-op in eager mode).
        adamw, clip_norm: Habana's ``FusedAdamW`` and ``FusedClipNorm`` classes.
        after_step: called after each optimizer step (re-applying sparsity masks).
    """

    def __init__(self, model: nn.Module, batches, device: torch.device, precision: str, gas: int, optim, *,
                 mark_step, adamw, clip_norm, after_step=None):
        from accel_kit.engine.step import param_groups

        self.model, self.batches, self.device, self.gas, self.optim_cfg = model, batches, device, gas, optim
        self.mark_step, self.after_step = mark_step, after_step
        self.step_count = 0
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = adamw(param_groups(model, optim.weight_decay), lr=optim.lr, betas=(optim.beta1, optim.beta2))
        self.clip = clip_norm(self.params, optim.grad_clip) if optim.grad_clip > 0 else None
        # Forward and loss under autocast, backward outside it (Habana's autocast guide).
        self.autocast = (torch.autocast(device_type="hpu", dtype=torch.bfloat16) if precision == "bf16"
                         else contextlib.nullcontext())

    def _no_sync(self, last: bool):
        no_sync = getattr(self.model, "no_sync", None)
        return contextlib.nullcontext() if last or no_sync is None else no_sync()

    def step(self) -> float:
        from accel_kit.engine.step import NonFiniteLoss, learning_rate

        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate(self.step_count, self.optim_cfg)
        total = torch.zeros((), device=self.device)
        for micro in range(self.gas):
            x, y = next(self.batches)
            x, y = x.to(self.device), y.to(self.device)
            with self._no_sync(last=micro == self.gas - 1):
                with self.autocast:
                    _, loss = self.model(x, y)
                loss = loss / self.gas
                loss.backward()
            total += loss.detach()
            self.mark_step()  # after backward: this micro-batch's graph runs while the host goes on
        if self.clip is not None:
            self.clip.clip_norm(self.params)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.after_step is not None:
            self.after_step()
        self.mark_step()  # after the optimizer step: the update is one graph of its own
        self.step_count += 1
        value = total.item()
        if not math.isfinite(value):
            raise NonFiniteLoss(self.step_count, value)
        return value
