"""The Llama 3 architecture (Dubey et al. 2024; Touvron et al. 2023): our ``LlamaBlock`` and ``Llama`` LM.

Per layer: x + attn(RMSNorm(x)), then + SwiGLU-MLP(RMSNorm(x)). Attention is causal grouped-query
attention (n_kv_heads key/value heads, each shared by n_heads / n_kv_heads query heads) with RoPE
on queries and keys; no biases anywhere. Two projections are fused for speed, one GEMM each
instead of three and two: ``qkv_proj`` holds transformers' q_proj, k_proj, v_proj rows stacked
in that order, ``gate_up_proj`` their gate_proj then up_proj rows (``llama.hf`` splits them).
Other names follow transformers' ``LlamaForCausalLM`` so the rest converts by name.

Speed on a CPU (Llama 3.2 1B's layer, batch 1, 256 tokens, forward and backward; AMD EPYC with
AVX-512 and avx512_bf16, torch 2.13, one and two threads): on par with transformers'
``LlamaDecoderLayer``, 0.96-1.02x in fp32 and bf16. The matrix products are 91-96 % of the time
and MKL (fp32) and oneDNN (bf16) run them at the same rate fused or split; the fusions are for
devices where each product is a kernel launch. What the choices here measured (one thread):
SDPA with ``enable_gqa`` 25.2 ms against 27.8 ms with k and v repeated per query head (fp32;
bf16 28.2 against 29.4), and it keeps no repeated copies for backward; ``_RMSNormFunction``
1.3 ms against 1.85 ms per norm (fp32) for transformers' autograd through its ops.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from accel_kit.models.family import IGNORE_INDEX, lm_loss, run_blocks, unique_param_count  # noqa: F401 (IGNORE_INDEX: the package re-exports it)
from accel_kit.models.llama.config import LlamaConfig
from accel_kit.models.llama.rope import apply_rope, rope_tables
from accel_kit.models.kv_cache import KVCache, LayerKV, Position, cached_attention, position_rows
from accel_kit.models.sdpa import causal_attention

INIT_STD = 0.02  # transformers' LlamaConfig.initializer_range: every linear and the embedding ~ N(0, 0.02^2)


class _RMSNormFunction(torch.autograd.Function):
    """transformers' ``LlamaRMSNorm`` forward, op for op, with a backward that keeps less.

    Forward as transformers computes it: normalise in fp32, cast back to the input's dtype,
    scale by the weight. Autograd through those ops would keep the fp32 copy of a 16-bit input
    and the normalised tensor besides the input (4 sbh bytes more per norm at 16 bits); this
    keeps only the input and the fp32 inverse RMS and recomputes the rest in backward.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        x32 = x.float()
        inv_rms = torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)  # (..., 1) fp32
        ctx.save_for_backward(x, inv_rms, weight)
        return weight * (x32 * inv_rms).to(x.dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, inv_rms, weight = ctx.saved_tensors
        normed = x.float() * inv_rms  # n = x r, fp32, recomputed
        grad_weight = None
        if ctx.needs_input_grad[1]:
            grad_weight = (grad * normed.to(x.dtype)).reshape(-1, normed.shape[-1]).sum(0).to(weight.dtype)
        grad_x = None
        if ctx.needs_input_grad[0]:
            grad_normed = (grad * weight).float()  # g_n, in the product's dtype then fp32, as autograd would
            # d/dx of x r(x), r = (mean(x^2) + eps)^-1/2: dr/dx_i = -r^3 x_i / h, so
            # dL/dx = r (g_n - n mean(g_n n)).
            grad_x = (inv_rms * (grad_normed - normed * (grad_normed * normed).mean(-1, keepdim=True))).to(x.dtype)
        return grad_x, grad_weight, None


class RMSNorm(nn.Module):
    """Root-mean-square norm (Zhang and Sennrich 2019), numerically transformers' ``LlamaRMSNorm``.

    The forward is bit-identical to theirs in every dtype (the same ops in the same order); the
    backward is the same derivative, in other summation orders (``_RMSNormFunction``).
    """

    def __init__(self, hidden_size: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _RMSNormFunction.apply(x, self.weight, self.eps)


class LlamaAttention(nn.Module):
    """Causal GQA self-attention with RoPE. The cos/sin tables are non-persistent buffers: not weights."""

    def __init__(self, cfg: LlamaConfig, tables: tuple[torch.Tensor, torch.Tensor] | None = None):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.cfg = cfg
        q_width, kv_width = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
        self.qkv_proj = nn.Linear(cfg.hidden_size, q_width + 2 * kv_width, bias=False)
        self.o_proj = nn.Linear(q_width, cfg.hidden_size, bias=False)
        cos, sin = tables if tables is not None else rope_tables(cfg)
        self.register_buffer("rope_cos", cos, persistent=False)  # (seq_len, head_dim/2) fp32
        self.register_buffer("rope_sin", sin, persistent=False)

    def reset_buffers(self) -> None:
        """Recompute the tables where they are (after ``to_empty``: a non-persistent buffer loads from nowhere)."""
        self.rope_cos, self.rope_sin = rope_tables(self.cfg, device=self.rope_cos.device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        if T > self.rope_cos.shape[0]:
            raise ValueError(f"sequence of {T} tokens is longer than the RoPE tables' {self.rope_cos.shape[0]} positions")
        nh, nkv, hd = self.n_heads, self.n_kv_heads, self.head_dim
        # split, not slicing: split's backward concatenates the parts' gradients, where each slice's
        # would fill a zero tensor of the whole width and add into it.
        qk, v = self.qkv_proj(x).split([(nh + nkv) * hd, nkv * hd], dim=-1)  # (B, T, (nh + nkv) hd), (B, T, nkv hd)
        # RoPE on queries and keys together: one set of elementwise kernels for both.
        qk = apply_rope(qk.unflatten(-1, (nh + nkv, hd)), self.rope_cos[:T].to(x.dtype), self.rope_sin[:T].to(x.dtype))
        q, k = qk.split([nh, nkv], dim=2)  # (B, T, nh, hd), (B, T, nkv, hd)
        # (B, heads, T, hd) strided views: SDPA takes them as they are. v is copied out of the qkv
        # output (nkv hd wide, a small copy) so that what SDPA keeps for backward does not hold
        # all of it, the pre-RoPE q and k included (2 sb (nh + nkv) hd bytes at 16 bits).
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.contiguous().unflatten(-1, (nkv, hd)).transpose(1, 2)
        # enable_gqa (where torch has it): SDPA broadcasts each key/value head over its query group inside
        # the kernel, with no repeated (B, nh, T, hd) copies of k and v; faster than repeating them on CPU
        # in fp32 and bf16 (the module's speed note), and no copies kept for backward.
        y = causal_attention(q, k, v)  # (B, nh, T, hd)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, nh * hd))

    def forward_cached(self, x: torch.Tensor, cache: LayerKV, start: Position) -> torch.Tensor:
        """``forward`` for tokens at positions start .. start + T - 1 (RoPE at those positions), their keys
        and values written to ``cache`` at the narrow n_kv_heads width, attention over its valid prefix."""
        B, T, _ = x.shape
        nh, nkv, hd = self.n_heads, self.n_kv_heads, self.head_dim
        qk, v = self.qkv_proj(x).split([(nh + nkv) * hd, nkv * hd], dim=-1)
        cos = position_rows(self.rope_cos, start, T).to(x.dtype)
        sin = position_rows(self.rope_sin, start, T).to(x.dtype)
        q, k = apply_rope(qk.unflatten(-1, (nh + nkv, hd)), cos, sin).split([nh, nkv], dim=2)  # (B, T, heads, hd)
        # the valid prefix, (B, nkv, start + T, hd) each
        k, v = cache.write(start, k.transpose(1, 2), v.unflatten(-1, (nkv, hd)).transpose(1, 2))
        y = cached_attention(q.transpose(1, 2), k, v, start)  # (B, nh, T, hd)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, nh * hd))


class LlamaMLP(nn.Module):
    """SwiGLU (Shazeer 2020): down(silu(gate(x)) * up(x)), gate and up as one fused GEMM."""

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.ffn_hidden_size, bias=False)
        self.down_proj = nn.Linear(cfg.ffn_hidden_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)  # (B, T, ffn) views each
        return self.down_proj(F.silu(gate) * up)


class LlamaBlock(nn.Module):
    """One Llama decoder layer, (B, T, h) -> (B, T, h).

    ``tables``: RoPE cos/sin to share (the model builds them once for all its layers); by
    default the block builds its own for ``cfg.seq_len`` positions.
    """

    def __init__(self, cfg: LlamaConfig, tables: tuple[torch.Tensor, torch.Tensor] | None = None):
        super().__init__()
        self.cfg = cfg
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = LlamaAttention(cfg, tables)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = LlamaMLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))

    def forward_cached(self, x: torch.Tensor, cache: LayerKV, start: Position) -> torch.Tensor:
        """``forward`` with a static KV cache (``LlamaAttention.forward_cached``)."""
        x = x + self.self_attn.forward_cached(self.input_layernorm(x), cache, start)
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(nn.Module):
    """Llama 3 LM. ``forward(idx (B, T), targets (B, T) | None) -> (logits, loss)``, as ``GPT``'s.

    The RoPE tables are computed once and shared by every layer's buffers; moving the model
    (``.to``) gives each layer its own copy, 4 * seq_len * head_dim bytes (fp32) per layer: about
    0.5 % of one layer's 16-bit activations at batch 1 and the same sequence length for Llama
    3.2 1B (512 of ~92 000 bytes per token), less for the wider models.
    """

    def __init__(self, cfg: LlamaConfig, *, activation_checkpointing: bool = False):
        super().__init__()
        self.cfg = cfg
        self.activation_checkpointing = activation_checkpointing
        self.embed_tokens = nn.Embedding(cfg.padded_vocab_size, cfg.hidden_size)
        tables = rope_tables(cfg)
        self.layers = nn.ModuleList(LlamaBlock(cfg, tables) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.padded_vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        # random values: the family's (``LlamaFamily.init_rule``, drawn by ``accel_kit.models.init``)

    def reset_buffers(self) -> None:
        """Recompute the RoPE tables on the layers' device once, shared by every layer as when built (after
        building on meta and ``to_empty``)."""
        tables = rope_tables(self.cfg, device=self.embed_tokens.weight.device)
        for block in self.layers:
            block.self_attn.rope_cos, block.self_attn.rope_sin = tables

    # The forward in three parts, as a pipeline runs them one stage at a time (``Family.stage_forward``);
    # each block holds its RoPE tables, so the blocks need nothing from the embedding's stage.

    def embed(self, idx: torch.Tensor) -> torch.Tensor:
        """Token ids (B, T) -> hidden states (B, T, h)."""
        B, T = idx.shape
        if T > self.cfg.seq_len:
            raise ValueError(f"sequence of {T} tokens is longer than the model's context {self.cfg.seq_len}")
        return self.embed_tokens(idx)

    def forward_blocks(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, h) through the blocks this model holds."""
        return run_blocks(self.layers, x, checkpointing=self.activation_checkpointing, training=self.training)

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """Hidden states (B, T, h) -> logits (B, T, V_padded): the final RMSNorm and the output projection."""
        return self.lm_head(self.norm(x))

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        logits = self.head(self.forward_blocks(self.embed(idx)))  # (B, T, V_padded)
        return logits, (None if targets is None else lm_loss(logits, targets))

    def forward_cached(self, idx: torch.Tensor, cache: KVCache, start: Position) -> torch.Tensor:
        """Logits (B, 1, V_padded) of the last of the tokens ``idx`` (B, T) at positions start .. start + T - 1,
        their keys and values written to ``cache`` (``accel_kit.models.kv_cache``): a prefill (start 0) or a
        decode step (T = 1; a tensor ``start`` for a static-shape step, checked by its caller, since reading it
        here would stall the device). Only the last position's logits: the next token is all generation reads."""
        T = idx.shape[1]
        if not isinstance(start, torch.Tensor) and start + T > self.cfg.seq_len:
            raise ValueError(f"position {start + T - 1} is beyond the model's context {self.cfg.seq_len}")
        x = self.embed_tokens(idx)  # (B, T, h)
        for block, layer_cache in zip(self.layers, cache.layers):
            x = block.forward_cached(x, layer_cache, start)
        return self.head(x[:, -1:])

    def num_params(self) -> int:
        """Unique parameters (a tied output projection counted once)."""
        return unique_param_count(self)
