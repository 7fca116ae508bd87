"""Conversion between our ``MoEModel`` and transformers' ``Qwen3MoeForCausalLM``, ``MixtralForCausalLM`` and
``OlmoeForCausalLM`` (the config's ``hf_architecture`` says which).

The three store the same weights under the same names but for our fused projections (``qkv_proj``; a dense
layer's ``gate_up_proj``: split as ``accel_kit.models.llama.hf.split_fused`` does) and the router (ours
``mlp.router``, theirs ``mlp.gate``); the experts' 3-D tensors have their names and layout. Each class
fixes what the config may hold: Qwen3-MoE per-head QK-norm and dense layers (``mlp_only_layers``),
Mixtral no QK-norm and always renormalised top-k, OLMoE QK-norm over the whole projections; none has
ungated shared experts, so a config with them has no transformers model here.
"""
from __future__ import annotations

from dataclasses import replace

import torch

from accel_kit.models.init import allocated, transformers_uninitialised
from accel_kit.models.llama.hf import split_fused
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


def to_hf_names(state: dict[str, torch.Tensor], cfg: MoEConfig) -> dict[str, torch.Tensor]:
    """A block's or a model's state under transformers' names within a decoder layer (no ``model.`` prefix)."""
    return {name.replace("mlp.router.", "mlp.gate."): t for name, t in split_fused(state, cfg).items()}


def to_hf_state(state: dict[str, torch.Tensor], cfg: MoEConfig) -> dict[str, torch.Tensor]:
    """Our model's state dict under the transformers model's names (the decoder under ``model.``)."""
    return {name if name == "lm_head.weight" else f"model.{name}": t for name, t in to_hf_names(state, cfg).items()}


def from_hf_state(hf_state: dict[str, torch.Tensor], cfg: MoEConfig) -> dict[str, torch.Tensor]:
    """transformers' state dict under our names, the split projections concatenated."""
    out = {}
    for i in range(cfg.n_layers):
        hf, ours = f"model.layers.{i}.", f"layers.{i}."
        out[ours + "self_attn.qkv_proj.weight"] = torch.cat(
            [hf_state[f"{hf}self_attn.{p}.weight"] for p in ("q_proj", "k_proj", "v_proj")])
        names = ["input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.o_proj.weight"]
        if cfg.qk_norm is not None:
            names += ["self_attn.q_norm.weight", "self_attn.k_norm.weight"]
        if cfg.is_moe_layer(i):
            out[ours + "mlp.router.weight"] = hf_state[hf + "mlp.gate.weight"]
            names += ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
        else:
            out[ours + "mlp.gate_up_proj.weight"] = torch.cat([hf_state[f"{hf}mlp.{p}.weight"]
                                                               for p in ("gate_proj", "up_proj")])
            names.append("mlp.down_proj.weight")
        out.update({ours + n: hf_state[hf + n] for n in names})
    out["embed_tokens.weight"] = hf_state["model.embed_tokens.weight"]
    out["norm.weight"] = hf_state["model.norm.weight"]
    out["lm_head.weight"] = hf_state.get("lm_head.weight", hf_state["model.embed_tokens.weight"])
    return out


def hf_class(name: str, arch: str):
    """One of transformers' classes of ``arch``'s module, by its suffix (``DecoderLayer``, ``RotaryEmbedding``)."""
    import importlib

    module = importlib.import_module(f"transformers.models.{_MODULES[arch]}")
    return getattr(module, _PREFIX[arch] + name)


def to_hf(model: MoEModel):
    """transformers' model of ``model.cfg.hf_architecture`` holding a copy of ``model``'s weights."""
    cfg = model.cfg
    # every weight copied from ours
    hf = transformers_uninitialised(lambda: hf_class("ForCausalLM", cfg.hf_architecture)(hf_config(cfg)))
    hf_state = hf.state_dict()
    with torch.no_grad():
        for key, value in to_hf_state(model.state_dict(), cfg).items():
            hf_state[key].copy_(value)
    return hf


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
    if cfg.padded_vocab_size != c.vocab_size:
        cfg = replace(cfg, pad_vocab_multiple=c.vocab_size)  # keep every embedding row of the source
    return cfg


def from_hf(hf_model, *, vocab_size: int | None = None) -> MoEModel:
    """Our model holding a copy of a transformers MoE model's weights."""
    cfg = config_from_hf(hf_model.config, vocab_size=vocab_size)
    model = allocated(lambda: MoEModel(cfg), hf_model.device)  # no draws: every weight is copied from the source
    state = model.state_dict()
    with torch.no_grad():
        for name, value in from_hf_state(hf_model.state_dict(), cfg).items():
            state[name].copy_(value)
    return model


class HFMoELayer(torch.nn.Module):
    """transformers' decoder layer of ``cfg.hf_architecture`` (a MoE layer) as a ``(B, T, h) -> (B, T, h)``
    module, its RoPE computed each call as the whole model would for one layer; SDPA, causal (no mask).
    Its weights are a MoE block's under transformers' names (``to_hf_names``)."""

    def __init__(self, cfg: MoEConfig):
        super().__init__()
        config = hf_config(cfg)
        # The experts' kernel the whole model picks by default (PreTrainedModel's dispatch); a lone layer has none
        # set and would run transformers' per-expert loop.
        config._experts_implementation = "grouped_mm"
        index = next(i for i in range(cfg.n_layers) if cfg.is_moe_layer(i))  # a MoE layer, not a dense one
        self.layer = hf_class("DecoderLayer", cfg.hf_architecture)(config, layer_idx=index)
        self.rotary_emb = hf_class("RotaryEmbedding", cfg.hf_architecture)(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(x.shape[1], device=x.device)[None]  # (1, T)
        out = self.layer(x, position_embeddings=self.rotary_emb(x, positions), position_ids=positions)
        return out[0] if isinstance(out, tuple) else out
