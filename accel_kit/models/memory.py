"""Will a training configuration fit a device? An estimate made before anything is allocated.

Bytes per parameter (see ``accel_kit.engine.step``): fp32 holds weights 4 + gradients 4 +
AdamW moments 8 = 16; bf16 holds bf16 weights and gradients (2 + 2) beside fp32 master
weights and their gradients (4 + 4) and the moments (8) = 20; fp16 (autocast) holds fp32
weights, gradients and moments (16) plus a 2-byte cast of the weights = 18. Activations per layer follow Korthikanti et al. 2022 ("Reducing
Activation Recomputation in Large Transformer Models", section 4.1): s*b*h*(34 + 5*a*s/h)
bytes with 16-bit activations; the 5*a*s/h term is the stored attention-score matrix,
which flash / memory-efficient attention never materialises. fp32 activations double it.
With activation checkpointing only each block's input (2*s*b*h bytes at 16 bit) is kept,
plus one block's full activations during its recomputation.
"""
from __future__ import annotations

from dataclasses import dataclass

from accel_kit.models.gpt import GPTConfig
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


def estimate_training_memory(cfg: GPTConfig, n_params: int, micro_batch: int, seq_len: int, precision: str, *,
                             activation_checkpointing: bool = False, flash_attention: bool = True,
                             zero_shards: int = 1) -> MemoryEstimate:
    """Bytes one device needs to train ``cfg`` at (micro_batch, seq_len) with AdamW.

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
    s, b, h, a = seq_len, micro_batch, cfg.hidden_size, cfg.n_heads
    per_layer = s * b * h * 34 + (0 if flash_attention else 5 * a * s * s * b)
    if activation_checkpointing:
        activations = act_scale * (cfg.n_layers * 2 * s * b * h + per_layer)
    else:
        activations = act_scale * cfg.n_layers * per_layer
    # Logits in the compute dtype (kept: the model returns them), then at the loss's backward, all live
    # at once: log-softmax's fp32 output (saved for backward), its incoming gradient and the gradient it
    # returns (fp32 each). The fp32 cast of mixed-precision logits is freed after the forward.
    logits = b * s * cfg.padded_vocab_size * (kind.bytes_per_element + 4 + 4 + 4)
    return MemoryEstimate(n_params, weights, grads, optimizer, activations, logits)


def fits(estimate: MemoryEstimate, device_bytes: int | None, *, usable_fraction: float = 0.9) -> bool:
    """True when the estimate is within ``usable_fraction`` of the device (allocator slack); unknown memory fits."""
    return device_bytes is None or estimate.total_bytes <= usable_fraction * device_bytes


def estimate_block_memory(batch: int, seq_len: int, hidden: int, mlp_ratio: int, dtype_bytes: int, *,
                          backward: bool) -> int:
    """Bytes one block's microbenchmark point needs, at least: weights (and their gradients),
    input and output, and the activations backward keeps (the 34 s*b*h-byte figure above, per
    16-bit element; scaled to ``dtype_bytes``), with fused attention (no score matrix).
    """
    weights = (4 + 2 * mlp_ratio) * hidden**2 * dtype_bytes
    io = 2 * batch * seq_len * hidden * dtype_bytes
    if not backward:
        # the widest live intermediate: the MLP's (tokens, r*h) activation
        return weights + io + batch * seq_len * mlp_ratio * hidden * dtype_bytes
    activations = seq_len * batch * hidden * 34 * dtype_bytes // 2
    return 2 * weights + 2 * io + activations
