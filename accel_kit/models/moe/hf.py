"""Conversion between our ``MoEModel`` and transformers' ``Qwen3MoeForCausalLM``, ``MixtralForCausalLM`` and
``OlmoeForCausalLM`` (the config's ``hf_architecture`` says which).

The three store the same weights under the same names but for our fused projections (``qkv_proj``; a dense
layer's ``gate_up_proj``: split as Llama's are, ``accel_kit.models.common.hf.rotary_fused``) and the router
(ours ``mlp.router``, theirs ``mlp.gate``); the experts' 3-D tensors have their names and layout
(``state_map``). Each class
fixes what the config may hold: Qwen3-MoE per-head QK-norm and dense layers (``mlp_only_layers``),
Mixtral no QK-norm and always renormalised top-k, OLMoE QK-norm over the whole projections; none has
ungated shared experts, so a config with them has no transformers model here.
"""
from __future__ import annotations

from accel_kit.models.common.hf import (RotaryLayer, StateMap, from_hf_model, keeping_source_rows, rotary_fused,
                                        to_hf_model)
from accel_kit.models.moe.config import MoEConfig
from accel_kit.models.moe.model import MoEModel

_MODULES = {"Qwen3MoeForCausalLM": "qwen3_moe.modeling_qwen3_moe", "MixtralForCausalLM": "mixtral.modeling_mixtral",
            "OlmoeForCausalLM": "olmoe.modeling_olmoe"}
_PREFIX = {"Qwen3MoeForCausalLM": "Qwen3Moe", "MixtralForCausalLM": "Mixtral", "OlmoeForCausalLM": "Olmoe"}
MODULES = tuple(f"transformers.models.{m}" for m in _MODULES.values())
_ARCH_OF_TYPE = {"qwen3_moe": "Qwen3MoeForCausalLM", "mixtral": "MixtralForCausalLM", "olmoe": "OlmoeForCausalLM"}


def _check_convertible(cfg: MoEConfig) -> None:
    arch = cfg.hf_architecture
    problems = []
    if cfg.n_shared_experts:
        problems.append("ungated shared experts")
    if arch != "Qwen3MoeForCausalLM" and cfg.dense_layers:
        problems.append("dense layers")
    want_norm = {"Qwen3MoeForCausalLM": "head", "MixtralForCausalLM": None, "OlmoeForCausalLM": "full"}[arch]
    if cfg.qk_norm != want_norm:
        problems.append(f"qk_norm {cfg.qk_norm!r} (it has {want_norm!r})")
    if arch == "MixtralForCausalLM" and not cfg.norm_topk_prob:
        problems.append("top-k probabilities not renormalised")
    if arch == "OlmoeForCausalLM" and cfg.head_dim * cfg.n_heads != cfg.hidden_size:
        problems.append("a head_dim apart from hidden_size / n_heads")
    if problems:
        raise ValueError(f"{arch} has no model with {', '.join(problems)}")


def hf_config(cfg: MoEConfig):
    """transformers' config of ``cfg.hf_architecture`` with the same shape (SDPA attention, no dropout, the
    router logits returned and the aux loss added where ``router_aux_loss_coef`` is not 0)."""
    import transformers

    _check_convertible(cfg)
    arch = cfg.hf_architecture
    common = dict(vocab_size=cfg.padded_vocab_size, hidden_size=cfg.hidden_size, num_hidden_layers=cfg.n_layers,
                  num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.n_kv_heads, hidden_act="silu",
                  max_position_embeddings=cfg.seq_len, rms_norm_eps=cfg.rms_norm_eps,
                  rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
                  tie_word_embeddings=cfg.tie_embeddings, attention_dropout=0.0, use_cache=False,
                  num_experts_per_tok=cfg.experts_per_token, router_aux_loss_coef=cfg.router_aux_loss_coef,
                  output_router_logits=cfg.router_aux_loss_coef > 0, pad_token_id=None, bos_token_id=None,
                  eos_token_id=None)
    if arch == "Qwen3MoeForCausalLM":
        hf = transformers.Qwen3MoeConfig(**common, head_dim=cfg.head_dim, num_experts=cfg.n_experts,
                                         moe_intermediate_size=cfg.expert_ffn_hidden_size,
                                         intermediate_size=cfg.ffn_hidden_size or cfg.expert_ffn_hidden_size,
                                         norm_topk_prob=cfg.norm_topk_prob, decoder_sparse_step=1,
                                         mlp_only_layers=list(cfg.dense_layers), attention_bias=False,
                                         use_sliding_window=False)
    elif arch == "MixtralForCausalLM":
        hf = transformers.MixtralConfig(**common, head_dim=cfg.head_dim, num_local_experts=cfg.n_experts,
                                        intermediate_size=cfg.expert_ffn_hidden_size, router_jitter_noise=0.0,
                                        sliding_window=None)
    else:
        hf = transformers.OlmoeConfig(**common, num_experts=cfg.n_experts, intermediate_size=cfg.expert_ffn_hidden_size,
                                      norm_topk_prob=cfg.norm_topk_prob, clip_qkv=None, attention_bias=False)
    hf._attn_implementation = "sdpa"
    return hf


def state_map(cfg: MoEConfig) -> StateMap:
    """Our names onto the transformers model's: the decoder under ``model.``, the fused projections split (a
    dense layer's MLP is ``ffn_hidden_size`` wide), the router theirs ``mlp.gate``."""
    q, kv = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    return StateMap(prefix="model.", fused=rotary_fused(q, kv, cfg.ffn_hidden_size),
                    renamed=(("mlp.router.", "mlp.gate."),))


def hf_class(name: str, arch: str):
    """One of transformers' classes of ``arch``'s module, by its suffix (``DecoderLayer``, ``RotaryEmbedding``)."""
    import importlib

    module = importlib.import_module(f"transformers.models.{_MODULES[arch]}")
    return getattr(module, _PREFIX[arch] + name)


def to_hf(model: MoEModel):
    """transformers' model of ``model.cfg.hf_architecture`` holding a copy of ``model``'s weights."""
    cfg = model.cfg
    return to_hf_model(model, lambda: hf_class("ForCausalLM", cfg.hf_architecture)(hf_config(cfg)), state_map(cfg))


def config_from_hf(c, *, vocab_size: int | None = None) -> MoEConfig:
    """Our config for a transformers Qwen3-MoE, Mixtral or OLMoE config."""
    arch = _ARCH_OF_TYPE.get(c.model_type)
    if arch is None:
        raise ValueError(f"model_type {c.model_type!r} is none of {', '.join(_ARCH_OF_TYPE)}")
    rope = dict(c.rope_parameters)
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"rope_type {rope['rope_type']!r}: only plain RoPE here")
    qwen = arch == "Qwen3MoeForCausalLM"
    # Qwen3-MoE's dense layers: those it lists, and those off its sparse step (its decoder layer's rule)
    dense = tuple(i for i in range(c.num_hidden_layers)
                  if i in c.mlp_only_layers or (i + 1) % c.decoder_sparse_step) if qwen else ()
    n_experts = c.num_local_experts if arch == "MixtralForCausalLM" else c.num_experts
    cfg = MoEConfig(n_layers=c.num_hidden_layers, hidden_size=c.hidden_size, n_heads=c.num_attention_heads,
                    n_kv_heads=c.num_key_value_heads, n_experts=n_experts, experts_per_token=c.num_experts_per_tok,
                    expert_ffn_hidden_size=c.moe_intermediate_size if qwen else c.intermediate_size,
                    ffn_hidden_size=c.intermediate_size if dense else 0,
                    head_dim=getattr(c, "head_dim", None), dense_layers=dense,
                    norm_topk_prob=bool(getattr(c, "norm_topk_prob", True)),
                    router_aux_loss_coef=c.router_aux_loss_coef if c.output_router_logits else 0.0,
                    qk_norm={"Qwen3MoeForCausalLM": "head", "MixtralForCausalLM": None}.get(arch, "full"),
                    vocab_size=vocab_size or c.vocab_size, seq_len=c.max_position_embeddings,
                    rope_theta=rope["rope_theta"], rms_norm_eps=c.rms_norm_eps,
                    tie_embeddings=bool(c.tie_word_embeddings), hf_architecture=arch)
    return keeping_source_rows(cfg, c.vocab_size)


def from_hf(hf_model, *, vocab_size: int | None = None) -> MoEModel:
    """Our model holding a copy of a transformers MoE model's weights."""
    cfg = config_from_hf(hf_model.config, vocab_size=vocab_size)
    return from_hf_model(hf_model, lambda: MoEModel(cfg), state_map(cfg))


class HFMoELayer(RotaryLayer):
    """transformers' decoder layer of ``cfg.hf_architecture`` (a MoE layer) as a ``(B, T, h) -> (B, T, h)``
    module, its RoPE computed each call as the whole model would for one layer (``RotaryLayer``). Its weights
    are a MoE block's under transformers' names (``state_map(cfg).layer_names``)."""

    def __init__(self, cfg: MoEConfig):
        config = hf_config(cfg)
        # The experts' kernel the whole model picks by default (PreTrainedModel's dispatch); a lone layer has none
        # set and would run transformers' per-expert loop.
        config._experts_implementation = "grouped_mm"
        index = next(i for i in range(cfg.n_layers) if cfg.is_moe_layer(i))  # a MoE layer, not a dense one
        super().__init__(hf_class("DecoderLayer", cfg.hf_architecture)(config, layer_idx=index),
                         hf_class("RotaryEmbedding", cfg.hf_architecture)(config))
