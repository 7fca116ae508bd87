"""One GPT-2 transformer block: the unit of the microbenchmark and of every GPT model here.

GPT-2 layout (Radford et al. 2019): pre-LayerNorm, causal multi-head self-attention with a
fused QKV projection, residual, pre-LayerNorm, MLP (4x, tanh-approximated GELU), residual.
Attention goes through ``torch.nn.functional.scaled_dot_product_attention`` so each device
picks its fastest causal kernel (flash / memory-efficient on GPUs, flash on CPU).

Parameter names follow transformers' ``GPT2Block`` (``ln_1``, ``attn.c_attn`` ...) so weights
convert by name; only the linear weights are stored as ``nn.Linear`` (out, in) rather than
GPT-2's ``Conv1D`` (in, out).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class BlockConfig:
    """Shape of one transformer block.

    Args:
        hidden_size: model width h (GPT-2 XL: 1600).
        n_heads: attention heads (GPT-2 XL: 25); head dim = hidden_size / n_heads.
        mlp_ratio: MLP width as a multiple of h (GPT-2: 4).
        layer_norm_eps: LayerNorm epsilon (GPT-2: 1e-5).
        bias: linear layers carry biases (GPT-2: yes).
    """

    hidden_size: int = 1600
    n_heads: int = 25
    mlp_ratio: int = 4
    layer_norm_eps: float = 1e-5
    bias: bool = True

    def __post_init__(self) -> None:
        if self.hidden_size % self.n_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not a multiple of n_heads {self.n_heads}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.n_heads


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: BlockConfig):
        super().__init__()
        self.n_heads = cfg.n_heads
        self.c_attn = nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size, bias=cfg.bias)  # fused Q, K, V
        self.c_proj = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=cfg.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        # (B, T, 3C) -> (3, B, nh, T, hs) without copies: SDPA takes strided views.
        q, k, v = self.c_attn(x).view(B, T, 3, self.n_heads, C // self.n_heads).permute(2, 0, 3, 1, 4).unbind(0)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, nh, T, hs)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, cfg: BlockConfig):
        super().__init__()
        self.c_fc = nn.Linear(cfg.hidden_size, cfg.mlp_ratio * cfg.hidden_size, bias=cfg.bias)
        self.c_proj = nn.Linear(cfg.mlp_ratio * cfg.hidden_size, cfg.hidden_size, bias=cfg.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # GPT-2's "gelu_new" is the tanh approximation; PyTorch has it as one fused kernel.
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    """GPT-2 block: x + attn(ln_1(x)), then + mlp(ln_2(x)). Input and output (B, T, h)."""

    def __init__(self, cfg: BlockConfig):
        super().__init__()
        self.cfg = cfg
        self.ln_1 = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))
