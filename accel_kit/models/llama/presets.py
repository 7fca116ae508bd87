"""Llama 3 presets: the released shapes, each with its source in ``SOURCES``.

Every release (Dubey et al. 2024, "The Llama 3 Herd of Models", Table 3 for 8B/70B/405B; Meta's
Llama 3.2 model card for 1B/3B) shares: no biases, RMSNorm eps 1e-5, SwiGLU, grouped-query
attention with 8 key/value heads, vocabulary 128256 (tiktoken's 128000 plus 256 special
tokens), RoPE theta 500000 with Llama 3.1's frequency scaling (transformers' rope_type
"llama3": low_freq_factor 1, high_freq_factor 4, original_max_position_embeddings 8192;
factor 8 for 3.1, 32 for 3.2) and a context of 131072. Head dim is 128, except Llama 3.2 1B's
64 (2048 / 32 heads). The FFN widths are Meta's rule (``llama3_ffn_width``) on each model's
``ffn_dim_multiplier`` and ``multiple_of`` from its ``params.json``; the table computes them.

``llama3-debug`` is ours, for tests on a CPU: two layers of width 64 (4 heads of 16, 2 KV heads),
a 512-token vocabulary and RoPE scaling with 3.2's factor 32 from an "original" context of 64
positions, so that its 256 positions run past that context and its 8 frequencies fall in all
three bands of the scaling (kept, blended, stretched).
"""
from __future__ import annotations

from accel_kit.models.common.rope import RopeScaling
from accel_kit.models.llama.config import LlamaConfig

LLAMA3_VOCAB = 128256
LLAMA3_CONTEXT = 131072  # max_position_embeddings of every 3.1 and 3.2 release
LLAMA31_ROPE = RopeScaling(factor=8.0)  # low 1, high 4, original 8192: the RopeScaling defaults
LLAMA32_ROPE = RopeScaling(factor=32.0)
DEBUG_ROPE = RopeScaling(factor=32.0, original_max_position=64)  # wavelengths under 16 kept, over 64 stretched


def llama3_ffn_width(hidden: int, ffn_dim_multiplier: float | None, multiple_of: int) -> int:
    """Meta's SwiGLU width rule (llama-models' ``FeedForward``): 2/3 of 4h, scaled, rounded up.

    SwiGLU has three matrices instead of two, so Meta takes 2/3 of the classic 4h to keep the
    MLP's parameters about 8 h^2; then the model's ``ffn_dim_multiplier`` scales it and the
    result is rounded *up* to a multiple of ``multiple_of`` (for efficient GEMM tiles).
    Each step truncates to an integer as Meta's code does.
    """
    width = int(2 * (4 * hidden) / 3)
    if ffn_dim_multiplier is not None:
        width = int(ffn_dim_multiplier * width)
    return multiple_of * ((width + multiple_of - 1) // multiple_of)


def _release(n_layers: int, hidden: int, n_heads: int, multiplier: float, multiple_of: int, *,
             tied: bool, rope: RopeScaling) -> LlamaConfig:
    return LlamaConfig(n_layers=n_layers, hidden_size=hidden, n_heads=n_heads, n_kv_heads=8,
                       ffn_hidden_size=llama3_ffn_width(hidden, multiplier, multiple_of), vocab_size=LLAMA3_VOCAB,
                       seq_len=LLAMA3_CONTEXT, rope_scaling=rope, tie_embeddings=tied)


PRESETS: dict[str, LlamaConfig] = {
    "llama3-debug": LlamaConfig(n_layers=2, hidden_size=64, n_heads=4, n_kv_heads=2,
                                ffn_hidden_size=llama3_ffn_width(64, 1.5, 256), vocab_size=512, seq_len=256,
                                rope_scaling=DEBUG_ROPE, tie_embeddings=True),
    # A GPT-2-small-sized Llama 3 for CPU benchmarks (benchmarks/train_vs_hf.py): the released vocabulary and RoPE.
    "llama3-small": LlamaConfig(n_layers=12, hidden_size=768, n_heads=12, n_kv_heads=4,
                                ffn_hidden_size=llama3_ffn_width(768, 1.0, 256), vocab_size=LLAMA3_VOCAB,
                                seq_len=LLAMA3_CONTEXT, rope_scaling=LLAMA31_ROPE, tie_embeddings=True),
    # layers, hidden, heads, ffn_dim_multiplier, multiple_of -> FFN 8192, 8192, 14336, 28672, 53248
    "llama3.2-1b": _release(16, 2048, 32, 1.5, 256, tied=True, rope=LLAMA32_ROPE),
    "llama3.2-3b": _release(28, 3072, 24, 1.0, 256, tied=True, rope=LLAMA32_ROPE),
    "llama3.1-8b": _release(32, 4096, 32, 1.3, 1024, tied=False, rope=LLAMA31_ROPE),
    "llama3.1-70b": _release(80, 8192, 64, 1.3, 4096, tied=False, rope=LLAMA31_ROPE),
    "llama3.1-405b": _release(126, 16384, 128, 1.2, 4096, tied=False, rope=LLAMA31_ROPE),
}

_META = "Meta's params.json (dim, n_layers, n_heads, n_kv_heads, ffn_dim_multiplier, multiple_of) and the " \
        "transformers config.json of meta-llama/"
SOURCES: dict[str, str] = {
    "llama3-debug": "ours: a two-layer test model, 512-token vocabulary, RoPE scaling by 32 beyond 64 positions",
    "llama3-small": "ours, not a released model: GPT-2 small's 12 layers of 768 with 12 heads over 4 KV heads, "
                    "Meta's FFN rule (multiplier 1.0, multiple 256), the released vocabulary and RoPE, tied",
    "llama3.2-1b": _META + "Llama-3.2-1B: 16 layers, d 2048, 32 heads (of 64), 8 KV heads, multiplier 1.5 / "
                           "multiple 256 (FFN 8192), tied embeddings, RoPE factor 32",
    "llama3.2-3b": _META + "Llama-3.2-3B: 28 layers, d 3072, 24 heads, 8 KV heads, multiplier 1.0 / multiple 256 "
                           "(FFN 8192), tied embeddings, RoPE factor 32",
    "llama3.1-8b": "Dubey et al. 2024, Table 3; " + _META + "Llama-3.1-8B: 32 layers, d 4096, 32 heads, 8 KV heads, "
                   "multiplier 1.3 / multiple 1024 (FFN 14336), RoPE factor 8",
    "llama3.1-70b": "Dubey et al. 2024, Table 3; " + _META + "Llama-3.1-70B: 80 layers, d 8192, 64 heads, 8 KV heads, "
                    "multiplier 1.3 / multiple 4096 (FFN 28672), RoPE factor 8",
    "llama3.1-405b": "Dubey et al. 2024, Table 3; " + _META + "Llama-3.1-405B: 126 layers, d 16384, 128 heads, "
                     "8 KV heads, multiplier 1.2 / multiple 4096 (FFN 53248), RoPE factor 8",
}
