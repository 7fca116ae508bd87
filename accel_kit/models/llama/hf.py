"""Conversion between our ``Llama`` and transformers' ``LlamaForCausalLM``.

Both store ``nn.Linear`` weights as (out, in) in the same rotate-half RoPE layout, so weights
map by name except for our two fused projections: ``qkv_proj`` is q_proj, k_proj and v_proj
stacked by rows; ``gate_up_proj`` is gate_proj then up_proj. RoPE settings go into
transformers 5.x's ``rope_parameters`` dict (rope_theta beside the rope_type's own keys).
"""
from __future__ import annotations

from dataclasses import replace

import torch

from accel_kit.models.init import allocated, transformers_uninitialised
from accel_kit.models.llama.config import LlamaConfig, RopeScaling
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


def _split_sizes(cfg: LlamaConfig) -> tuple[list[int], list[int]]:
    """Row counts of the fused projections' parts: (q, k, v) and (gate, up)."""
    q, kv = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    return [q, kv, kv], [cfg.ffn_hidden_size, cfg.ffn_hidden_size]


def split_fused(state: dict[str, torch.Tensor], cfg: LlamaConfig) -> dict[str, torch.Tensor]:
    """``state`` with each fused projection split into transformers' parts (views, no copies); other
    names as they are, so this maps one block's state dict as well as a whole model's."""
    qkv_rows, gate_up_rows = _split_sizes(cfg)
    out = {}
    for name, tensor in state.items():
        if name.endswith("self_attn.qkv_proj.weight"):
            prefix = name.removesuffix("qkv_proj.weight")
            out.update({f"{prefix}{p}.weight": t for p, t in zip(("q_proj", "k_proj", "v_proj"), tensor.split(qkv_rows))})
        elif name.endswith("mlp.gate_up_proj.weight"):
            prefix = name.removesuffix("gate_up_proj.weight")
            out.update({f"{prefix}{p}.weight": t for p, t in zip(("gate_proj", "up_proj"), tensor.split(gate_up_rows))})
        else:
            out[name] = tensor
    return out


def to_hf_state(state: dict[str, torch.Tensor], cfg: LlamaConfig) -> dict[str, torch.Tensor]:
    """Our model's state dict under ``LlamaForCausalLM``'s names (the decoder under ``model.``)."""
    return {name if name == "lm_head.weight" else f"model.{name}": t for name, t in split_fused(state, cfg).items()}


def from_hf_state(hf_state: dict[str, torch.Tensor], cfg: LlamaConfig) -> dict[str, torch.Tensor]:
    """transformers' state dict under our names, the split projections concatenated."""
    out = {}
    for i in range(cfg.n_layers):
        hf, ours = f"model.layers.{i}.", f"layers.{i}."
        out[ours + "self_attn.qkv_proj.weight"] = torch.cat(
            [hf_state[f"{hf}self_attn.{p}.weight"] for p in ("q_proj", "k_proj", "v_proj")])
        out[ours + "mlp.gate_up_proj.weight"] = torch.cat(
            [hf_state[f"{hf}mlp.{p}.weight"] for p in ("gate_proj", "up_proj")])
        for name in ("input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.o_proj.weight",
                     "mlp.down_proj.weight"):
            out[ours + name] = hf_state[hf + name]
    out["embed_tokens.weight"] = hf_state["model.embed_tokens.weight"]
    out["norm.weight"] = hf_state["model.norm.weight"]
    out["lm_head.weight"] = hf_state.get("lm_head.weight", hf_state["model.embed_tokens.weight"])
    return out


def to_hf(model: Llama):
    """A ``LlamaForCausalLM`` holding a copy of ``model``'s weights."""
    from transformers import LlamaForCausalLM

    hf = transformers_uninitialised(lambda: LlamaForCausalLM(hf_config(model.cfg)))  # every weight copied from ours
    hf_state = hf.state_dict()
    with torch.no_grad():
        for key, value in to_hf_state(model.state_dict(), model.cfg).items():
            hf_state[key].copy_(value)
    return hf


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
    if cfg.padded_vocab_size != c.vocab_size:
        cfg = replace(cfg, pad_vocab_multiple=c.vocab_size)  # keep every embedding row of the source
    return cfg


def from_hf(hf_model, *, vocab_size: int | None = None) -> Llama:
    """Our Llama holding a copy of a ``LlamaForCausalLM``'s weights (``vocab_size``: the tokenizer's,
    where the source's embedding is padded beyond it)."""
    cfg = config_from_hf(hf_model.config, vocab_size=vocab_size)
    model = allocated(lambda: Llama(cfg), hf_model.device)  # no draws: every weight is copied from the source
    state = model.state_dict()
    with torch.no_grad():
        for name, value in from_hf_state(hf_model.state_dict(), cfg).items():
            state[name].copy_(value)
    return model


class HFLlamaLayer(torch.nn.Module):
    """transformers' ``LlamaDecoderLayer`` of ``cfg``'s shape as a ``(B, T, h) -> (B, T, h)`` module.

    The decoder layer takes its RoPE cos/sin from the caller (``LlamaModel`` computes them once
    per forward); this wrapper computes them itself with ``LlamaRotaryEmbedding`` each call,
    as the whole model would for one layer. SDPA attention, causal (no mask given). Its
    weights are ``layer``'s, under transformers' names (``split_fused`` maps ours onto them).
    """

    def __init__(self, cfg: LlamaConfig):
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

        super().__init__()
        config = hf_config(cfg)
        self.layer = LlamaDecoderLayer(config, layer_idx=0)
        self.rotary_emb = LlamaRotaryEmbedding(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(x.shape[1], device=x.device)[None]  # (1, T)
        out = self.layer(x, position_embeddings=self.rotary_emb(x, positions), position_ids=positions)
        return out[0] if isinstance(out, tuple) else out  # a tuple in transformers 4.x
