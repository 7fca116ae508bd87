"""Will a training configuration fit a device? An estimate made before anything is allocated, per device
for the point's parallel layout (``accel_kit.mesh.ParallelLayout``; a training point is one).

Bytes per parameter (see ``accel_kit.engine.step``): fp32 holds weights 4 + gradients 4 +
AdamW moments 8 = 16; bf16 holds bf16 weights and gradients (2 + 2) beside fp32 master
weights and their gradients (4 + 4) and the moments (8) = 20; fp16 (autocast) holds fp32
weights, gradients and moments (16) plus a 2-byte cast of the weights = 18. Activations per
layer are the family's (``Family.activation_bytes_per_layer``, 16-bit, after Korthikanti et al.
2022, "Reducing Activation Recomputation in Large Transformer Models", section 4.1); fp32
activations double them. With activation checkpointing only each block's input (2*s*b*h bytes
at 16 bit) is kept, plus one block's full activations during its recomputation.

Per layout (``accel_kit.engine.parallel`` builds them):

- tensor parallelism (tp) splits each block's linears (``Family.layer_weight_count``) over its ranks;
  the embedding, the head, the norms and the biases stay whole on each. The activations inside
  attention and the MLP split too, what lies between them does not (the family's ``tp`` figure);
- a pipeline (pp) keeps ceil(n_layers / pp) blocks on a stage, the embedding on the first and the
  final norm, the head and the logits on the last; the estimate is the worse of those two stages (a
  middle one holds less). GPipe runs every chunk's forward before the backwards, so a stage keeps all
  m chunks of b / m samples (the micro-batch's activations); 1F1B keeps at most pp - i chunks in
  flight on stage i (pp on the first, one on the last);
- FSDP (``engine fsdp``, FSDP2 over dp) keeps a 1/dp shard of every fp32 parameter, gradient and
  optimizer moment (bf16's master copy is the shard itself: no 16-bit model beside it), plus what is
  gathered whole in the compute dtype: the root's parameters (embedding, head, norms; FSDP2 keeps the
  root unsharded between forward and backward) and their gradients for the whole step, the running
  block's and the next one's parameters (FSDP2 gathers the next block while this one computes), and
  one block's gradient before its reduce-scatter (with its fp32 cast under bf16, whose reduce-scatter
  runs in fp32);
- DeepSpeed ZeRO-1 divides the optimizer moments by dp;
- context parallelism (cp) splits the sequence, so every activation and the logits divide by cp;
- expert parallelism (ep, carved out of dp) keeps E / ep of each MoE layer's routed experts
  (``Family.expert_weight_count``) on a device, so their weights, gradients and optimizer moments divide by ep;
  under FSDP their shards are 1/dp of them as every parameter's (1/(dp/ep) of a rank's E/ep experts), and a
  gathered block holds its E / ep experts only.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from accel_kit.mesh import ParallelLayout
from accel_kit.models.family import Family
from accel_kit.models.registry import family_of
from accel_kit.precision import spec

GiB = 2**30
FSDP_GATHERED_BLOCKS = 2  # the block that runs and the next, whose all-gather overlaps it


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


@dataclass(frozen=True)
class _Stage:
    """What one device holds of the model: its blocks' share and the rest (embedding, head, norms, biases)."""

    blocks: int  # blocks on this stage
    rest_weights: int  # weights of its that tensor parallelism leaves whole
    head: bool  # holds the head (and so the logits)
    chunks_in_flight: int  # micro-batch chunks whose activations it keeps at once


def _stages(cfg: object, family: Family, n_params: int, layout: ParallelLayout) -> list[_Stage]:
    """The stages whose worst is the estimate: the only one without a pipeline; else the first and the last."""
    layers = family.shape(cfg).n_layers
    block = family.layer_weight_count(cfg)
    m = layout.microbatches
    if layout.pp == 1:
        return [_Stage(layers, n_params - layers * block, True, 1)]
    embedding, block_all, head = _stage_weights(cfg, family, n_params)
    per_stage = math.ceil(layers / layout.pp)
    extra = per_stage * (block_all - block)  # the blocks' norms and biases
    first_chunks = m if layout.pp_schedule == "gpipe" else min(layout.pp, m)
    last_chunks = m if layout.pp_schedule == "gpipe" else 1
    return [_Stage(per_stage, embedding + extra, False, first_chunks),
            _Stage(per_stage, head + extra, True, last_chunks)]


@functools.lru_cache(maxsize=16)  # a build on the meta device per call: a tune predicts hundreds of pipelines
def _stage_weights(cfg: object, family: Family, n_params: int) -> tuple[int, int, int]:
    """Weights of the embedding, of one whole block and of the head (a tied projection counted in both
    ends: a pipeline's last stage holds its own copy), from the family's stage split on the meta device;
    a family without one: everything but the blocks at both ends."""
    import torch

    with torch.device("meta"):
        model = family.build(cfg)
    try:
        split = family.pipeline_stages(model)
    except NotImplementedError:
        layers, block = family.shape(cfg).n_layers, family.layer_weight_count(cfg)
        return n_params - layers * block, block, n_params - layers * block

    def count(names: tuple[str, ...]) -> int:
        return sum(p.numel() for name in names for p in getattr(model, name).parameters())

    first_block = getattr(model, split.blocks)[0]
    return count(split.embedding), sum(p.numel() for p in first_block.parameters()), count(split.head)


def weights_per_device(cfg: object, n_params: int, layout: ParallelLayout) -> int:
    """Parameters one device computes with in ``layout`` (before FSDP's sharding over dp): its share of
    the blocks' linears over tp and the rest whole, on a pipeline's larger end stage."""
    family = family_of(cfg)
    block_local = family.layer_weight_count(cfg) // layout.tp
    unheld = _experts_not_held(cfg, family, layout)
    return max(s.blocks * block_local + s.rest_weights for s in _stages(cfg, family, n_params, layout)) - unheld


def _experts_not_held(cfg: object, family: Family, layout: ParallelLayout) -> int:
    """The routed experts' weights a device does not hold under expert parallelism: (1 - 1/ep) of what it would
    (the experts' share of the blocks' linears, over tp as ``layer_weight_count``'s is); 0 without ep."""
    if layout.ep == 1:
        return 0
    experts = family.expert_weight_count(cfg) // layout.tp
    return experts - experts // layout.ep


def estimate_training_memory(cfg: object, n_params: int, micro_batch: int, seq_len: int, precision: str, *,
                             activation_checkpointing: bool = False, flash_attention: bool = True,
                             layout: ParallelLayout = ParallelLayout()) -> MemoryEstimate:
    """Bytes one device needs to train ``cfg`` (any family's config) at (micro_batch, seq_len) with AdamW
    in ``layout`` (default: one replica of the whole model, as under DDP); a pipeline's worst stage.

    ``params`` of the result is the model's parameter count, whatever share one device holds.
    """
    family = family_of(cfg)
    stages = [_stage_estimate(cfg, family, n_params, micro_batch, seq_len, precision, stage, layout,
                              activation_checkpointing=activation_checkpointing, flash_attention=flash_attention)
              for stage in _stages(cfg, family, n_params, layout)]
    return max(stages, key=lambda e: e.total_bytes)


def _stage_estimate(cfg: object, family: Family, n_params: int, micro_batch: int, seq_len: int, precision: str,
                    stage: _Stage, layout: ParallelLayout, *, activation_checkpointing: bool,
                    flash_attention: bool) -> MemoryEstimate:
    kind = spec(precision)
    mixed, c = kind.mixed, kind.bytes_per_element
    tp, dp = layout.tp, layout.dp
    block_local = family.layer_weight_count(cfg) // tp  # one block's linears on one tensor-parallel rank
    unheld = _experts_not_held(cfg, family, layout)  # expert parallelism's: the other ep ranks' experts
    every_expert = stage.blocks * block_local + stage.rest_weights  # what the device computes with without ep
    local = every_expert - unheld  # the weights this device computes with
    if layout.engine == "fsdp":
        # fp32 shards of everything (bf16's master copy is the shard; under ep a rank's experts are sharded
        # over dp / ep, so every weight's shard is 1/dp of it still), plus what is gathered whole in the
        # compute dtype: the root's parameters and gradients all step, two blocks' parameters, one block's
        # gradient (and its fp32 cast for bf16's fp32 reduce-scatter); a block gathers its ep rank's experts.
        gathered = block_local - unheld // max(1, family.shape(cfg).n_moe_layers)
        weights = every_expert * 4 // dp + c * (stage.rest_weights + FSDP_GATHERED_BLOCKS * gathered)
        grads = every_expert * 4 // dp + c * stage.rest_weights + (c + (4 if mixed else 0)) * gathered
        optimizer = every_expert * 8 // dp
    else:
        # fp32 weights, plus a 16-bit copy where the step computes in 16 bits (bf16's model beside its fp32
        # master weights; fp16 autocast's cached casts).
        weights = local * (4 + (c if mixed else 0))
        # fp32 gradients, plus the 16-bit model's own where the optimizer updates fp32 master weights.
        grads = local * (4 + (c if kind.master_weights else 0))
        optimizer = local * 8 // (dp if layout.engine == "deepspeed" else 1)  # ZeRO-1 shards the moments
    act_scale = 1 if mixed else 2  # the 34 sbh figure is for 16-bit activations
    shape = family.shape(cfg)
    s, h = seq_len, shape.hidden_size
    b = max(1, micro_batch // layout.microbatches)  # one pipeline chunk (the micro-batch without a pipeline)
    per_layer = family.activation_bytes_per_layer(cfg, b, s, flash_attention=flash_attention, tp=tp)
    chunks = stage.chunks_in_flight
    if activation_checkpointing:  # each block's input per chunk in flight (whole on every tp rank), one block's all
        activations = act_scale * (chunks * stage.blocks * 2 * s * b * h + per_layer)
    else:
        activations = act_scale * chunks * stage.blocks * per_layer
    # Logits in the compute dtype (kept: the model returns them), then at the loss's backward, all live
    # at once: log-softmax's fp32 output (saved for backward), its incoming gradient and the gradient it
    # returns (fp32 each). The fp32 cast of mixed-precision logits is freed after the forward. In a
    # pipeline every chunk in flight on the last stage keeps its logits and log-softmax; the
    # gradients are one chunk's at a time.
    logits = 0
    if stage.head:
        logits = b * s * shape.vocab_size_model * (chunks * (kind.bytes_per_element + 4) + 4 + 4)
    return MemoryEstimate(n_params, weights, grads, optimizer, activations // layout.cp, logits // layout.cp)


def fits(estimate: MemoryEstimate, device_bytes: int | None, *, usable_fraction: float = 0.9) -> bool:
    """True when the estimate is within ``usable_fraction`` of the device (allocator slack); unknown memory fits."""
    return device_bytes is None or estimate.total_bytes <= usable_fraction * device_bytes


def estimate_block_memory(cfg: object, batch: int, seq_len: int, dtype_bytes: int, *, backward: bool) -> int:
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
