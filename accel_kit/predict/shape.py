"""The step shape: what one device computes per optimizer step, as work and memory terms.

``StepShape.work`` counts the work of each of ``TERMS`` (the compute model's terms, explained in
``accel_kit.predict.predictor``) and ``StepShape.memory_work`` the bytes of each of ``MEMORY_TERMS``;
``grad_bytes`` is what each rank synchronises over data parallelism, ``tensor_parallel_messages``,
``expert_parallel_messages`` and ``fsdp_messages`` what the other layouts send, ``bubble_fraction`` a
pipeline's idle share.
``shape_for`` makes the shape of a model preset.

A layout is dp x tp x pp x cp devices (``accel_kit.mesh.ParallelLayout``): a replica's micro-batches are
computed by its tp x pp x cp devices together, so each device's work is the replica's over tp and cp
(a block's products split over the tensor-parallel ranks, the sequence over the context-parallel
ones), for ceil(n_layers / pp) of the blocks (a pipeline's stage). The output projection and the
softmax over the vocabulary run on the last stage, whole on every tensor-parallel rank (the head is
replicated); so do the per-token elementwise ops across the width (norms, residuals, dropout: no
sequence parallelism here), which the ``hidden_elementwise`` term counts whole.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from accel_kit import flops as F
from accel_kit.json_types import JSONObject
from accel_kit.mesh import ParallelLayout
from accel_kit.models.family import FlopTerms
from accel_kit.precision import spec

GiB = 2**30
TERMS = ("matmul_flops", "attention_flops", "hidden_elementwise", "vocab_elementwise", "layer_launches",
         "optimizer_params")
MEMORY_TERMS = ("runtime_baseline", "estimate", "accumulation_working_set")


def pipeline_bubble(pp: int, microbatches: int) -> float:
    """The idle share of a pipeline's step: (pp - 1) / (m + pp - 1) for m chunks over pp stages (GPipe and
    1F1B alike: each stage waits pp - 1 chunk times to fill and to drain; Huang et al. 2019, GPipe, sec. 2.2)."""
    return (pp - 1) / (microbatches + pp - 1)


@dataclass(frozen=True)
class StepShape:
    """What one device computes per optimizer step (of any family: its shape, FLOP terms and layout).

    ``layout`` holds the devices (all of them, dp x tp x pp x cp), their split, and one replica's micro-batch
    (resolved) and GAS."""

    preset: str
    n_layers: int
    hidden: int
    vocab: int  # padded vocabulary the LM head computes over
    n_params: int
    flop_terms: FlopTerms  # the family's forward FLOPs per token at seq_len
    seq_len: int
    layout: ParallelLayout
    precision: str = "bf16"
    activation_checkpointing: bool = False
    flash_attention: bool = True
    cfg: object = field(default=None, compare=False, repr=False)  # the family's config (the memory estimate)
    n_moe_layers: int = 0  # the family's MoE layers (0: a dense model)
    experts_per_token: int = 0  # top-k: the expert copies of each token a MoE layer dispatches
    n_experts: int = 0  # routed experts per MoE layer (a rank holds n_experts / ep of them)

    @property
    def stage_layers(self) -> int:
        """Blocks on a pipeline stage (the larger ones: ceil(n_layers / pp)); every block without one."""
        return math.ceil(self.n_layers / self.layout.pp)

    @property
    def bubble_fraction(self) -> float:
        return pipeline_bubble(self.layout.pp, self.layout.microbatches)

    @property
    def tokens_per_step_per_replica(self) -> int:
        return self.layout.micro_batch_size * self.seq_len * self.layout.gas

    @property
    def tokens_per_step_per_device(self) -> float:
        """A replica's tokens per step over the devices that compute them together (tp x pp x cp)."""
        share = self.layout.replica_devices
        tokens = self.tokens_per_step_per_replica
        return tokens // share if tokens % share == 0 else tokens / share

    @property
    def flops_per_step_per_device(self) -> float:
        """Model FLOPs per device per step (as records count them: the layout does not change the model's)."""
        return self.tokens_per_step_per_device * self.flop_terms.total()

    def work(self) -> np.ndarray:
        """Work per optimizer step of one device (a pipeline's last stage, the busiest) for each of ``TERMS``."""
        tokens = self.tokens_per_step_per_replica
        recompute = 4 / 3 if self.activation_checkpointing else 1.0
        backward = 1 + F.BACKWARD_TO_FORWARD
        L, tp, cp, stage = self.n_layers, self.layout.tp, self.layout.cp, self.stage_layers
        # Exact integers over one division (a whole model on one device: the replica's counts exactly):
        # the stage's share of the blocks' products over tp x cp, the head's over cp.
        matmul = tokens * (self.flop_terms.matmul * stage + self.flop_terms.logits * L * tp) / (L * tp * cp)
        attention = tokens * self.flop_terms.attention * stage / (L * tp * cp)
        return np.array([matmul * backward * recompute, attention * backward * recompute,
                         tokens * stage * self.hidden / cp * recompute, tokens * self.vocab / cp,
                         self.layout.gas * self.layout.microbatches * self.launch_units(), self.optimizer_params()],
                        dtype=float)

    def launch_units(self) -> int:
        """What a micro-batch chunk issues one at a time on a device, each at a cost independent of its size: every
        block of the stage, and every local expert of its MoE layers. An expert's products run expert by expert
        (a loop, or a grouped kernel that loops on a CPU), so its cost follows the experts a rank holds more than
        their rows: moe-debug's training step at one thread, micro-batch 4, took 126 ms with its 8 experts and
        60 ms with 2 taking the same rows (an ep-4 rank's share), about 5 ms per expert and MoE layer, where a
        block costs about 2 ms a micro-batch besides its FLOPs. Counted 1 each (one rate for both: a single
        device's records cannot tell them apart, since their counts grow together)."""
        return self.stage_layers + self.stage_moe_layers * (self.n_experts // self.layout.ep)

    def weights_per_device(self) -> int:
        """Parameters one device computes with (``accel_kit.models.memory.weights_per_device``); the model's
        own count without tensor, pipeline or expert parallelism."""
        if self.layout.tp * self.layout.pp * self.layout.ep == 1:
            return self.n_params
        from accel_kit.models.memory import weights_per_device

        return weights_per_device(self.cfg, self.n_params, self.layout)

    def optimizer_params(self) -> int:
        """Parameters one device's AdamW updates: its weights, a 1/dp shard of them under FSDP."""
        local = self.weights_per_device()
        return local // self.layout.dp if self.layout.engine == "fsdp" else local

    def grad_bytes(self) -> int:
        """Bytes of gradients each rank synchronises per step over dp (bf16 models keep bf16 gradients). Under
        expert parallelism a rank's expert shard is reduced over the dp / ep ranks holding it, not over dp: the
        ring over dp taken for it too is an upper bound."""
        kind = spec(self.precision)
        # Gradients take the dtype the model is held in: under DDP that is the precision's model dtype
        # (bf16 for bf16; fp32 for fp16, whose autocast leaves the model fp32). DeepSpeed's bf16 and
        # fp16 modes hold the model itself in the 16-bit type (the fp32 master copy is the
        # optimizer's), so its gradients are 16-bit in both.
        per = kind.bytes_per_element if self.layout.engine == "deepspeed" and kind.mixed else kind.model_dtype.itemsize
        return self.weights_per_device() * per

    def tensor_parallel_messages(self) -> tuple[int, float]:
        """(all-reduces per step, bytes of each) over the tp group: per block, the attention's and the MLP's
        row-parallel outputs in forward and their column-parallel inputs' gradients in backward (2 + 2;
        Shoeybi et al. 2019, Megatron-LM, sec. 3), 2 more where checkpointing recomputes the forward; each
        a chunk's activations, b x s x h in the compute dtype (s / cp under context parallelism)."""
        if self.layout.tp == 1:
            return 0, 0.0
        per_block = 4 + (2 if self.activation_checkpointing else 0)
        count = self.layout.gas * self.layout.microbatches * self.stage_layers * per_block
        chunk = self.layout.micro_batch_size / self.layout.microbatches
        return count, chunk * self.seq_len / self.layout.cp * self.hidden * spec(self.precision).bytes_per_element

    def expert_parallel_messages(self) -> tuple[int, float]:
        """(all-to-alls per step, bytes each rank sends in each) over the ep group: per MoE layer of the stage and
        micro-batch chunk, the dispatch and the combine in forward and their reverses in backward (4), 2 more
        where checkpointing recomputes the forward; each a chunk's token copies, b x s x k x h in the compute
        dtype (``accel_kit.models.moe.parallel``). The counts' all-gather before each dispatch (E integers) is
        latency only: ``expert_parallel_count_gathers``."""
        if self.layout.ep == 1 or not self.n_moe_layers:
            return 0, 0.0
        per_layer = 4 + (2 if self.activation_checkpointing else 0)
        count = self._moe_layer_chunks() * per_layer
        chunk = self.layout.micro_batch_size / self.layout.microbatches
        copies = chunk * self.seq_len / self.layout.cp * self.experts_per_token
        return count, copies * self.hidden * spec(self.precision).bytes_per_element

    def fsdp_messages(self) -> tuple[int, int, int]:
        """(all-gathers per step, bytes each, bytes of the gradients' reduce-scatter) over dp under FSDP:
        every micro-batch gathers the parameters in the compute dtype for its forward and again for its
        backward (FSDP2 frees them after the forward), and the step reduce-scatters the gradients once
        (``set_requires_gradient_sync`` on the last micro-batch), in fp32 (the bf16 policy's reduce dtype)."""
        local = self.weights_per_device()
        return 2 * self.layout.gas, local * spec(self.precision).bytes_per_element, local * 4

    @property
    def fsdp_units(self) -> int:
        """The units FSDP shards, each gathered and reduced in a call of its own: every block of the stage and
        the root module holding the rest (``accel_kit.engine.parallel``)."""
        return self.stage_layers + 1

    def expert_parallel_count_gathers(self) -> int:
        """All-gathers per step of the tokens-per-expert counts over the ep group, one before each forward
        dispatch (a few integers: no bandwidth, but a call each)."""
        if self.layout.ep == 1 or not self.n_moe_layers:
            return 0
        return self._moe_layer_chunks() * (2 if self.activation_checkpointing else 1)

    @property
    def stage_moe_layers(self) -> int:
        """The MoE layers of a pipeline stage (the larger ones' share); all of them without a pipeline."""
        return math.ceil(self.n_moe_layers * self.stage_layers / self.n_layers)

    def _moe_layer_chunks(self) -> int:
        """The stage's MoE layers times the micro-batch chunks each runs per step."""
        return self.layout.gas * self.layout.microbatches * self.stage_moe_layers

    def memory_estimate(self):
        """``accel_kit.models.MemoryEstimate`` of one device at this shape."""
        from accel_kit.models import estimate_training_memory

        return estimate_training_memory(self.cfg, self.n_params, self.layout.micro_batch_size, self.seq_len,
                                        self.precision, activation_checkpointing=self.activation_checkpointing,
                                        flash_attention=self.flash_attention, layout=self.layout)

    def memory_estimate_bytes(self) -> int:
        return self.memory_estimate().total_bytes

    def memory_work(self) -> np.ndarray:
        """Bytes for each of ``MEMORY_TERMS``."""
        est = self.memory_estimate()
        working_set = est.activations_bytes + est.logits_bytes if self.layout.gas > 1 else 0
        return np.array([1.0, est.total_bytes, working_set], dtype=float)


def shape_for(preset: str, layout: ParallelLayout, *, seq_len: int, precision: str = "bf16",
              activation_checkpointing: bool = False, vocab_size: int | None = None,
              flash_attention: bool = True) -> StepShape:
    """The step shape of a model preset at these settings, in ``layout`` (its micro-batch resolved)."""
    from accel_kit.models import count_params, family_of, get_config

    if layout.micro_batch_size is None:
        raise ValueError("a step shape's layout needs its micro_batch_size (None is the system's: resolve it first)")
    overrides: JSONObject = {"seq_len": seq_len}
    if vocab_size:
        overrides["vocab_size"] = vocab_size
    cfg = get_config(preset, **overrides)
    family = family_of(cfg)
    model = family.shape(cfg)
    return StepShape(preset, model.n_layers, model.hidden_size, model.vocab_size_model,
                     count_params(preset, **overrides), family.flop_terms(cfg, seq_len), seq_len, layout, precision,
                     activation_checkpointing, flash_attention, cfg=cfg, n_moe_layers=model.n_moe_layers,
                     experts_per_token=model.experts_per_token, n_experts=model.n_experts)
