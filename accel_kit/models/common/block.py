"""Decoder layers: the pre-norm residual layout every family's block has, and the RMSNorm / RoPE attention /
SwiGLU layer of the RoPE families.

``PreNormBlock``: x + attn(norm(x)), then + mlp(norm(x)) (pre-LayerNorm, Radford et al. 2019; Llama's with
RMSNorm), its forward and its cached forward; a family's block holds the four parts under transformers'
names for them (GPT-2's ``ln_1``, ``attn``, ``ln_2``, ``mlp``) and says which is which (``parts``).
``DecoderBlock``: Llama's layer (``input_layernorm``, ``self_attn``, ``post_attention_layernorm``, ``mlp``),
with the MLP its family gives it (Llama's SwiGLU; the MoE family's routed experts or a dense SwiGLU).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from accel_kit.models.common.attention import RotaryAttention, RotaryConfig, SelfAttention
from accel_kit.models.common.norm import RMSNorm
from accel_kit.models.kv_cache import LayerKV, Position


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x)) (Shazeer 2020), gate and up as one fused GEMM (``gate_up_proj``: transformers'
    gate_proj then up_proj rows): Llama's MLP, a MoE family's dense layers' and its shared experts' (n experts of
    width F run as one of width n F: SwiGLU's width splits into independent parts)."""

    def __init__(self, hidden_size: int, ffn_hidden_size: int):
        super().__init__()
        self.gate_up_proj = nn.Linear(hidden_size, 2 * ffn_hidden_size, bias=False)
        self.down_proj = nn.Linear(ffn_hidden_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)  # (B, T, ffn) views each
        return self.down_proj(F.silu(gate) * up)


class PreNormBlock(nn.Module):
    """One decoder layer, (B, T, h) -> (B, T, h): x + attn(attn_norm(x)), then + mlp(mlp_norm(x))."""

    def parts(self) -> tuple[nn.Module, SelfAttention, nn.Module, nn.Module]:
        """The attention's norm, the attention, the MLP's norm and the MLP, under the family's names."""
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        attn_norm, attn, mlp_norm, mlp = self.parts()
        x = x + attn(attn_norm(x))
        return x + mlp(mlp_norm(x))

    def forward_cached(self, x: torch.Tensor, cache: LayerKV, start: Position) -> torch.Tensor:
        """``forward`` with a static KV cache (``SelfAttention.forward_cached``); the MLP runs as in training."""
        attn_norm, attn, mlp_norm, mlp = self.parts()
        x = x + attn.forward_cached(attn_norm(x), cache, start)
        return x + mlp(mlp_norm(x))


class DecoderBlock(PreNormBlock):
    """Llama's layer: RMSNorm, ``RotaryAttention`` (``qk_norm`` where the family has one), RMSNorm, ``mlp``.

    ``tables``: RoPE cos/sin to share (the model builds them once for all its layers); by default the
    attention builds its own for ``cfg.seq_len`` positions."""

    def __init__(self, cfg: RotaryConfig, mlp: nn.Module, tables: tuple[torch.Tensor, torch.Tensor] | None = None, *,
                 qk_norm: str | None = None):
        super().__init__()
        self.cfg = cfg
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = RotaryAttention(cfg, tables, qk_norm=qk_norm)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = mlp

    def parts(self) -> tuple[nn.Module, SelfAttention, nn.Module, nn.Module]:
        return self.input_layernorm, self.self_attn, self.post_attention_layernorm, self.mlp
