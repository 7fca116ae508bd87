"""Causal attention through torch's SDPA, the one call every family's attention makes.

Grouped-query attention (fewer key/value heads than query heads) goes through SDPA's
``enable_gqa`` (torch >= 2.5), which broadcasts each key/value head over its query group
inside the kernel; torch 2.4 (the Cerebras environment's, and the oldest ``pyproject.toml``
allows) lacks it, so there k and v are repeated per query head first. The engine's kernel
probe (``accel_kit.engine.attention``) calls this same function, so it sees the kernel the
models run.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

HAS_ENABLE_GQA = torch.__version__ >= (2, 5)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, attn_mask: torch.Tensor | None = None,
              is_causal: bool = False) -> torch.Tensor:
    """``softmax(q k^T / sqrt(d) + mask) v`` for q (B, nh, Tq, d) and k, v (B, nkv, Tk, d), nkv | nh: SDPA with
    ``attn_mask`` (True: attend) or ``is_causal``, each key/value head serving its group of query heads."""
    groups = q.shape[1] // k.shape[1]
    if groups == 1:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal)
    if HAS_ENABLE_GQA:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal, enable_gqa=True)
    return F.scaled_dot_product_attention(q, k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1),
                                          attn_mask=attn_mask, is_causal=is_causal)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``softmax(q k^T / sqrt(d) + causal mask) v`` for q (B, nh, T, d) and k, v (B, nkv, T, d), nkv | nh."""
    return attention(q, k, v, is_causal=True)
