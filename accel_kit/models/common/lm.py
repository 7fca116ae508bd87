"""The causal language model every family here builds: an embedding, a list of blocks, a head.

``CausalLM`` is the skeleton: ``forward(idx (B, T), targets (B, T) | None) -> (logits, loss)`` computed as
``embed``, ``forward_blocks`` and ``head``, the three parts a pipeline stage runs alone
(``Family.stage_forward``), with activation checkpointing per block; ``forward_cached`` for generation
(``accel_kit.models.kv_cache``). A family's model declares where it splits (``stages``: the attribute names
of its embedding, its blocks and its head, transformers' names) and how tokens at positions start ..
start + T - 1 are embedded (``embed_at``). ``RotaryCausalLM`` is the RoPE families' model (Llama, the MoE
family): a token embedding, ``DecoderBlock``s sharing one set of RoPE tables, a final RMSNorm, an output
projection optionally tied to the embedding.
"""
from __future__ import annotations

from typing import Callable, ClassVar, Protocol

import torch
from torch import nn

from accel_kit.models.common.norm import RMSNorm
from accel_kit.models.common.rope import RopeConfig, rope_tables
from accel_kit.models.family import PipelineStages, lm_loss, run_blocks, unique_param_count, unique_tensors
from accel_kit.models.kv_cache import KVCache, Position


class LMConfig(Protocol):
    """What ``CausalLM`` reads of its family's config: the positions the model is built for."""

    seq_len: int


class CausalLM(nn.Module):
    """Decoder-only transformer LM. ``forward(idx (B, T), targets (B, T) | None) -> (logits, loss)``.

    The model keeps its config as ``.cfg`` (``seq_len``: the positions it is built for; how
    ``family_of_model`` finds the family through a wrapper)."""

    stages: ClassVar[PipelineStages]  # the attribute names of the embedding, the blocks and the head

    def __init__(self, cfg: LMConfig, *, activation_checkpointing: bool = False):
        super().__init__()
        self.cfg = cfg
        self.activation_checkpointing = activation_checkpointing

    @property
    def blocks(self) -> nn.ModuleList:
        return getattr(self, self.stages.blocks)

    def embed_at(self, idx: torch.Tensor, start: Position) -> torch.Tensor:
        """Token ids (B, T) at positions start .. start + T - 1 -> hidden states (B, T, h)."""
        raise NotImplementedError

    def position_buffers(self) -> list[tuple[torch.Tensor, int]]:
        """The buffers the model indexes by position, each once, with its sequence dimension
        (``Family.position_buffers``: what context parallelism shards with the tokens)."""
        raise NotImplementedError

    # The forward in three parts, as a pipeline runs them one stage at a time (``Family.stage_forward``).

    def embed(self, idx: torch.Tensor) -> torch.Tensor:
        """Token ids (B, T) -> hidden states (B, T, h)."""
        T = idx.shape[1]
        if T > self.cfg.seq_len:
            raise ValueError(f"sequence of {T} tokens is longer than the model's context {self.cfg.seq_len}")
        return self.embed_at(idx, 0)

    def forward_blocks(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, h) through the blocks this model holds (each checkpointed where ``activation_checkpointing``)."""
        return run_blocks(self.blocks, x, checkpointing=self.activation_checkpointing, training=self.training)

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """Hidden states (B, T, h) -> logits (B, T, V_padded): the head's modules in turn (final norm, output
        projection)."""
        for name in self.stages.head:
            x = getattr(self, name)(x)
        return x

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The training loss: the cross-entropy over targets that are not ``IGNORE_INDEX``, in fp32."""
        return lm_loss(logits, targets)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        logits = self.head(self.forward_blocks(self.embed(idx)))  # (B, T, V_padded)
        return logits, (None if targets is None else self.loss(logits, targets))

    def forward_cached(self, idx: torch.Tensor, cache: KVCache, start: Position) -> torch.Tensor:
        """Logits (B, 1, V_padded) of the last of the tokens ``idx`` (B, T) at positions start .. start + T - 1,
        their keys and values written to ``cache`` (``accel_kit.models.kv_cache``): a prefill (start 0) or a
        decode step (T = 1; a tensor ``start`` for a static-shape step, checked by its caller, since reading it
        here would stall the device). Only the last position's logits: the next token is all generation reads."""
        T = idx.shape[1]
        if not isinstance(start, torch.Tensor) and start + T > self.cfg.seq_len:
            raise ValueError(f"position {start + T - 1} is beyond the model's context {self.cfg.seq_len}")
        x = self.embed_at(idx, start)  # (B, T, h)
        for block, layer_cache in zip(self.blocks, cache.layers):
            x = block.forward_cached(x, layer_cache, start)
        return self.head(x[:, -1:])

    def num_params(self) -> int:
        """Unique parameters (a tied output projection counted once)."""
        return unique_param_count(self)


class RotaryLMConfig(RopeConfig, Protocol):
    """What ``RotaryCausalLM``'s own layers read of its family's config (Llama's, the MoE family's)."""

    padded_vocab_size: int
    hidden_size: int
    n_layers: int
    rms_norm_eps: float
    tie_embeddings: bool


class RotaryCausalLM(CausalLM):
    """The RoPE families' LM: ``embed_tokens``, ``layers`` (``block(index, tables)`` each), ``norm``, ``lm_head``.

    The RoPE tables are computed once and shared by every layer's buffers; moving the model
    (``.to``) gives each layer its own copy, 4 * seq_len * head_dim bytes (fp32) per layer: about
    0.5 % of one layer's 16-bit activations at batch 1 and the same sequence length for Llama
    3.2 1B (512 of ~92 000 bytes per token), less for the wider models. Each block holds its tables,
    so the blocks need nothing from the embedding's pipeline stage.
    """

    stages: ClassVar[PipelineStages] = PipelineStages(embedding=("embed_tokens",), blocks="layers",
                                                      head=("norm", "lm_head"))

    def __init__(self, cfg: RotaryLMConfig, block: Callable[[int, tuple[torch.Tensor, torch.Tensor]], nn.Module], *,
                 activation_checkpointing: bool = False):
        super().__init__(cfg, activation_checkpointing=activation_checkpointing)
        self.embed_tokens = nn.Embedding(cfg.padded_vocab_size, cfg.hidden_size)
        tables = rope_tables(cfg)
        self.layers = nn.ModuleList(block(i, tables) for i in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.padded_vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        # random values: the family's (its ``init_rule``, drawn by ``accel_kit.models.init``)

    def reset_buffers(self) -> None:
        """Recompute the RoPE tables on the layers' device once, shared by every layer as when built (after
        building on meta and ``to_empty``)."""
        tables = rope_tables(self.cfg, device=self.embed_tokens.weight.device)
        for block in self.layers:
            block.self_attn.rope_cos, block.self_attn.rope_sin = tables

    def embed_at(self, idx: torch.Tensor, start: Position) -> torch.Tensor:
        return self.embed_tokens(idx)  # positions enter in each block's attention (RoPE)

    def position_buffers(self) -> list[tuple[torch.Tensor, int]]:
        # every layer's RoPE cos and sin tables, (seq_len, head_dim/2) each: one tensor shared by all layers
        # until the model moves to another device, then one per layer
        tables = [t for block in self.layers for t in (block.self_attn.rope_cos, block.self_attn.rope_sin)]
        return [(t, 0) for t in unique_tensors(tables)]
