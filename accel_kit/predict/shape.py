"""The step shape: what one data-parallel rank computes per optimizer step, as work and memory terms.

``StepShape.work`` counts the work of each of ``TERMS`` (the compute model's terms, explained in
``accel_kit.predict.model``) and ``StepShape.memory_work`` the bytes of each of ``MEMORY_TERMS``;
``grad_bytes`` is what each rank synchronises. ``shape_for`` makes the shape of a model preset.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from accel_kit import flops as F
from accel_kit.models.family import FlopTerms
from accel_kit.precision import spec

GiB = 2**30
TERMS = ("matmul_flops", "attention_flops", "hidden_elementwise", "vocab_elementwise", "layer_launches",
         "optimizer_params")
MEMORY_TERMS = ("runtime_baseline", "estimate", "accumulation_working_set")


@dataclass(frozen=True)
class StepShape:
    """What one data-parallel rank computes per optimizer step (of any family: its shape and FLOP terms)."""

    preset: str
    n_layers: int
    hidden: int
    vocab: int  # padded vocabulary the LM head computes over
    n_params: int
    flop_terms: FlopTerms  # the family's forward FLOPs per token at seq_len
    seq_len: int
    micro_batch_size: int
    gas: int = 1
    devices: int = 1
    precision: str = "bf16"
    engine: str = "ddp"
    activation_checkpointing: bool = False
    flash_attention: bool = True
    cfg: Any = field(default=None, compare=False, repr=False)  # the family's config (the memory estimate)

    @property
    def tokens_per_step_per_device(self) -> int:
        return self.micro_batch_size * self.seq_len * self.gas

    @property
    def flops_per_step_per_device(self) -> float:
        return self.tokens_per_step_per_device * self.flop_terms.total()

    def work(self) -> np.ndarray:
        """Work per optimizer step for each of ``TERMS``."""
        tokens = self.tokens_per_step_per_device
        recompute = 4 / 3 if self.activation_checkpointing else 1.0
        backward = 1 + F.BACKWARD_TO_FORWARD
        matmul = tokens * (self.flop_terms.matmul + self.flop_terms.logits)
        attention = tokens * self.flop_terms.attention
        return np.array([matmul * backward * recompute, attention * backward * recompute,
                         tokens * self.n_layers * self.hidden * recompute, tokens * self.vocab,
                         self.gas * self.n_layers, self.n_params], dtype=float)

    def grad_bytes(self) -> int:
        """Bytes of gradients each rank synchronises per step (bf16 models keep bf16 gradients)."""
        kind = spec(self.precision)
        # Gradients take the dtype the model is held in: under DDP that is the precision's model dtype
        # (bf16 for bf16; fp32 for fp16, whose autocast leaves the model fp32). DeepSpeed's bf16 and
        # fp16 modes hold the model itself in the 16-bit type (the fp32 master copy is the
        # optimizer's), so its gradients are 16-bit in both.
        per = kind.bytes_per_element if self.engine == "deepspeed" and kind.mixed else kind.model_dtype.itemsize
        return self.n_params * per

    def memory_estimate(self):
        """``accel_kit.models.MemoryEstimate`` of one device at this shape."""
        from accel_kit.models import estimate_training_memory

        return estimate_training_memory(self.cfg, self.n_params, self.micro_batch_size, self.seq_len, self.precision,
                                        activation_checkpointing=self.activation_checkpointing,
                                        flash_attention=self.flash_attention,
                                        zero_shards=self.devices if self.engine == "deepspeed" else 1)

    def memory_estimate_bytes(self) -> int:
        return self.memory_estimate().total_bytes

    def memory_work(self) -> np.ndarray:
        """Bytes for each of ``MEMORY_TERMS``."""
        est = self.memory_estimate()
        working_set = est.activations_bytes + est.logits_bytes if self.gas > 1 else 0
        return np.array([1.0, est.total_bytes, working_set], dtype=float)


def shape_for(preset: str, *, seq_len: int, micro_batch_size: int, gas: int = 1, devices: int = 1,
              precision: str = "bf16", engine: str = "ddp", activation_checkpointing: bool = False,
              vocab_size: int | None = None, flash_attention: bool = True) -> StepShape:
    """The step shape of a model preset at these settings."""
    from accel_kit.models import count_params, family_of, get_config

    overrides: dict[str, Any] = {"seq_len": seq_len}
    if vocab_size:
        overrides["vocab_size"] = vocab_size
    cfg = get_config(preset, **overrides)
    family = family_of(cfg)
    model = family.shape(cfg)
    return StepShape(preset, model.n_layers, model.hidden_size, model.vocab_size_model,
                     count_params(preset, **overrides), family.flop_terms(cfg, seq_len), seq_len, micro_batch_size,
                     gas, devices, precision, engine, activation_checkpointing, flash_attention, cfg=cfg)
