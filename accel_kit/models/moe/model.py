"""A decoder-only mixture-of-experts LM: Llama's attention (with an optional QK-norm) and, per layer, either a
routed MoE MLP or a dense SwiGLU MLP.

Per layer: x + attn(RMSNorm(x)), then + mlp(RMSNorm(x)). A MoE MLP (Shazeer et al. 2017; Fedus et al. 2022):
the router's softmax over the experts, each token's top-k experts (their probabilities renormalised where
``norm_topk_prob``), dropless (every expert takes every token routed to it), the weighted sum of those
experts' SwiGLU outputs, plus the shared experts' where the config has them. The load-balancing loss is
Switch Transformer's, computed as transformers' ``load_balancing_loss_func`` does over all MoE layers
together, and added to the language-model loss times ``router_aux_loss_coef``.

Names follow transformers' Qwen3-MoE / Mixtral / OLMoE (``moe.hf`` maps the rest): the fused ``qkv_proj``
and ``gate_up_proj`` as in ``accel_kit.models.llama``, the router as ``mlp.router`` (theirs ``mlp.gate``),
the experts' 3-D weights under the same names as theirs.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from accel_kit.models.family import lm_loss, run_blocks, unique_param_count
from accel_kit.models.kv_cache import KVCache, LayerKV, Position, cached_attention, position_rows
from accel_kit.models.llama.model import RMSNorm
from accel_kit.models.llama.rope import apply_rope, rope_tables
from accel_kit.models.moe.config import MoEConfig
from accel_kit.models.moe.dispatch import LocalDispatch
from accel_kit.models.moe.experts import Experts
from accel_kit.models.sdpa import causal_attention

INIT_STD = 0.02  # transformers' initializer_range: every linear and the embedding ~ N(0, 0.02^2)


class MoEAttention(nn.Module):
    """Causal GQA self-attention with RoPE and, where the config says, RMSNorm on queries and keys first:
    per head over head_dim ("head", Qwen3) or over the whole q and k projections ("full", OLMoE)."""

    def __init__(self, cfg: MoEConfig, tables: tuple[torch.Tensor, torch.Tensor] | None = None):
        super().__init__()
        self.cfg = cfg
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        q_width, kv_width = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
        self.qkv_proj = nn.Linear(cfg.hidden_size, q_width + 2 * kv_width, bias=False)
        self.o_proj = nn.Linear(q_width, cfg.hidden_size, bias=False)
        if cfg.qk_norm is not None:
            full = cfg.qk_norm == "full"
            self.q_norm = RMSNorm(q_width if full else cfg.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(kv_width if full else cfg.head_dim, cfg.rms_norm_eps)
        cos, sin = tables if tables is not None else rope_tables(cfg)
        self.register_buffer("rope_cos", cos, persistent=False)  # (seq_len, head_dim/2) fp32
        self.register_buffer("rope_sin", sin, persistent=False)

    def reset_buffers(self) -> None:
        """Recompute the tables where they are (after ``to_empty``)."""
        self.rope_cos, self.rope_sin = rope_tables(self.cfg, device=self.rope_cos.device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        if T > self.rope_cos.shape[0]:
            raise ValueError(f"sequence of {T} tokens is longer than the RoPE tables' "
                             f"{self.rope_cos.shape[0]} positions")
        nh, nkv, hd = self.n_heads, self.n_kv_heads, self.head_dim
        q, k, v = self.qkv_proj(x).split([nh * hd, nkv * hd, nkv * hd], dim=-1)  # (B, T, width) each
        if self.cfg.qk_norm == "full":
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.unflatten(-1, (nh, hd)), k.unflatten(-1, (nkv, hd))  # (B, T, heads, hd)
        if self.cfg.qk_norm == "head":
            q, k = self.q_norm(q), self.k_norm(k)
        cos, sin = self.rope_cos[:T].to(x.dtype), self.rope_sin[:T].to(x.dtype)
        q, k = apply_rope(q, cos, sin).transpose(1, 2), apply_rope(k, cos, sin).transpose(1, 2)  # (B, heads, T, hd)
        v = v.contiguous().unflatten(-1, (nkv, hd)).transpose(1, 2)
        y = causal_attention(q, k, v)  # (B, nh, T, hd)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, nh * hd))

    def forward_cached(self, x: torch.Tensor, cache: LayerKV, start: Position) -> torch.Tensor:
        """``forward`` for tokens at positions start .. start + T - 1 (QK-norm, then RoPE at those positions),
        their keys and values written to ``cache`` at the narrow n_kv_heads width, attention over its valid
        prefix (``accel_kit.models.kv_cache``)."""
        B, T, _ = x.shape
        nh, nkv, hd = self.n_heads, self.n_kv_heads, self.head_dim
        q, k, v = self.qkv_proj(x).split([nh * hd, nkv * hd, nkv * hd], dim=-1)
        if self.cfg.qk_norm == "full":
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.unflatten(-1, (nh, hd)), k.unflatten(-1, (nkv, hd))
        if self.cfg.qk_norm == "head":
            q, k = self.q_norm(q), self.k_norm(k)
        cos = position_rows(self.rope_cos, start, T).to(x.dtype)
        sin = position_rows(self.rope_sin, start, T).to(x.dtype)
        q, k = apply_rope(q, cos, sin).transpose(1, 2), apply_rope(k, cos, sin).transpose(1, 2)
        k, v = cache.write(start, k, v.unflatten(-1, (nkv, hd)).transpose(1, 2))  # the valid prefix
        y = cached_attention(q, k, v, start)  # (B, nh, T, hd)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, nh * hd))


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x)), gate and up as one fused GEMM: a dense layer's MLP, or the shared experts
    (n experts of width F run as one of width n F: SwiGLU's width splits into independent parts)."""

    def __init__(self, hidden_size: int, ffn_hidden_size: int):
        super().__init__()
        self.gate_up_proj = nn.Linear(hidden_size, 2 * ffn_hidden_size, bias=False)
        self.down_proj = nn.Linear(ffn_hidden_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


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


class MoEBlock(nn.Module):
    """One decoder layer, (B, T, h) -> (B, T, h): a MoE layer, or a dense one where ``index`` is in
    ``cfg.dense_layers``. ``tables``: RoPE cos/sin to share (the model builds them once)."""

    def __init__(self, cfg: MoEConfig, index: int = -1, tables: tuple[torch.Tensor, torch.Tensor] | None = None):
        super().__init__()
        self.cfg = cfg
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = MoEAttention(cfg, tables)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MoEMLP(cfg) if cfg.is_moe_layer(index) else SwiGLU(cfg.hidden_size, cfg.ffn_hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))

    def forward_cached(self, x: torch.Tensor, cache: LayerKV, start: Position) -> torch.Tensor:
        """``forward`` with a static KV cache (``MoEAttention.forward_cached``); the MLP routes as in training."""
        x = x + self.self_attn.forward_cached(self.input_layernorm(x), cache, start)
        return x + self.mlp(self.post_attention_layernorm(x))


def load_balancing_loss(stats: list[tuple[torch.Tensor, torch.Tensor, int]], n_experts: int) -> torch.Tensor:
    """Switch Transformer's auxiliary loss (Fedus et al. 2022, eq. 4-6) over the MoE layers' ``router_stats``,
    as transformers' ``load_balancing_loss_func`` computes it: the fraction of routed copies per expert f_e
    and the mean router probability P_e, each averaged over every layer's tokens together, then
    E x sum_e f_e P_e (k for a uniform router). Only P carries a gradient; every token counts."""
    prob_sum = sum(s[0] for s in stats)
    tokens_sum = sum(s[1] for s in stats)
    rows = sum(s[2] for s in stats)
    return n_experts * torch.sum((tokens_sum / rows) * (prob_sum / rows))


class MoEModel(nn.Module):
    """The LM. ``forward(idx (B, T), targets (B, T) | None) -> (logits, loss)``; the loss is the cross-entropy
    plus ``router_aux_loss_coef`` x the load-balancing loss (where the coefficient is not 0)."""

    def __init__(self, cfg: MoEConfig, *, activation_checkpointing: bool = False):
        super().__init__()
        self.cfg = cfg
        self.activation_checkpointing = activation_checkpointing
        self.embed_tokens = nn.Embedding(cfg.padded_vocab_size, cfg.hidden_size)
        tables = rope_tables(cfg)
        self.layers = nn.ModuleList(MoEBlock(cfg, i, tables) for i in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.padded_vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        # random values: the family's (``MoE.init_rule``, drawn by ``accel_kit.models.init``)

    def moe_layers(self) -> list[MoEMLP]:
        return [block.mlp for block in self.layers if isinstance(block.mlp, MoEMLP)]

    def reset_buffers(self) -> None:
        """Recompute the RoPE tables on the model's device once, shared by every layer as when built (after
        building on meta and ``to_empty``)."""
        tables = rope_tables(self.cfg, device=self.embed_tokens.weight.device)
        for block in self.layers:
            block.self_attn.rope_cos, block.self_attn.rope_sin = tables

    def embed(self, idx: torch.Tensor) -> torch.Tensor:
        if idx.shape[1] > self.cfg.seq_len:
            raise ValueError(f"sequence of {idx.shape[1]} tokens is longer than the model's context {self.cfg.seq_len}")
        return self.embed_tokens(idx)

    def forward_blocks(self, x: torch.Tensor) -> torch.Tensor:
        return run_blocks(self.layers, x, checkpointing=self.activation_checkpointing, training=self.training)

    def head(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(x))

    def aux_loss(self) -> torch.Tensor:
        """The load-balancing loss of the last forward (unweighted)."""
        return load_balancing_loss([m.router_stats for m in self.moe_layers()], self.cfg.n_experts)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        logits = self.head(self.forward_blocks(self.embed(idx)))  # (B, T, V_padded)
        if targets is None:
            return logits, None
        loss = lm_loss(logits, targets)
        if self.cfg.router_aux_loss_coef:
            loss = loss + self.cfg.router_aux_loss_coef * self.aux_loss()
        return logits, loss

    def forward_cached(self, idx: torch.Tensor, cache: KVCache, start: Position) -> torch.Tensor:
        """Logits (B, 1, V_padded) of the last of the tokens ``idx`` (B, T) at positions start .. start + T - 1,
        their keys and values written to ``cache``: a prefill (start 0) or a decode step (T = 1)."""
        T = idx.shape[1]
        if not isinstance(start, torch.Tensor) and start + T > self.cfg.seq_len:  # a tensor: its caller checks
            raise ValueError(f"position {start + T - 1} is beyond the model's context {self.cfg.seq_len}")
        x = self.embed_tokens(idx)  # (B, T, h)
        for block, layer_cache in zip(self.layers, cache.layers):
            x = block.forward_cached(x, layer_cache, start)
        return self.head(x[:, -1:])

    def num_params(self) -> int:
        return unique_param_count(self)

    def load_imbalance(self) -> list[float]:
        """Per MoE layer, the busiest expert's tokens over the mean, in the last forward (1.0: even; E: all on one
        expert), from each layer's dispatcher (``last_tokens_per_expert``)."""
        counts = [m.dispatcher.last_tokens_per_expert for m in self.moe_layers()]
        return [(c.max() / c.float().mean()).item() for c in counts if c is not None]

    def expert_kernel_ran(self) -> str | None:
        """The experts' kernel of the last forward (None before one)."""
        return next((m.experts.kernel_ran for m in self.moe_layers()), None)
