"""Precision: what fp32, fp16 and bf16 mean in accel-kit, declared once.

Every module that needs to know what a precision implies (the dtype a model is held in,
whether the forward runs under autocast, whether the optimizer keeps fp32 master weights,
whether the loss is scaled, how many bytes an activation takes) asks ``spec(name)``
instead of comparing the name with a string. This module imports nothing of accel-kit, so
any layer (devices, models, engine, predictor) may use it.

The training recipe per precision (``accel_kit.engine.step``):

- ``fp32``: fp32 throughout.
- ``bf16``: the model is held in bf16 (weights, activations, gradients) and the optimizer
  keeps fp32 master weights and its state, as Megatron-LM and DeepSpeed's bf16 mode do.
  bf16 has fp32's exponent range, so no loss scaling.
- ``fp16``: the model stays fp32 and its forward and backward run under ``torch.autocast``
  with a gradient scaler, since fp16's 5-bit exponent underflows small gradients.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

Precision = Literal["fp32", "fp16", "bf16"]
# What a user may ask for: a precision, or "auto" (resolved per device by its adapter).
PrecisionRequest = Literal["auto", "fp32", "fp16", "bf16"]

PRECISIONS: tuple[str, ...] = ("fp32", "fp16", "bf16")
# The lower precisions, in the order "auto" prefers them: bf16 trains without loss scaling.
LOW_PRECISIONS: tuple[str, ...] = ("bf16", "fp16")


@dataclass(frozen=True)
class PrecisionSpec:
    """What one precision means for a training step and for memory accounting."""

    name: str
    dtype: torch.dtype  # the compute dtype: matmul operands and activations
    model_dtype: torch.dtype  # what the model's parameters are held in while training
    autocast_dtype: torch.dtype | None  # the forward/backward runs under torch.autocast to this; None: no autocast
    master_weights: bool  # the optimizer updates an fp32 copy of the weights (model_dtype is 16-bit)
    loss_scaling: bool  # gradients are scaled against underflow (a GradScaler)

    @property
    def bytes_per_element(self) -> int:
        """Bytes of one activation (or logit) in the compute dtype."""
        return self.dtype.itemsize

    @property
    def mixed(self) -> bool:
        """Computes in a 16-bit type (fp16, bf16), with fp32 kept somewhere for the update."""
        return self.dtype != torch.float32


_SPECS = {
    "fp32": PrecisionSpec("fp32", torch.float32, torch.float32, None, master_weights=False, loss_scaling=False),
    "fp16": PrecisionSpec("fp16", torch.float16, torch.float32, torch.float16, master_weights=False,
                          loss_scaling=True),
    "bf16": PrecisionSpec("bf16", torch.bfloat16, torch.bfloat16, None, master_weights=True, loss_scaling=False),
}
DTYPES: dict[str, torch.dtype] = {name: s.dtype for name, s in _SPECS.items()}


def spec(precision: str) -> PrecisionSpec:
    """The meaning of ``precision`` (fp32 / fp16 / bf16); a ValueError naming the known ones otherwise."""
    try:
        return _SPECS[precision]
    except KeyError:
        raise ValueError(f"unknown precision {precision!r}; known: {', '.join(PRECISIONS)}") from None


def dtype_of(precision: str) -> torch.dtype:
    """The compute dtype of a precision name (fp32 / fp16 / bf16)."""
    return spec(precision).dtype
