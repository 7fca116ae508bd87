"""``Llama3``: what the Llama 3 family answers (shape, FLOPs, GEMMs, memory, structure, conversion).

FLOPs follow ``accel_kit.flops``: 2 per multiply-add, attention over the full score matrix,
backward twice the forward.
"""
from __future__ import annotations

from types import ModuleType
from typing import ClassVar

import torch
from torch import nn

import accel_kit.models.llama.hf as llama_hf  # by its full name: no import through the package's face
from accel_kit.models.family import Family, FlopTerms, ModelShape, PipelineStages, group_rows_by_shard, shard_block
from accel_kit.models.common.rope import RopeScaling
from accel_kit.models.llama.config import LlamaConfig
from accel_kit.models.init import ONES, Init, InitRule, initialised
from accel_kit.models.llama.model import INIT_STD, Llama, LlamaBlock
from accel_kit.models.llama.presets import PRESETS, SOURCES

BYTES_16BIT = 2  # Korthikanti's accounting is for 16-bit activations
BYTES_FP32 = 4  # SDPA's logsumexp and RMSNorm's inverse RMS stay fp32


class Llama3(Family[LlamaConfig]):
    """Llama 3 / 3.1 / 3.2 (Dubey et al. 2024): RMSNorm, GQA with RoPE, SwiGLU, no biases."""

    name: ClassVar[str] = "llama"
    config_type: ClassVar[type] = LlamaConfig
    presets: ClassVar[dict[str, LlamaConfig]] = PRESETS
    sources: ClassVar[dict[str, str]] = SOURCES
    # The shape is the release's; a point may change the vocabulary (another tokenizer), the
    # context and the embedding padding. No dropout: Llama has none.
    overridable: ClassVar[tuple[str, ...]] = ("vocab_size", "seq_len", "pad_vocab_multiple")
    hf_model_class: ClassVar[str] = "LlamaForCausalLM"
    hf_modules: ClassVar[tuple[str, ...]] = ("transformers.models.llama.modeling_llama",)
    supports_kv_cache: ClassVar[bool] = True  # Llama.forward_cached
    hf_conversion: ClassVar[ModuleType] = llama_hf

    # --- building

    def build(self, cfg: LlamaConfig, *, activation_checkpointing: bool = False) -> Llama:
        return initialised(lambda: Llama(cfg, activation_checkpointing=activation_checkpointing), self.init_rule(cfg))

    def build_layer(self, cfg: LlamaConfig, impl: str = "native") -> nn.Module:
        if impl == "native":
            return initialised(lambda: LlamaBlock(cfg), self.init_rule(cfg))
        if impl == "hf":
            return llama_hf.HFLlamaLayer(cfg)
        raise ValueError(f"layer impl must be 'native' or 'hf', got {impl!r}")

    def init_rule(self, cfg: LlamaConfig) -> InitRule:
        # transformers' Llama init: normal(0, 0.02) for linears and the embedding; norms start at 1.
        # No depth scaling of the residual projections (unlike GPT-2's 1/sqrt(2L)).
        return lambda name: ONES if name.endswith("norm.weight") else Init(std=INIT_STD)

    # --- shape and work

    def config_from_dict(self, data: dict) -> LlamaConfig:
        # asdict flattens the nested RoPE scaling record; build it again.
        scaling = data.get("rope_scaling")
        return LlamaConfig(**(data | {"rope_scaling": RopeScaling(**scaling) if scaling else None}))

    def context_length(self, cfg: LlamaConfig) -> int:
        return cfg.seq_len  # the RoPE tables' positions

    def shape(self, cfg: LlamaConfig) -> ModelShape:
        return ModelShape(family=self.name, n_layers=cfg.n_layers, hidden_size=cfg.hidden_size, n_heads=cfg.n_heads,
                          n_kv_heads=cfg.n_kv_heads, head_dim=cfg.head_dim, ffn_hidden_size=cfg.ffn_hidden_size,
                          vocab_size_model=cfg.padded_vocab_size, vocab_size=cfg.vocab_size)

    def layer_flop_terms(self, cfg: LlamaConfig, seq_len: int) -> FlopTerms:
        """Forward FLOPs per token of one layer: 2 per weight of its linears, plus attention's products.

        Weights: q_proj h x (nh hd); k_proj and v_proj h x (nkv hd) each (GQA's narrower keys and
        values); o_proj (nh hd) x h; gate, up and down h x ffn each (SwiGLU's three matrices). Each
        weight is one multiply-add per token: 2 FLOPs. Attention: the scores Q K^T are hd
        multiply-adds per (query head, key position) and the weighted sum P V as many again, for
        every one of the nh query heads (GQA shares K and V between heads, not the products) over
        all seq_len positions (the full matrix, as ``accel_kit.flops`` counts it): 2 x 2 x seq_len x nh hd.
        """
        return FlopTerms(matmul=2 * self.layer_weight_count(cfg), attention=4 * seq_len * cfg.n_heads * cfg.head_dim)

    def gemm_shapes(self, cfg: LlamaConfig, tokens: int) -> tuple[tuple[int, int, int], ...]:
        """(M, K, N) of the fused qkv, o_proj, fused gate+up and down products, in forward order."""
        h, q, kv, f = cfg.hidden_size, cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim, cfg.ffn_hidden_size
        return ((tokens, h, q + 2 * kv), (tokens, q, h), (tokens, h, 2 * f), (tokens, f, h))

    # --- memory

    def activation_bytes_per_layer(self, cfg: LlamaConfig, micro_batch: int, seq_len: int, *,
                                   flash_attention: bool, tp: int = 1) -> int:
        """Bytes one layer keeps for backward, 16-bit activations (Korthikanti et al. 2022, section 4.1,
        adapted to RMSNorm, GQA and SwiGLU, with no dropout).

        With s sequence, b batch, h hidden, a = n_heads, dq = a hd, dkv = n_kv_heads hd, f = FFN width:

        - the two RMSNorms: each input, 2 sbh, and its fp32 inverse RMS, 4 sb: 4 sbh + 8 sb;
        - qkv_proj's input (the first norm's output): 2 sbh;
        - attention's q, k, v after RoPE (RoPE's backward needs only the cos/sin tables): 2 sb (dq + 2 dkv);
        - attention's output, saved by SDPA and, as the same tensor, o_proj's input: 2 sb dq;
        - flash attention: its fp32 logsumexp per query head and position, 4 abs; without it,
          the softmax probabilities, 2 a s^2 b (Korthikanti's 5 a s^2 b counts dropout's mask and
          output besides, which Llama has not);
        - gate_up_proj's input (the second norm's output): 2 sbh;
        - SwiGLU: gate and up (silu's and the product's backward read them), silu(gate) (the
          product's backward), and their product (down_proj's input): 4 x 2 sbf.

        In all 8 sbh + 4 sb (dq + dkv) + 8 sbf + 8 sb + attention's term; the residual adds keep
        nothing. (GPT-2's 34 sbh is the same count with dropout masks and 4h MLP.)

        On one of ``tp`` tensor-parallel ranks (Korthikanti's section 4.2, no sequence parallelism) the
        norms' terms and the two projections' inputs (8 sbh + 8 sb) stay whole; the per-head tensors
        (q, k, v, attention's output, its logsumexp or probabilities) and SwiGLU's split by ``tp``.
        """
        s, b, h, a = seq_len, micro_batch, cfg.hidden_size, cfg.n_heads
        dq, dkv, f = a * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim, cfg.ffn_hidden_size
        norms = 2 * (BYTES_16BIT * s * b * h + BYTES_FP32 * s * b)
        scores = BYTES_FP32 * a * s * b if flash_attention else BYTES_16BIT * a * s * s * b
        whole = norms + 2 * BYTES_16BIT * s * b * h  # the norms, and qkv_proj's and gate_up_proj's inputs
        split = BYTES_16BIT * s * b * (dq + 2 * dkv + dq) + scores + BYTES_16BIT * s * b * 4 * f
        return whole + split // tp

    def layer_weight_count(self, cfg: LlamaConfig) -> int:
        """Weights of one layer's linears (q, k, v, o, gate, up, down); the two norms' 2h weights not counted."""
        h, q, kv, f = cfg.hidden_size, cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim, cfg.ffn_hidden_size
        return h * (q + 2 * kv) + q * h + 3 * h * f

    # --- structure

    def prunable_linears(self, model: nn.Module) -> list[tuple[str, nn.Linear]]:
        """Every block's linears (fused qkv, o, fused gate+up, down), by qualified name."""
        return [(name, m) for name, m in model.named_modules()
                if isinstance(m, nn.Linear) and name.startswith("layers.")]

    def pipeline_stages(self, model: nn.Module) -> PipelineStages:
        return Llama.stages  # each block holds its own RoPE tables: the blocks split with nothing shared to carry

    pipeline_parallel: ClassVar[bool] = True  # the model computes embed, forward_blocks and head apart

    tensor_parallel: ClassVar[bool] = True

    def apply_tensor_parallel(self, model: nn.Module, tp_mesh) -> None:
        # GQA: each rank keeps n_heads / tp query heads and n_kv_heads / tp key/value heads, so its query
        # groups meet their own key/value heads (the layout check asks that tp divide both).
        tp = tp_mesh.size()
        for block in model.layers:
            attn, mlp = block.self_attn, block.mlp
            q, kv = attn.n_heads * attn.head_dim, attn.n_kv_heads * attn.head_dim
            group_rows_by_shard(attn.qkv_proj, [q, kv, kv], tp)  # fused [q; k; v]
            group_rows_by_shard(mlp.gate_up_proj, [mlp.down_proj.in_features] * 2, tp)  # fused [gate; up]
            shard_block(block, tp_mesh, colwise=["self_attn.qkv_proj", "mlp.gate_up_proj"],
                        rowwise=["self_attn.o_proj", "mlp.down_proj"])
            attn.n_heads //= tp
            attn.n_kv_heads //= tp

    context_parallel: ClassVar[bool] = True

    def position_buffers(self, model: Llama) -> list[tuple[torch.Tensor, int]]:
        return model.position_buffers()  # every layer's RoPE tables, each tensor once
