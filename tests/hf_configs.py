"""Tiny transformers configs written by the tests with transformers' own config classes (no download), and the
active weights a token multiplies in each, by hand from the config's attributes (not from accel-kit's table)."""
from __future__ import annotations

from pathlib import Path

H, HEADS, KV_HEADS, HEAD_DIM, LAYERS, VOCAB = 64, 4, 2, 16, 2, 256
# Token ids inside the vocabulary (some classes default to ids of their released tokenizers).
_BASE = dict(hidden_size=H, num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
             vocab_size=VOCAB, max_position_embeddings=64, bos_token_id=0, eos_token_id=1, pad_token_id=None)
MOE_ARCHITECTURES = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "deepseek_v3", "gpt_oss")


def moe_config(name: str, **changes):
    """A tiny config of architecture ``name`` (top-2 routing; widths multiples of 8, as released shapes' are),
    ``changes`` set last."""
    import transformers as t

    cls, fields = {
        "mixtral": (t.MixtralConfig, dict(intermediate_size=96, num_local_experts=4, sliding_window=None)),
        # a shared expert of twice a routed one's width, behind its sigmoid gate
        "qwen2_moe": (t.Qwen2MoeConfig, dict(intermediate_size=128, moe_intermediate_size=32, num_experts=8,
                                             shared_expert_intermediate_size=64)),
        "qwen3_moe": (t.Qwen3MoeConfig, dict(head_dim=HEAD_DIM, intermediate_size=128, moe_intermediate_size=32,
                                             num_experts=8)),
        "olmoe": (t.OlmoeConfig, dict(intermediate_size=32, num_experts=8)),
        # MLA (every head its own keys), one dense layer first, a shared expert, group-limited routing (2 of 4)
        "deepseek_v3": (t.DeepseekV3Config, dict(
            num_key_value_heads=HEADS, intermediate_size=128, moe_intermediate_size=32, n_routed_experts=8,
            n_shared_experts=1, first_k_dense_replace=1, n_group=2, topk_group=1, q_lora_rank=32, kv_lora_rank=16,
            qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16)),
        # biased experts and router, attention sinks, a sliding-window layer and a full one (plain RoPE: its
        # YaRN scaling is for its released 131072 positions)
        "gpt_oss": (t.GptOssConfig, dict(head_dim=HEAD_DIM, intermediate_size=32, num_local_experts=4,
                                         sliding_window=16,
                                         rope_parameters={"rope_type": "default", "rope_theta": 150000.0})),
    }[name]
    return cls(**(_BASE | {"num_experts_per_tok": 2} | fields | changes))


def write(folder: Path, hf_config) -> str:
    """``hf_config`` saved as ``folder/config.json``; returns the preset naming it."""
    hf_config.save_pretrained(folder)
    return f"hf:{folder}"


def active_weights(name: str, hf) -> int:
    """Weights one token multiplies in the decoder layers (biases not: the counter counts products alone):
    attention projections, router, top-k routed experts (3 H F each: gate, up, down), shared experts and their
    gate, and the dense MLP of a layer without experts."""
    h = hf.hidden_size
    if name == "deepseek_v3":  # multi-head latent attention: low-rank queries, a shared compressed key/value
        heads, qk = hf.num_attention_heads, hf.qk_nope_head_dim + hf.qk_rope_head_dim
        attention = (h * hf.q_lora_rank + hf.q_lora_rank * heads * qk + h * (hf.kv_lora_rank + hf.qk_rope_head_dim)
                     + hf.kv_lora_rank * heads * (hf.qk_nope_head_dim + hf.v_head_dim) + heads * hf.v_head_dim * h)
    else:
        q, kv = hf.num_attention_heads * HEAD_DIM, hf.num_key_value_heads * HEAD_DIM
        attention = h * q + 2 * h * kv + q * h
    experts = getattr(hf, "num_local_experts", None) or getattr(hf, "num_experts", None)
    width = getattr(hf, "moe_intermediate_size", None) or hf.intermediate_size
    moe = attention + h * experts + hf.num_experts_per_tok * 3 * h * width
    if name == "qwen2_moe":
        moe += 3 * h * hf.shared_expert_intermediate_size + h  # the shared expert and its gate (h -> 1)
    if name == "deepseek_v3":
        moe += hf.n_shared_experts * 3 * h * width
        dense = hf.first_k_dense_replace
        return dense * (attention + 3 * h * hf.intermediate_size) + (hf.num_hidden_layers - dense) * moe
    return hf.num_hidden_layers * moe
