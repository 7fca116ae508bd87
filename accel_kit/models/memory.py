"""Will a training configuration fit a device? An estimate made before anything is allocated.

Bytes per parameter (see ``accel_kit.engine.step``): fp32 holds weights 4 + gradients 4 +
AdamW moments 8 = 16; bf16 holds bf16 weights and gradients (2 + 2) beside fp32 master
weights and their gradients (4 + 4) and the moments (8) = 20; fp16 (autocast) holds fp32
weights, gradients and moments (16) plus a 2-byte cast of the weights = 18. Activations per
layer are the family's (``Family.activation_bytes_per_layer``, 16-bit, after Korthikanti et al.
2022, "Reducing Activation Recomputation in Large Transformer Models", section 4.1); fp32
activations double them. With activation checkpointing only each block's input (2*s*b*h bytes
at 16 bit) is kept, plus one block's full activations during its recomputation.
"""
from __future__ import annotations

from dataclasses import dataclass

from typing import Any

from accel_kit.models.registry import family_of
from accel_kit.precision import spec

GiB = 2**30


@dataclass
class MemoryEstimate:
    params: int
    weights_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    activations_bytes: int
    logits_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.grads_bytes + self.optimizer_bytes + self.activations_bytes + self.logits_bytes

    def describe(self) -> str:
        parts = {"weights": self.weights_bytes, "grads": self.grads_bytes, "optimizer": self.optimizer_bytes,
                 "activations": self.activations_bytes, "logits": self.logits_bytes}
        return f"{self.total_bytes / GiB:.1f} GiB (" + ", ".join(f"{k} {v / GiB:.1f}" for k, v in parts.items()) + ")"


def estimate_training_memory(cfg: Any, n_params: int, micro_batch: int, seq_len: int, precision: str, *,
                             activation_checkpointing: bool = False, flash_attention: bool = True,
                             zero_shards: int = 1) -> MemoryEstimate:
    """Bytes one device needs to train ``cfg`` (any family's config) at (micro_batch, seq_len) with AdamW.

    ``zero_shards`` > 1 divides the optimizer state (DeepSpeed ZeRO stage 1 over that many ranks).
    """
    kind = spec(precision)
    mixed = kind.mixed
    # fp32 weights, plus a 16-bit copy where the step computes in 16 bits (bf16's model beside its fp32
    # master weights; fp16 autocast's cached casts).
    weights = n_params * (4 + (kind.bytes_per_element if mixed else 0))
    # fp32 gradients, plus the 16-bit model's own where the optimizer updates fp32 master weights.
    grads = n_params * (4 + (kind.bytes_per_element if kind.master_weights else 0))
    optimizer = n_params * 8 // max(1, zero_shards)
    act_scale = 1 if mixed else 2  # the 34 sbh figure is for 16-bit activations
    family = family_of(cfg)
    shape = family.shape(cfg)
    s, b, h = seq_len, micro_batch, shape.hidden_size
    per_layer = family.activation_bytes_per_layer(cfg, b, s, flash_attention=flash_attention)
    if activation_checkpointing:
        activations = act_scale * (shape.n_layers * 2 * s * b * h + per_layer)
    else:
        activations = act_scale * shape.n_layers * per_layer
    # Logits in the compute dtype (kept: the model returns them), then at the loss's backward, all live
    # at once: log-softmax's fp32 output (saved for backward), its incoming gradient and the gradient it
    # returns (fp32 each). The fp32 cast of mixed-precision logits is freed after the forward.
    logits = b * s * shape.vocab_size_model * (kind.bytes_per_element + 4 + 4 + 4)
    return MemoryEstimate(n_params, weights, grads, optimizer, activations, logits)


def fits(estimate: MemoryEstimate, device_bytes: int | None, *, usable_fraction: float = 0.9) -> bool:
    """True when the estimate is within ``usable_fraction`` of the device (allocator slack); unknown memory fits."""
    return device_bytes is None or estimate.total_bytes <= usable_fraction * device_bytes


def estimate_block_memory(cfg: Any, batch: int, seq_len: int, dtype_bytes: int, *, backward: bool) -> int:
    """Bytes one layer's microbenchmark point needs, at least: weights (and their gradients), input
    and output, and the activations backward keeps (the family's 16-bit figure, scaled to
    ``dtype_bytes``), with fused attention (no score matrix).
    """
    family = family_of(cfg)
    shape = family.shape(cfg)
    weights = family.layer_weight_count(cfg) * dtype_bytes
    io = 2 * batch * seq_len * shape.hidden_size * dtype_bytes
    if not backward:
        # the widest live intermediate: the MLP's (tokens, ffn) activation
        return weights + io + batch * seq_len * shape.ffn_hidden_size * dtype_bytes
    activations = family.activation_bytes_per_layer(cfg, batch, seq_len, flash_attention=True) * dtype_bytes // 2
    return 2 * weights + 2 * io + activations
