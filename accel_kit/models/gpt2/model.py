"""A GPT-2-architecture language model built from ``accel_kit.models.gpt2.block.Block``.

Learned absolute positions, pre-LayerNorm blocks, a final LayerNorm and an output
projection tied to the token embedding (Radford et al. 2019). Options that trade memory
for compute: activation checkpointing per block (``activation_checkpointing``).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

import torch
from torch import nn

from accel_kit.models.common.lm import CausalLM
from accel_kit.models.family import PaddedVocab, PipelineStages
from accel_kit.models.gpt2.block import Block, BlockConfig
from accel_kit.models.kv_cache import Position, position_rows


@dataclass(frozen=True)
class GPTConfig(PaddedVocab):
    """Shape of a GPT model. ``vocab_size`` is the tokenizer's; the embedding may be padded."""

    n_layers: int
    n_heads: int
    hidden_size: int
    vocab_size: int = 50257
    seq_len: int = 1024  # context length (size of the position table)
    mlp_ratio: int = 4
    pad_vocab_multiple: int = 1  # e.g. 64: 50257 -> 50304 rows, faster matmuls; recorded in results
    dropout: float = 0.0
    narrow_linear_fast_path: bool = False  # a kernel choice (gpt2.block), GPT2.kernel_overrides sets it from the adapter

    def __post_init__(self) -> None:
        if self.hidden_size % self.n_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not a multiple of n_heads {self.n_heads}")

    @property
    def block(self) -> BlockConfig:
        return BlockConfig(self.hidden_size, self.n_heads, self.mlp_ratio,
                           narrow_linear_fast_path=self.narrow_linear_fast_path)

    def replace(self, **changes) -> "GPTConfig":
        return replace(self, **changes)


class GPT(CausalLM):
    """Decoder-only transformer LM. ``forward(idx (B, T), targets (B, T) | None) -> (logits, loss)``: the
    shared ``CausalLM`` skeleton over learned positions added to the token embedding."""

    stages: ClassVar[PipelineStages] = PipelineStages(embedding=("wte", "wpe"), blocks="h", head=("ln_f", "lm_head"))

    def __init__(self, cfg: GPTConfig, *, activation_checkpointing: bool = False):
        super().__init__(cfg, activation_checkpointing=activation_checkpointing)
        self.wte = nn.Embedding(cfg.padded_vocab_size, cfg.hidden_size)
        self.wpe = nn.Embedding(cfg.seq_len, cfg.hidden_size)
        # The positions the learned table is read at: 0 .. seq_len - 1, a buffer rather than an arange per
        # forward so that context parallelism can shard it with the tokens (Family.position_buffers).
        self.register_buffer("position_ids", torch.arange(cfg.seq_len), persistent=False)
        self.drop = nn.Dropout(cfg.dropout)
        self.h = nn.ModuleList(Block(cfg.block) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.padded_vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied (GPT-2)
        # random values: the family's (``GPT2.init_rule``, drawn by ``accel_kit.models.init``)

    def reset_buffers(self) -> None:
        """The position ids again, on the model's device (after building on meta and ``to_empty``)."""
        self.position_ids = torch.arange(self.cfg.seq_len, device=self.position_ids.device)

    def embed_at(self, idx: torch.Tensor, start: Position) -> torch.Tensor:
        """Token plus learned position embeddings (B, T, h); on a pipeline the first stage's (``wte``, ``wpe``)."""
        positions = position_rows(self.position_ids, start, idx.shape[1])  # (T,)
        return self.drop(self.wte(idx) + self.wpe(positions))

    def position_buffers(self) -> list[tuple[torch.Tensor, int]]:
        return [(self.position_ids, 0)]  # (seq_len,): the learned position table's row of each token
