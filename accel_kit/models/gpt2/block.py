"""One GPT-2 transformer block: the unit of the microbenchmark and of every GPT model here.

GPT-2 layout (Radford et al. 2019): pre-LayerNorm, causal multi-head self-attention with a
fused QKV projection, residual, pre-LayerNorm, MLP (4x, tanh-approximated GELU), residual.
Attention goes through ``torch.nn.functional.scaled_dot_product_attention`` (the shared
``accel_kit.models.common.attention.SelfAttention``'s forward) so each device picks its fastest
causal kernel (flash / memory-efficient on GPUs, flash on CPU). With ``narrow_linear_fast_path``
(set where the device adapter says it pays: CPU bf16, ``GPT2.kernel_overrides``) the output
projections use a custom backward with a faster GEMM layout; otherwise every layer is the plain
``nn.Linear``.

Parameter names follow transformers' ``GPT2Block`` (``ln_1``, ``attn.c_attn`` ...) so weights
convert by name; only the linear weights are stored as ``nn.Linear`` (out, in) rather than
GPT-2's ``Conv1D`` (in, out).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from accel_kit.models.common.attention import SelfAttention, merge_heads
from accel_kit.models.common.block import PreNormBlock
from accel_kit.models.kv_cache import Position


@dataclass(frozen=True)
class BlockConfig:
    """Shape of one transformer block.

    Args:
        hidden_size: model width h (GPT-2 XL: 1600).
        n_heads: attention heads (GPT-2 XL: 25); head dim = hidden_size / n_heads.
        mlp_ratio: MLP width as a multiple of h (GPT-2: 4).
        layer_norm_eps: LayerNorm epsilon (GPT-2: 1e-5).
        bias: linear layers carry biases (GPT-2: yes).
        narrow_linear_fast_path: bf16 output projections compute their weight gradient as an
            NN GEMM (``_NarrowOutputLinear``); the device adapter says where that is faster.
    """

    hidden_size: int = 1600
    n_heads: int = 25
    mlp_ratio: int = 4
    layer_norm_eps: float = 1e-5
    bias: bool = True
    narrow_linear_fast_path: bool = False

    def __post_init__(self) -> None:
        if self.hidden_size % self.n_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not a multiple of n_heads {self.n_heads}")


class _NarrowOutputLinear(torch.autograd.Function):
    """``F.linear`` for bf16 whose weight gradient runs as an NN GEMM (measured faster on CPUs).

    The weight gradient dW = g^T @ x, g (M, out) and x (M, in), is a "TN" GEMM: oneDNN's bf16
    kernels run it at about half the speed of NN (GPT-2 XL mlp.c_proj, M=4096, 6400->1600:
    ~74 ms vs ~36 ms on AMX). Materialising g^T costs a strided copy of g, which pays off only
    when g is the narrow operand (out <= in): copying a (4096, 1600) g is ~5-10 ms here.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])  # (M, in)
        y = x2 @ weight.t() if bias is None else torch.addmm(bias, x2, weight.t())  # (M, out)
        ctx.save_for_backward(x2, weight)
        ctx.has_bias = bias is not None
        return y.view(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        x2, weight = ctx.saved_tensors
        g2 = g.reshape(-1, weight.shape[0])  # (M, out)
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = (g2 @ weight).view(*g.shape[:-1], weight.shape[1])  # NN
        if ctx.needs_input_grad[1] or (ctx.has_bias and ctx.needs_input_grad[2]):
            g_t = g2.t().contiguous()  # (out, M)
            if ctx.needs_input_grad[1]:
                grad_w = g_t @ x2  # NN: (out, M) @ (M, in)
            if ctx.has_bias and ctx.needs_input_grad[2]:
                grad_b = g_t.sum(1)  # contiguous row sums
        return grad_x, grad_w, grad_b


def _linear(x: torch.Tensor, layer: nn.Linear, fast_path: bool) -> torch.Tensor:
    """``layer(x)``, with the bf16 fast path where it is enabled and pays (see ``_NarrowOutputLinear``)."""
    w = layer.weight
    if (
        fast_path
        and x.dtype == w.dtype == torch.bfloat16
        and w.shape[0] <= w.shape[1]
        and not torch.is_autocast_enabled(x.device.type)
    ):
        return _NarrowOutputLinear.apply(x, w, layer.bias)
    return layer(x)


class CausalSelfAttention(SelfAttention):
    """GPT-2's attention: a fused Q, K, V projection with biases, as many key/value heads as query heads, no
    positions (the model adds learned ones to the embedding); the forward and the cached forward are the
    shared ones (``accel_kit.models.common.attention.SelfAttention``)."""

    def __init__(self, cfg: BlockConfig):
        super().__init__()
        self.n_heads = cfg.n_heads  # this rank's heads (tensor parallelism divides them)
        self.head_dim = cfg.hidden_size // cfg.n_heads
        self.fast_path = cfg.narrow_linear_fast_path
        self.c_attn = nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size, bias=cfg.bias)  # fused Q, K, V
        self.c_proj = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=cfg.bias)

    def project(self, x: torch.Tensor, start: Position) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        B, T, _ = x.shape
        # (B, T, 3 nh hs) -> (3, B, nh, T, hs) without copies: SDPA takes strided views.
        return self.c_attn(x).view(B, T, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)

    def output(self, y: torch.Tensor) -> torch.Tensor:
        return _linear(merge_heads(y), self.c_proj, self.fast_path)


class MLP(nn.Module):
    def __init__(self, cfg: BlockConfig):
        super().__init__()
        self.c_fc = nn.Linear(cfg.hidden_size, cfg.mlp_ratio * cfg.hidden_size, bias=cfg.bias)
        self.c_proj = nn.Linear(cfg.mlp_ratio * cfg.hidden_size, cfg.hidden_size, bias=cfg.bias)
        self.fast_path = cfg.narrow_linear_fast_path

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # GPT-2's "gelu_new" is the tanh approximation; PyTorch has it as one fused kernel.
        return _linear(F.gelu(self.c_fc(x), approximate="tanh"), self.c_proj, self.fast_path)


class Block(PreNormBlock):
    """GPT-2 block: x + attn(ln_1(x)), then + mlp(ln_2(x)). Input and output (B, T, h)."""

    def __init__(self, cfg: BlockConfig):
        super().__init__()
        self.cfg = cfg
        self.ln_1 = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.mlp = MLP(cfg)

    def parts(self) -> tuple[nn.Module, SelfAttention, nn.Module, nn.Module]:
        return self.ln_1, self.attn, self.ln_2, self.mlp
