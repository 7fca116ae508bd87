"""Rotary position embedding (Su et al. 2021) as Llama 3 uses it, with Llama 3.1's frequency scaling: the
tables every RoPE family's attention (``accel_kit.models.common.attention.RotaryAttention``) reads.

Layout: transformers' ("rotate half"): dimension i of a head is paired with dimension
i + head_dim/2, not with its neighbour as in Meta's reference code. Meta's checkpoints are
permuted into this layout when converted to transformers, so with it our weights convert to
and from ``LlamaForCausalLM`` with no permutation.

Everything is computed in fp32, in the same operations as transformers'
``_compute_llama3_parameters`` and ``LlamaRotaryEmbedding`` (read in the installed source), so
the tables match theirs where the same cos/sin kernels run.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass(frozen=True)
class RopeScaling:
    """Llama 3.1's RoPE frequency scaling (transformers' ``rope_type="llama3"``).

    Wavelengths shorter than ``original_max_position / high_freq_factor`` keep their frequency,
    those longer than ``original_max_position / low_freq_factor`` are slowed by ``factor``, and
    the band between is interpolated smoothly (``inverse_frequencies``).
    """

    factor: float  # Llama 3.1: 8; Llama 3.2: 32
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192  # the context Llama 3 was pre-trained at

    def __post_init__(self) -> None:
        if self.factor < 1:
            raise ValueError(f"rope_scaling factor {self.factor} is below 1 (it divides the low frequencies)")
        if not self.high_freq_factor > self.low_freq_factor > 0:
            raise ValueError(f"rope_scaling needs high_freq_factor > low_freq_factor > 0, got "
                             f"{self.high_freq_factor} and {self.low_freq_factor}")
        if self.original_max_position < 1:
            raise ValueError(f"rope_scaling original_max_position {self.original_max_position} is not positive")


class RopeConfig(Protocol):
    """What the tables are computed from: the fields a RoPE family's config has (Llama's, the MoE family's)."""

    head_dim: int
    seq_len: int
    rope_theta: float
    rope_scaling: RopeScaling | None


def inverse_frequencies(head_dim: int, theta: float, scaling: RopeScaling | None = None,
                        device: torch.device | str | None = None) -> torch.Tensor:
    """The head_dim/2 rotation frequencies (radians per position), fp32.

    Plain RoPE: theta^(-2i/head_dim). With Llama 3.1's scaling: frequencies whose wavelength
    (2 pi / frequency) exceeds original_max_position / low_freq_factor are divided by
    ``factor`` (they never completed a turn in pre-training, so they are stretched to the
    longer context); those under original_max_position / high_freq_factor stay (they encode
    local order); in between the two are blended linearly in original_max_position / wavelength.
    """
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim
    inv_freq = 1.0 / (theta ** exponents)
    if scaling is None:
        return inv_freq
    wavelength = 2 * math.pi / inv_freq
    long_wavelength = scaling.original_max_position / scaling.low_freq_factor
    short_wavelength = scaling.original_max_position / scaling.high_freq_factor
    stretched = torch.where(wavelength > long_wavelength, inv_freq / scaling.factor, inv_freq)
    # 0 at the long-wavelength edge of the band, 1 at its short edge
    blend = (scaling.original_max_position / wavelength - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor)
    blended = (1 - blend) * stretched / scaling.factor + blend * stretched
    in_band = ~(wavelength < short_wavelength) * ~(wavelength > long_wavelength)
    return torch.where(in_band, blended, stretched)


def rope_tables(cfg: RopeConfig, device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of position x frequency for positions 0 .. cfg.seq_len - 1: two (seq_len, head_dim/2) fp32 tables.

    Half the width of transformers' (seq, head_dim) tables, whose two halves are equal copies.
    On the meta device this allocates nothing (the tables are meta tensors too).
    """
    inv_freq = inverse_frequencies(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling, device)
    positions = torch.arange(cfg.seq_len, device=inv_freq.device).float()
    angles = positions[:, None] * inv_freq[None, :]  # (seq_len, head_dim/2), one fp32 product each
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each pair (x_i, x_{i + d/2}) of the last dimension by its angle.

    ``x`` (B, T, heads, d); ``cos``/``sin`` (T, d/2), in x's dtype. The same products and sums
    as transformers' ``x * cos + rotate_half(x) * sin`` (a - b*s is a + (-b)*s exactly), on half
    the table width and without materialising rotate_half.
    """
    x1, x2 = x.chunk(2, dim=-1)  # (B, T, heads, d/2) views
    cos, sin = cos[:, None, :], sin[:, None, :]  # broadcast over heads
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
