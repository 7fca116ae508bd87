"""A decoder-only mixture-of-experts LM: Llama's attention (with an optional QK-norm) and, per layer, either a
routed MoE MLP or a dense SwiGLU MLP.

Per layer: x + attn(RMSNorm(x)), then + mlp(RMSNorm(x)). A MoE MLP (Shazeer et al. 2017; Fedus et al. 2022):
the router's softmax over the experts, each token's top-k experts (their probabilities renormalised where
``norm_topk_prob``), dropless (every expert takes every token routed to it), the weighted sum of those
experts' SwiGLU outputs, plus the shared experts' where the config has them. The load-balancing loss is
Switch Transformer's, computed as transformers' ``load_balancing_loss_func`` does over all MoE layers
together, and added to the language-model loss times ``router_aux_loss_coef``.

The attention, the dense SwiGLU, the layer and the LM are the shared pieces (``accel_kit.models.common``:
``RotaryAttention`` with ``qk_norm``, ``SwiGLU``, ``DecoderBlock``, ``RotaryCausalLM``); the MoE MLP and the
load-balancing loss are this family's. Names follow transformers' Qwen3-MoE / Mixtral / OLMoE (``moe.hf``
maps the rest): the fused ``qkv_proj`` and ``gate_up_proj`` as in ``accel_kit.models.llama``, the router as
``mlp.router`` (theirs ``mlp.gate``), the experts' 3-D weights under the same names as theirs.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from accel_kit.models.common.block import DecoderBlock, SwiGLU
from accel_kit.models.common.lm import RotaryCausalLM
from accel_kit.models.moe.config import MoEConfig
from accel_kit.models.moe.dispatch import LocalDispatch
from accel_kit.models.moe.experts import Experts

INIT_STD = 0.02  # transformers' initializer_range: every linear and the embedding ~ N(0, 0.02^2)


class MoEMLP(nn.Module):
    """Router, routed experts (through ``dispatcher``) and optional shared experts, (B, T, h) -> (B, T, h).

    After each forward ``router_stats`` holds what the load-balancing loss needs from this layer: the sum
    over tokens of the router's probabilities (E,) (differentiable), the tokens routed to each expert
    (E,) float (every one of the k choices counted) and the token count.
    """

    def __init__(self, cfg: MoEConfig):
        super().__init__()
        self.n_experts, self.top_k, self.norm_topk_prob = cfg.n_experts, cfg.experts_per_token, cfg.norm_topk_prob
        self.router = nn.Linear(cfg.hidden_size, cfg.n_experts, bias=False)
        self.experts = Experts(cfg.n_experts, cfg.hidden_size, cfg.expert_ffn_hidden_size, cfg.expert_kernel)
        self.shared_experts = SwiGLU(cfg.hidden_size, cfg.shared_width) if cfg.n_shared_experts else None
        self.dispatcher = LocalDispatch()
        self.router_stats: tuple[torch.Tensor, torch.Tensor, int] | None = None

    def route(self, x2d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(N, h) -> the router's probabilities (N, E) fp32, the top-k experts (N, k) and their weights (N, k)
        in x's dtype, as transformers' top-k routers compute them (softmax in fp32, then top-k)."""
        probs = F.softmax(self.router(x2d), dim=-1, dtype=torch.float32)
        weights, index = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return probs, index, weights.to(x2d.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2d = x.reshape(-1, x.shape[-1])  # (N, h), N = B T
        probs, index, weights = self.route(x2d)
        counts = torch.bincount(index.reshape(-1), minlength=self.n_experts).float()
        self.router_stats = (probs.sum(dim=0), counts, x2d.shape[0])
        y = self.dispatcher(x2d, index, weights, self.experts)
        if self.shared_experts is not None:
            y = y + self.shared_experts(x2d)
        return y.view_as(x)


class MoEBlock(DecoderBlock):
    """One decoder layer, (B, T, h) -> (B, T, h): a MoE layer, or a dense one where ``index`` is in
    ``cfg.dense_layers``. ``tables``: RoPE cos/sin to share (the model builds them once)."""

    def __init__(self, cfg: MoEConfig, index: int = -1, tables: tuple[torch.Tensor, torch.Tensor] | None = None):
        mlp = MoEMLP(cfg) if cfg.is_moe_layer(index) else SwiGLU(cfg.hidden_size, cfg.ffn_hidden_size)
        super().__init__(cfg, mlp, tables, qk_norm=cfg.qk_norm)


def load_balancing_loss(stats: list[tuple[torch.Tensor, torch.Tensor, int]], n_experts: int) -> torch.Tensor:
    """Switch Transformer's auxiliary loss (Fedus et al. 2022, eq. 4-6) over the MoE layers' ``router_stats``,
    as transformers' ``load_balancing_loss_func`` computes it: the fraction of routed copies per expert f_e
    and the mean router probability P_e, each averaged over every layer's tokens together, then
    E x sum_e f_e P_e (k for a uniform router). Only P carries a gradient; every token counts."""
    prob_sum = sum(s[0] for s in stats)
    tokens_sum = sum(s[1] for s in stats)
    rows = sum(s[2] for s in stats)
    return n_experts * torch.sum((tokens_sum / rows) * (prob_sum / rows))


class MoEModel(RotaryCausalLM):
    """The LM. ``forward(idx (B, T), targets (B, T) | None) -> (logits, loss)``; the loss is the cross-entropy
    plus ``router_aux_loss_coef`` x the load-balancing loss (where the coefficient is not 0)."""

    def __init__(self, cfg: MoEConfig, *, activation_checkpointing: bool = False):
        super().__init__(cfg, lambda index, tables: MoEBlock(cfg, index, tables),
                         activation_checkpointing=activation_checkpointing)

    def moe_layers(self) -> list[MoEMLP]:
        return [block.mlp for block in self.layers if isinstance(block.mlp, MoEMLP)]

    def aux_loss(self) -> torch.Tensor:
        """The load-balancing loss of the last forward (unweighted)."""
        return load_balancing_loss([m.router_stats for m in self.moe_layers()], self.cfg.n_experts)

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        loss = super().loss(logits, targets)
        if self.cfg.router_aux_loss_coef:
            loss = loss + self.cfg.router_aux_loss_coef * self.aux_loss()
        return loss

    def load_imbalance(self) -> list[float]:
        """Per MoE layer, the busiest expert's tokens over the mean, in the last forward (1.0: even; E: all on one
        expert), from each layer's dispatcher (``last_tokens_per_expert``)."""
        counts = [m.dispatcher.last_tokens_per_expert for m in self.moe_layers()]
        return [(c.max() / c.float().mean()).item() for c in counts if c is not None]

    def expert_kernel_ran(self) -> str | None:
        """The experts' kernel of the last forward (None before one)."""
        return next((m.experts.kernel_ran for m in self.moe_layers()), None)
