"""MoE presets: the released shapes, each with its source in ``SOURCES``.

Every number is the release's transformers ``config.json`` (hidden_size, num_hidden_layers,
num_attention_heads, num_key_value_heads, head_dim, the expert count and top-k, the expert and dense
widths, vocab_size, rope_theta, rms_norm_eps, max_position_embeddings, norm_topk_prob,
router_aux_loss_coef). The totals ``count_params`` gives, by hand (``tests/test_moe.py`` checks both):

- Mixtral 8x7B: 32 x (attention 41 943 040 + 8 experts x 176 160 768 + router 32 768 + norms 8192)
  + embedding and head 2 x 32000 x 4096 + final norm 4096 = 46 702 792 704 (46.7B); active (2 of 8
  experts) 12 879 925 248 (12.9B).
- Qwen3-30B-A3B: 48 x (attention 18 874 368 + q/k norms 256 + 128 experts x 4 718 592 + router 262 144
  + norms 4096) + 2 x 151936 x 2048 + 2048 = 30 532 122 624 (30.5B); active (8 of 128) 3 353 032 704 (3.3B).
- OLMoE-1B-7B: 16 x (attention 16 777 216 + q/k norms 4096 + 64 experts x 6 291 456 + router 131 072
  + norms 4096) + 2 x 50304 x 2048 + 2048 = 6 919 161 856 (6.9B); active (8 of 64) 1 282 017 280 (1.3B).

``moe-debug`` is ours, for tests on a CPU: three layers of width 64 (4 heads of 16, 2 KV heads, Qwen3's
per-head QK-norm), the first layer dense (width 128), the other two with 8 experts of width 32, top-2
renormalised, a 512-token vocabulary and 256 positions; its aux-loss weight 0.01 is larger than the
releases' so that the tests see the loss move the router.
"""
from __future__ import annotations

from accel_kit.models.moe.config import MoEConfig

PRESETS: dict[str, MoEConfig] = {
    "moe-debug": MoEConfig(n_layers=3, hidden_size=64, n_heads=4, n_kv_heads=2, n_experts=8, experts_per_token=2,
                           expert_ffn_hidden_size=32, ffn_hidden_size=128, dense_layers=(0,), norm_topk_prob=True,
                           router_aux_loss_coef=0.01, qk_norm="head", vocab_size=512, seq_len=256,
                           rope_theta=10000.0, rms_norm_eps=1e-6, hf_architecture="Qwen3MoeForCausalLM"),
    "mixtral-8x7b": MoEConfig(n_layers=32, hidden_size=4096, n_heads=32, n_kv_heads=8, n_experts=8,
                              experts_per_token=2, expert_ffn_hidden_size=14336, norm_topk_prob=True,
                              router_aux_loss_coef=0.02, qk_norm=None, vocab_size=32000, seq_len=32768,
                              rope_theta=1000000.0, rms_norm_eps=1e-5, hf_architecture="MixtralForCausalLM"),
    "qwen3-30b-a3b": MoEConfig(n_layers=48, hidden_size=2048, n_heads=32, n_kv_heads=4, head_dim=128, n_experts=128,
                               experts_per_token=8, expert_ffn_hidden_size=768, norm_topk_prob=True,
                               router_aux_loss_coef=0.001, qk_norm="head", vocab_size=151936, seq_len=40960,
                               rope_theta=1000000.0, rms_norm_eps=1e-6, hf_architecture="Qwen3MoeForCausalLM"),
    "olmoe-1b-7b": MoEConfig(n_layers=16, hidden_size=2048, n_heads=16, n_kv_heads=16, n_experts=64,
                             experts_per_token=8, expert_ffn_hidden_size=1024, norm_topk_prob=False,
                             router_aux_loss_coef=0.01, qk_norm="full", vocab_size=50304, seq_len=4096,
                             rope_theta=10000.0, rms_norm_eps=1e-5, hf_architecture="OlmoeForCausalLM"),
}

SOURCES: dict[str, str] = {
    "moe-debug": "ours: a three-layer test model (one dense layer, two MoE layers of 8 experts, top-2), "
                 "512-token vocabulary, Qwen3's per-head QK-norm",
    "mixtral-8x7b": "Jiang et al. 2024, 'Mixtral of Experts'; the transformers config.json of "
                    "mistralai/Mixtral-8x7B-v0.1: 32 layers, d 4096, 32 heads, 8 KV heads, 8 experts of 14336, "
                    "top-2 (renormalised), vocabulary 32000, rope_theta 1e6, context 32768, "
                    "router_aux_loss_coef 0.02; 46.7B parameters, 12.9B active",
    "qwen3-30b-a3b": "Qwen3 Technical Report (Yang et al. 2025); the transformers config.json of Qwen/Qwen3-30B-A3B: "
                     "48 layers, d 2048, 32 heads of 128, 4 KV heads, 128 experts of 768, top-8 "
                     "(norm_topk_prob true), per-head QK-norm, vocabulary 151936, rope_theta 1e6, context 40960, "
                     "router_aux_loss_coef 0.001, no dense layers; 30.5B parameters, 3.3B active",
    "olmoe-1b-7b": "Muennighoff et al. 2024, 'OLMoE: Open Mixture-of-Experts Language Models'; the transformers "
                   "config.json of allenai/OLMoE-1B-7B-0924: 16 layers, d 2048, 16 heads, 16 KV heads, 64 experts "
                   "of 1024, top-8 (not renormalised), QK-norm over the full projection, vocabulary 50304, "
                   "rope_theta 1e4, context 4096, router_aux_loss_coef 0.01; 6.9B parameters, 1.3B active",
}
