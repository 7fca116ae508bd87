"""One training step, shared by every study: AdamW, clipping, schedule, precision, GAS.

Precision: ``fp32`` runs in fp32 throughout. ``bf16`` holds the model in bf16 (weights,
activations, gradients) and keeps fp32 master weights and AdamW state in the optimizer, as
Megatron-LM and DeepSpeed's bf16 mode do: no per-forward weight casts (on a CPU these cost
a third of an autocast step) and one fp32 update per step. ``fp16`` keeps fp32 weights and
runs the forward/backward under ``torch.autocast`` with a gradient scaler, since its 5-bit
exponent underflows small gradients. Gradient accumulation runs ``gas``
micro-batches per optimizer step; under DDP the gradient all-reduce is skipped
(``no_sync``) on all but the last, so communication happens once per step.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Callable, Iterator

import torch
from torch import nn

from accel_kit.precision import PrecisionSpec, spec


class NonFiniteLoss(RuntimeError):
    """The loss became NaN or infinite; ``step`` says when."""

    def __init__(self, step: int, loss: float):
        super().__init__(f"non-finite loss {loss} at step {step}")
        self.step = step


class NotMeasured(RuntimeError):
    """The point ran as asked but produced no measurement (e.g. a compile-only run); recorded with its status."""

    def __init__(self, status: str, reason: str):
        super().__init__(reason)
        self.status, self.reason = status, reason


@dataclass(frozen=True)
class OptimConfig:
    """AdamW and schedule settings; a training point's come from ``optim_for_point``."""

    lr: float = 6e-4
    min_lr: float = 6e-5
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0  # max global gradient norm; 0 disables
    warmup_steps: int = 10
    decay_steps: int = 1000  # cosine from lr to min_lr over this many steps after warm-up


def optim_for_point(point) -> OptimConfig:
    """The optimizer settings of a training point: its lr, weight decay and clipping, and one schedule
    over its steps and any dense fine-tuning after them."""
    return OptimConfig(lr=point.lr, weight_decay=point.weight_decay, grad_clip=point.grad_clip,
                       warmup_steps=max(1, point.warmup_steps),
                       decay_steps=max(1, point.steps + point.dense_finetune_steps))


def cast_for_precision(model: nn.Module, precision: str) -> nn.Module:
    """Cast the model to what ``Trainer`` expects for ``precision`` (bf16: bf16 weights); call before DDP."""
    return model.to(spec(precision).model_dtype)


def param_groups(model: nn.Module | list[torch.Tensor], weight_decay: float) -> list[dict]:
    """AdamW's two parameter groups: weight decay on matrices only (not biases, LayerNorm); an empty
    group is left out (some vendors' fused optimizers reject one)."""
    params = [p for p in (model.parameters() if isinstance(model, nn.Module) else model) if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


def make_optimizer(model: nn.Module | list[torch.Tensor], cfg: OptimConfig, *,
                   fused: bool = False) -> torch.optim.Optimizer:
    """AdamW over ``param_groups``; ``fused`` where the device has it (the adapter's ``fused_optimizer()``):
    one kernel for all parameters instead of a dozen per tensor."""
    return torch.optim.AdamW(param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2),
                             fused=fused)


def learning_rate(step: int, cfg: OptimConfig) -> float:
    """Linear warm-up, then cosine decay to ``min_lr`` (GPT-3 / nanoGPT schedule)."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.decay_steps))
    return cfg.min_lr + 0.5 * (1 + math.cos(math.pi * progress)) * (cfg.lr - cfg.min_lr)


class Trainer:
    """Holds model, optimizer and precision state; ``step()`` runs one optimizer step over ``gas`` micro-batches.

    A device whose programming model is eager PyTorch with vendor parts (a fused optimizer, its own
    clipping, a lazy graph to cut) subclasses this and overrides only those parts: ``precision_spec``,
    ``make_optimizer``, ``autocast``, ``clip_gradients``, or the whole ``optimizer_step``; the
    accumulation, the schedule and the loss check stay this class's.

    Args:
        model: the (possibly DDP-wrapped) model; ``model(x, y)`` returns ``(logits, loss)``.
        batches: yields ``(x, y)`` micro-batches on any device (moved here).
        device: where to compute.
        precision: fp32 / fp16 / bf16.
        gas: micro-batches per optimizer step.
        optim: optimizer settings.
        after_step: called after each optimizer step (e.g. re-applying a sparsity mask).
        fused_optimizer: use torch's fused AdamW (the device adapter says whether it exists).
        graph_break: called after each micro-batch's backward and after the optimizer step, where a
            device that records operations into a lazy graph must cut it (the adapter's choice).
    """

    def __init__(self, model: nn.Module, batches: Iterator, device: torch.device, precision: str, gas: int,
                 optim: OptimConfig, *, after_step: Callable[[], None] | None = None, fused_optimizer: bool = False,
                 graph_break: Callable[[], None] | None = None):
        self.model, self.batches, self.device, self.precision, self.gas = model, batches, device, precision, gas
        self.optim_cfg = optim
        self.after_step, self.graph_break = after_step, graph_break
        self.fused_optimizer = fused_optimizer
        self.step_count = 0
        # Unique trainable parameters (a tied embedding once), in a fixed order.
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.master: list[torch.Tensor] | None = None
        kind = self.precision_spec(precision)
        if kind.master_weights:
            if any(p.dtype != kind.model_dtype for p in self.params):
                raise ValueError(f"precision {precision} expects a {precision} model: "
                                 f"call cast_for_precision(model, {precision!r}) first")
            self.master = [p.detach().float().requires_grad_(True) for p in self.params]
        self.optimizer = self.make_optimizer(self.master if self.master is not None else model)
        self._autocast = (self.autocast(kind.autocast_dtype) if kind.autocast_dtype is not None
                          else contextlib.nullcontext())
        self.scaler = torch.amp.GradScaler(device.type) if kind.loss_scaling else None

    # --- the parts a device may replace

    def precision_spec(self, precision: str) -> PrecisionSpec:
        """What ``precision`` means for this trainer's step (``accel_kit.precision``)."""
        return spec(precision)

    def make_optimizer(self, params: nn.Module | list[torch.Tensor]) -> torch.optim.Optimizer:
        """The optimizer over ``params`` (the model, or its fp32 master weights)."""
        return make_optimizer(params, self.optim_cfg, fused=self.fused_optimizer)

    def autocast(self, dtype: torch.dtype):
        """The context the forward and loss run in for a precision that autocasts to ``dtype``."""
        return torch.autocast(self.device.type, dtype=dtype)

    def clip_gradients(self, params: list[torch.Tensor], max_norm: float) -> None:
        """Scale the gradients of ``params`` to a global norm of at most ``max_norm``."""
        torch.nn.utils.clip_grad_norm_(params, max_norm)

    def optimizer_step(self) -> None:
        """The update from the accumulated gradients: to the fp32 masters, unscaled, clipped, stepped, zeroed,
        and copied back to the model."""
        if self.master is not None:
            # bf16 gradients (accumulated over the micro-batches, all-reduced by DDP) to fp32.
            for master, p in zip(self.master, self.params):
                master.grad = p.grad.float() if p.grad is not None else None
                p.grad = None
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        if self.optim_cfg.grad_clip > 0:
            self.clip_gradients(self.master if self.master is not None else self.params, self.optim_cfg.grad_clip)
        if self.scaler:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.master is not None:
            self.copy_masters()

    def copy_masters(self) -> None:
        """The fp32 masters, updated, into the 16-bit model."""
        with torch.no_grad():
            torch._foreach_copy_(self.params, self.master)

    # --- the step

    def _no_sync(self, last: bool):
        no_sync = getattr(self.model, "no_sync", None)
        return contextlib.nullcontext() if last or no_sync is None else no_sync()

    def sequence_context(self, x: torch.Tensor, y: torch.Tensor):
        """The context one micro-batch's forward and backward run in (context parallelism shards ``x``, ``y``
        and the model's positions there); none by default."""
        return contextlib.nullcontext()

    def _graph_break(self) -> None:
        if self.graph_break is not None:
            self.graph_break()

    def accumulate(self) -> torch.Tensor:
        """Forward and backward over ``gas`` micro-batches; leaves the summed gradients in ``.grad``.

        Returns the mean micro-batch loss as a device tensor (no sync).
        """
        total = torch.zeros((), device=self.device)
        for micro in range(self.gas):
            x, y = next(self.batches)
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
            with self._no_sync(last=micro == self.gas - 1), self.sequence_context(x, y):
                with self._autocast:  # forward and loss only: the backward runs outside autocast
                    _, loss = self.model(x, y)
                loss = loss / self.gas  # mean over the accumulated micro-batches
                (self.scaler.scale(loss) if self.scaler else loss).backward()
            total += loss.detach()
            self._graph_break()  # this micro-batch's graph runs while the host records the next
        return total

    def step(self) -> float:
        """One optimizer step; returns the mean micro-batch loss (a Python float, which syncs the device)."""
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate(self.step_count, self.optim_cfg)
        total = self.accumulate()
        self.optimizer_step()
        if self.after_step is not None:
            self.after_step()
        self._graph_break()  # the update is a graph of its own
        self.step_count += 1
        value = total.item()
        if not math.isfinite(value):
            raise NonFiniteLoss(self.step_count, value)
        return value
