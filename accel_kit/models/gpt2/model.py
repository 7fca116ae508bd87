"""A GPT-2-architecture language model built from ``accel_kit.models.gpt2.block.Block``.

Learned absolute positions, pre-LayerNorm blocks, a final LayerNorm and an output
projection tied to the token embedding (Radford et al. 2019). Options that trade memory
for compute: activation checkpointing per block (``activation_checkpointing``).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import nn

from accel_kit.models.family import PaddedVocab, lm_loss, run_blocks, unique_param_count
from accel_kit.models.gpt2.block import Block, BlockConfig
from accel_kit.models.kv_cache import KVCache, Position, position_rows


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


class GPT(nn.Module):
    """Decoder-only transformer LM. ``forward(idx (B, T), targets (B, T) | None) -> (logits, loss)``."""

    def __init__(self, cfg: GPTConfig, *, activation_checkpointing: bool = False):
        super().__init__()
        self.cfg = cfg
        self.activation_checkpointing = activation_checkpointing
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

    # The forward in three parts, as a pipeline runs them one stage at a time (``Family.stage_forward``):
    # the embedding (tokens and positions), the blocks, the head.

    def embed(self, idx: torch.Tensor) -> torch.Tensor:
        """Token ids (B, T) -> hidden states (B, T, h): token plus learned position embeddings."""
        B, T = idx.shape
        if T > self.cfg.seq_len:
            raise ValueError(f"sequence of {T} tokens is longer than the model's context {self.cfg.seq_len}")
        return self.drop(self.wte(idx) + self.wpe(self.position_ids[:T]))  # (B, T, h)

    def forward_blocks(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, h) through the blocks this model holds."""
        return run_blocks(self.h, x, checkpointing=self.activation_checkpointing, training=self.training)

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """Hidden states (B, T, h) -> logits (B, T, V_padded): the final LayerNorm and the output projection."""
        return self.lm_head(self.ln_f(x))

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        logits = self.head(self.forward_blocks(self.embed(idx)))  # (B, T, V_padded)
        return logits, (None if targets is None else lm_loss(logits, targets))

    def forward_cached(self, idx: torch.Tensor, cache: KVCache, start: Position) -> torch.Tensor:
        """Logits (B, 1, V_padded) of the last of the tokens ``idx`` (B, T) at positions start .. start + T - 1,
        their keys and values written to ``cache`` (``accel_kit.models.kv_cache``): a prefill (start 0) or a
        decode step (T = 1). Only the last position's logits: the next token is all generation reads."""
        T = idx.shape[1]
        if not isinstance(start, torch.Tensor) and start + T > self.cfg.seq_len:  # a tensor: its caller checks
            raise ValueError(f"position {start + T - 1} is beyond the model's context {self.cfg.seq_len}")
        x = self.drop(self.wte(idx) + self.wpe(position_rows(self.position_ids, start, T)))  # (B, T, h)
        for block, layer_cache in zip(self.h, cache.layers):
            x = block.forward_cached(x, layer_cache, start)
        return self.head(x[:, -1:])

    def num_params(self) -> int:
        """Unique parameters (the tied output projection counted once)."""
        return unique_param_count(self)
