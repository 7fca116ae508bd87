"""A static key/value cache and the attention that reads it: what every family's cached forward shares.

gpt-fast's layout: one preallocated (B, n_kv_heads, max_len, head_dim) tensor for keys and one for
values per layer, allocated once before the prefill; a forward over tokens at positions
``start .. start + T - 1`` writes its keys and values there and attends over the valid prefix
``0 .. start + T - 1``. Under GQA the cache keeps the narrow n_kv_heads width; SDPA broadcasts each
key/value head over its query group (``accel_kit.models.sdpa``). Nothing is reallocated between
steps, so a decode step's memory traffic is the weights plus the cache's valid prefix.

Positions: ``start`` is a Python int (eager generation: slices of the valid prefix, shapes that grow
with each step), or a 0-dim integer tensor on the device for a one-token decode step whose shapes must
not change from step to step (a compiled step, a captured graph): then the step writes its position
with ``index_copy_`` and attends over the whole cache under a mask of the positions written so far.
One graph serves every step and no position is read back to the host.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Union

import torch

from accel_kit.models.sdpa import attention, causal_attention

Position = Union[int, torch.Tensor]  # a Python int, or a 0-dim integer tensor (a static-shape decode step)


def position_rows(table: torch.Tensor, start: Position, length: int) -> torch.Tensor:
    """Rows ``start .. start + length - 1`` of a per-position table (RoPE's cos and sin, position ids); a
    tensor ``start`` is one decode step's position (``length`` 1), gathered on the device."""
    if isinstance(start, torch.Tensor):
        if length != 1:
            raise ValueError(f"a tensor position is one decode step's: {length} tokens given")
        return table.index_select(0, start.reshape(1))
    return table[start:start + length]


@dataclass
class LayerKV:
    """One layer's cache: keys and values, (B, n_kv_heads, max_len, head_dim) each."""

    k: torch.Tensor
    v: torch.Tensor

    def write(self, start: Position, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k, v (B, n_kv_heads, T, head_dim) at positions start .. start + T - 1; return the valid
        prefix (B, n_kv_heads, start + T, head_dim) of keys and of values, as views. A tensor ``start``
        (one token) writes in place on the device and returns the whole cache (``cached_attention`` masks it)."""
        if isinstance(start, torch.Tensor):
            index = start.reshape(1)
            self.k.index_copy_(2, index, k)
            self.v.index_copy_(2, index, v)
            return self.k, self.v
        end = start + k.shape[2]
        if end > self.k.shape[2]:
            raise ValueError(f"positions up to {end} do not fit a cache of {self.k.shape[2]}")
        self.k[:, :, start:end] = k
        self.v[:, :, start:end] = v
        return self.k[:, :, :end], self.v[:, :, :end]


@dataclass
class KVCache:
    """Every layer's ``LayerKV``, allocated once for ``max_len`` positions (prompt plus new tokens)."""

    layers: list[LayerKV]

    @classmethod
    def allocate(cls, n_layers: int, batch: int, n_kv_heads: int, max_len: int, head_dim: int, *,
                 dtype: torch.dtype, device: torch.device | str) -> "KVCache":
        shape = (batch, n_kv_heads, max_len, head_dim)
        return cls([LayerKV(torch.zeros(shape, dtype=dtype, device=device),
                            torch.zeros(shape, dtype=dtype, device=device)) for _ in range(n_layers)])

    @property
    def max_len(self) -> int:
        return self.layers[0].k.shape[2]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for layer in self.layers for t in (layer.k, layer.v))


def cached_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: Position) -> torch.Tensor:
    """Attention of q (B, nh, T, d), at positions start .. start + T - 1, over k, v (B, nkv, start + T, d).

    From position 0 (a prefill) the keys are exactly the new tokens': the causal kernel. One query
    (a decode step) sees every valid key: no mask. A chunk of T > 1 after position 0 needs the
    causal mask shifted by ``start`` (query i sees keys 0 .. start + i). A tensor ``start`` (one query,
    k and v the whole cache): the keys at positions 0 .. start, by a mask.
    """
    T = q.shape[2]
    mask = None
    if isinstance(start, torch.Tensor):
        mask = (torch.arange(k.shape[2], device=q.device) <= start)[None, :]  # (1, max_len): the one query
    elif start == 0:
        return causal_attention(q, k, v)
    elif T > 1:
        positions = torch.arange(k.shape[2], device=q.device)
        mask = positions[None, :] <= (start + torch.arange(T, device=q.device))[:, None]  # (T, start + T)
    return attention(q, k, v, attn_mask=mask)
