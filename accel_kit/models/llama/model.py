"""The Llama 3 architecture (Dubey et al. 2024; Touvron et al. 2023): our ``LlamaBlock`` and ``Llama`` LM.

Per layer: x + attn(RMSNorm(x)), then + SwiGLU-MLP(RMSNorm(x)). Attention is causal grouped-query
attention (n_kv_heads key/value heads, each shared by n_heads / n_kv_heads query heads) with RoPE
on queries and keys; no biases anywhere. The pieces are the shared ones (``accel_kit.models.common``:
``RotaryAttention``, ``SwiGLU``, ``RMSNorm``, ``DecoderBlock``, ``RotaryCausalLM``). Two projections are
fused for speed, one GEMM each instead of three and two: ``qkv_proj`` holds transformers' q_proj, k_proj,
v_proj rows stacked in that order, ``gate_up_proj`` their gate_proj then up_proj rows (``llama.hf`` splits
them). Other names follow transformers' ``LlamaForCausalLM`` so the rest converts by name.

Speed on a CPU (Llama 3.2 1B's layer, batch 1, 256 tokens, forward and backward; AMD EPYC with
AVX-512 and avx512_bf16, torch 2.13, one and two threads): on par with transformers'
``LlamaDecoderLayer``, 0.96-1.02x in fp32 and bf16. The matrix products are 91-96 % of the time
and MKL (fp32) and oneDNN (bf16) run them at the same rate fused or split; the fusions are for
devices where each product is a kernel launch. What the attention's and the norm's choices measured:
``accel_kit.models.common.attention``, ``accel_kit.models.common.norm``.
"""
from __future__ import annotations

import torch

from accel_kit.models.common.block import DecoderBlock, SwiGLU
from accel_kit.models.common.lm import RotaryCausalLM
from accel_kit.models.llama.config import LlamaConfig

INIT_STD = 0.02  # transformers' LlamaConfig.initializer_range: every linear and the embedding ~ N(0, 0.02^2)


class LlamaBlock(DecoderBlock):
    """One Llama decoder layer, (B, T, h) -> (B, T, h): RoPE attention and a SwiGLU MLP.

    ``tables``: RoPE cos/sin to share (the model builds them once for all its layers); by
    default the block builds its own for ``cfg.seq_len`` positions.
    """

    def __init__(self, cfg: LlamaConfig, tables: tuple[torch.Tensor, torch.Tensor] | None = None):
        super().__init__(cfg, SwiGLU(cfg.hidden_size, cfg.ffn_hidden_size), tables)


class Llama(RotaryCausalLM):
    """Llama 3 LM. ``forward(idx (B, T), targets (B, T) | None) -> (logits, loss)``, as ``GPT``'s."""

    def __init__(self, cfg: LlamaConfig, *, activation_checkpointing: bool = False):
        super().__init__(cfg, lambda index, tables: LlamaBlock(cfg, tables),
                         activation_checkpointing=activation_checkpointing)
