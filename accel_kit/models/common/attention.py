"""Causal self-attention: the training forward and the KV-cache forward every family's attention shares, and
the rotary grouped-query attention of the RoPE families (Llama, the MoE family).

``SelfAttention`` is the skeleton: a family's attention says how its queries, keys and values come out of
the input at positions start .. start + T - 1 (``project``) and how the heads' outputs go back to the width
(``output``); the forward runs causal SDPA over them, the cached forward writes the keys and values to its
layer's cache first and attends over the cache's valid prefix (``accel_kit.models.kv_cache``). GPT-2's
attention (a fused ``c_attn`` with biases, positions learned outside attention) is one such projection;
``RotaryAttention`` is the other.

``RotaryAttention``: causal grouped-query attention (n_kv_heads key/value heads, each shared by
n_heads / n_kv_heads query heads) with RoPE on queries and keys, no biases, optionally an RMSNorm on queries
and keys before RoPE (``qk_norm``: per head over head_dim, "head", Qwen3; over the whole projections,
"full", OLMoE). ``qkv_proj`` holds transformers' q_proj, k_proj, v_proj rows stacked in that order, one GEMM
instead of three (``accel_kit.models.common.hf`` splits it). What the choices measured on a CPU (Llama 3.2
1B's layer, batch 1, 256 tokens, forward and backward, AMD EPYC with AVX-512, one thread): SDPA with
``enable_gqa`` 25.2 ms against 27.8 ms with k and v repeated per query head (fp32; bf16 28.2 against 29.4),
and it keeps no repeated copies for backward.
"""
from __future__ import annotations

from typing import Protocol

import torch
from torch import nn

from accel_kit.models.common.norm import RMSNorm
from accel_kit.models.common.rope import RopeConfig, apply_rope, rope_tables
from accel_kit.models.kv_cache import LayerKV, Position, cached_attention, position_rows
from accel_kit.models.sdpa import causal_attention

QK_NORMS = (None, "head", "full")  # none (Llama, Mixtral); per head over head_dim (Qwen3); whole projections (OLMoE)


class RotaryConfig(RopeConfig, Protocol):
    """What ``RotaryAttention`` and ``DecoderBlock`` read from a RoPE family's config (Llama's, the MoE family's)."""

    hidden_size: int
    n_heads: int
    n_kv_heads: int
    rms_norm_eps: float


def merge_heads(y: torch.Tensor) -> torch.Tensor:
    """Attention's output (B, heads, T, hd) -> (B, T, heads hd), the output projection's input."""
    return y.transpose(1, 2).flatten(2)


class SelfAttention(nn.Module):
    """Causal self-attention, (B, T, h) -> (B, T, h), with a cached forward for generation.

    Subclasses hold the projections and their head counts (this rank's: tensor parallelism divides them)."""

    def project(self, x: torch.Tensor, start: Position) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q (B, n_heads, T, hd), k and v (B, n_kv_heads, T, hd) of the tokens ``x`` (B, T, h) at positions
        start .. start + T - 1."""
        raise NotImplementedError

    def output(self, y: torch.Tensor) -> torch.Tensor:
        """The heads' outputs (B, n_heads, T, hd) -> (B, T, h)."""
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.project(x, 0)
        return self.output(causal_attention(q, k, v))  # (B, nh, T, hd) -> (B, T, h)

    def forward_cached(self, x: torch.Tensor, cache: LayerKV, start: Position) -> torch.Tensor:
        """``forward`` for tokens at positions start .. start + T - 1, their keys and values written to
        ``cache`` (at the narrow n_kv_heads width) and attention over its valid prefix (inference; the
        training forward keeps no cache)."""
        q, k, v = self.project(x, start)
        k, v = cache.write(start, k, v)  # (B, nkv, start + T, hd): the valid prefix (a tensor start: all of it)
        return self.output(cached_attention(q, k, v, start))


class RotaryAttention(SelfAttention):
    """Causal GQA self-attention with RoPE and an optional QK-norm (``qk_norm``: None, "head" or "full").

    The cos/sin tables are non-persistent buffers, not weights: ``tables`` to share (a model builds them
    once for all its layers), by default built here for ``cfg.seq_len`` positions."""

    def __init__(self, cfg: RotaryConfig, tables: tuple[torch.Tensor, torch.Tensor] | None = None, *,
                 qk_norm: str | None = None):
        super().__init__()
        if qk_norm not in QK_NORMS:
            raise ValueError(f"qk_norm {qk_norm!r} is not one of {', '.join(map(repr, QK_NORMS))}")
        self.cfg, self.qk_norm = cfg, qk_norm
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        q_width, kv_width = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
        self.qkv_proj = nn.Linear(cfg.hidden_size, q_width + 2 * kv_width, bias=False)
        self.o_proj = nn.Linear(q_width, cfg.hidden_size, bias=False)
        if qk_norm is not None:
            full = qk_norm == "full"
            self.q_norm = RMSNorm(q_width if full else cfg.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(kv_width if full else cfg.head_dim, cfg.rms_norm_eps)
        cos, sin = tables if tables is not None else rope_tables(cfg)
        self.register_buffer("rope_cos", cos, persistent=False)  # (seq_len, head_dim/2) fp32
        self.register_buffer("rope_sin", sin, persistent=False)

    def reset_buffers(self) -> None:
        """Recompute the tables where they are (after ``to_empty``: a non-persistent buffer loads from nowhere)."""
        self.rope_cos, self.rope_sin = rope_tables(self.cfg, device=self.rope_cos.device)

    def project(self, x: torch.Tensor, start: Position) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        T = x.shape[1]
        if not isinstance(start, torch.Tensor) and start + T > self.rope_cos.shape[0]:
            raise ValueError(f"positions up to {start + T} are beyond the RoPE tables' {self.rope_cos.shape[0]}")
        nh, nkv, hd = self.n_heads, self.n_kv_heads, self.head_dim
        # split, not slicing: split's backward concatenates the parts' gradients, where each slice's
        # would fill a zero tensor of the whole width and add into it.
        qk, v = self.qkv_proj(x).split([(nh + nkv) * hd, nkv * hd], dim=-1)  # (B, T, (nh + nkv) hd), (B, T, nkv hd)
        cos = position_rows(self.rope_cos, start, T).to(x.dtype)  # (T, hd/2)
        sin = position_rows(self.rope_sin, start, T).to(x.dtype)
        q, k = self._rotated(qk, cos, sin)  # (B, T, heads, hd)
        # (B, heads, T, hd) strided views: SDPA takes them as they are. v is copied out of the qkv
        # output (nkv hd wide, a small copy) so that what SDPA keeps for backward does not hold
        # all of it, the pre-RoPE q and k included (2 sb (nh + nkv) hd bytes at 16 bits).
        return q.transpose(1, 2), k.transpose(1, 2), v.contiguous().unflatten(-1, (nkv, hd)).transpose(1, 2)

    def _rotated(self, qk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Queries (B, T, nh, hd) and keys (B, T, nkv, hd) from the projection's (B, T, (nh + nkv) hd), normed
        where ``qk_norm`` says, then rotated."""
        nh, nkv, hd = self.n_heads, self.n_kv_heads, self.head_dim
        if self.qk_norm is None:  # RoPE on queries and keys together: one set of elementwise kernels for both
            return apply_rope(qk.unflatten(-1, (nh + nkv, hd)), cos, sin).split([nh, nkv], dim=2)
        q, k = qk.split([nh * hd, nkv * hd], dim=-1)
        if self.qk_norm == "full":
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.unflatten(-1, (nh, hd)), k.unflatten(-1, (nkv, hd))
        if self.qk_norm == "head":
            q, k = self.q_norm(q), self.k_norm(k)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin)

    def output(self, y: torch.Tensor) -> torch.Tensor:
        return self.o_proj(merge_heads(y))
