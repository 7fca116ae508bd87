"""Conversion between our ``Llama`` and transformers' ``LlamaForCausalLM``.

Both store ``nn.Linear`` weights as (out, in) in the same rotate-half RoPE layout, so weights
map by name except for our two fused projections: ``qkv_proj`` is q_proj, k_proj and v_proj
stacked by rows; ``gate_up_proj`` is gate_proj then up_proj (``state_map``, declared to the shared
``accel_kit.models.common.hf``). RoPE settings go into transformers 5.x's ``rope_parameters`` dict
(rope_theta beside the rope_type's own keys).
"""
from __future__ import annotations

from accel_kit.models.common.hf import (RotaryLayer, StateMap, from_hf_model, keeping_source_rows, rotary_fused,
                                        to_hf_model)
from accel_kit.models.common.rope import RopeScaling
from accel_kit.models.llama.config import LlamaConfig
from accel_kit.models.llama.model import Llama


def rope_parameters(cfg: LlamaConfig) -> dict:
    """transformers' ``rope_parameters`` for our RoPE settings ("default", or Llama 3.1's "llama3")."""
    if cfg.rope_scaling is None:
        return {"rope_type": "default", "rope_theta": cfg.rope_theta}
    s = cfg.rope_scaling
    return {"rope_type": "llama3", "rope_theta": cfg.rope_theta, "factor": s.factor,
            "low_freq_factor": s.low_freq_factor, "high_freq_factor": s.high_freq_factor,
            "original_max_position_embeddings": s.original_max_position}


def hf_config(cfg: LlamaConfig):
    """The transformers ``LlamaConfig`` of the same shape (SDPA attention, no dropout, no biases).

    transformers warns when the context (``seq_len``) is not longer than the scaling's original
    one (a benchmark's short sequences): harmless, as Llama 3.1's frequencies do not depend on it.
    """
    from transformers import LlamaConfig as HFLlamaConfig

    hf = HFLlamaConfig(vocab_size=cfg.padded_vocab_size, hidden_size=cfg.hidden_size,
                       intermediate_size=cfg.ffn_hidden_size, num_hidden_layers=cfg.n_layers,
                       num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.n_kv_heads, head_dim=cfg.head_dim,
                       hidden_act="silu", max_position_embeddings=cfg.seq_len, rms_norm_eps=cfg.rms_norm_eps,
                       rope_parameters=rope_parameters(cfg), tie_word_embeddings=cfg.tie_embeddings,
                       attention_bias=False, mlp_bias=False, attention_dropout=cfg.dropout, use_cache=False)
    hf._attn_implementation = "sdpa"
    return hf


def state_map(cfg: LlamaConfig) -> StateMap:
    """Our names onto ``LlamaForCausalLM``'s: the decoder under ``model.``, the fused projections split."""
    q, kv = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    return StateMap(prefix="model.", fused=rotary_fused(q, kv, cfg.ffn_hidden_size))


def to_hf(model: Llama):
    """A ``LlamaForCausalLM`` holding a copy of ``model``'s weights."""
    from transformers import LlamaForCausalLM

    return to_hf_model(model, lambda: LlamaForCausalLM(hf_config(model.cfg)), state_map(model.cfg))


def config_from_hf(c, *, vocab_size: int | None = None) -> LlamaConfig:
    """Our config for a transformers ``LlamaConfig`` (one with biases or a decoupled head dim has none)."""
    if getattr(c, "attention_bias", False) or getattr(c, "mlp_bias", False):
        raise ValueError("a Llama with biases has no LlamaConfig here (Llama 3 has none)")
    if c.head_dim != c.hidden_size // c.num_attention_heads:
        raise ValueError(f"head_dim {c.head_dim} is not hidden_size / num_attention_heads "
                         f"({c.hidden_size} / {c.num_attention_heads}); ours always is")
    rope = dict(c.rope_parameters)
    if rope.get("rope_type", "default") not in ("default", "llama3"):
        raise ValueError(f"rope_type {rope['rope_type']!r} is not Llama 3's ('default' or 'llama3')")
    scaling = None if rope.get("rope_type", "default") == "default" else RopeScaling(
        factor=rope["factor"], low_freq_factor=rope["low_freq_factor"], high_freq_factor=rope["high_freq_factor"],
        original_max_position=rope["original_max_position_embeddings"])
    cfg = LlamaConfig(n_layers=c.num_hidden_layers, hidden_size=c.hidden_size, n_heads=c.num_attention_heads,
                      n_kv_heads=c.num_key_value_heads, ffn_hidden_size=c.intermediate_size,
                      vocab_size=vocab_size or c.vocab_size, seq_len=c.max_position_embeddings,
                      rope_theta=rope["rope_theta"], rope_scaling=scaling, rms_norm_eps=c.rms_norm_eps,
                      tie_embeddings=bool(c.tie_word_embeddings))
    return keeping_source_rows(cfg, c.vocab_size)


def from_hf(hf_model, *, vocab_size: int | None = None) -> Llama:
    """Our Llama holding a copy of a ``LlamaForCausalLM``'s weights (``vocab_size``: the tokenizer's,
    where the source's embedding is padded beyond it)."""
    cfg = config_from_hf(hf_model.config, vocab_size=vocab_size)
    return from_hf_model(hf_model, lambda: Llama(cfg), state_map(cfg))


class HFLlamaLayer(RotaryLayer):
    """transformers' ``LlamaDecoderLayer`` of ``cfg``'s shape as a ``(B, T, h) -> (B, T, h)`` module, its RoPE
    from ``LlamaRotaryEmbedding`` each call (``RotaryLayer``). Its weights are ``layer``'s, under
    transformers' names (``state_map(cfg).layer_names`` maps ours onto them)."""

    def __init__(self, cfg: LlamaConfig):
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

        config = hf_config(cfg)
        super().__init__(LlamaDecoderLayer(config, layer_idx=0), LlamaRotaryEmbedding(config))
