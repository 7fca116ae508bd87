"""The shape of a Llama 3 model: one frozen dataclass, checked when it is made.

Field names are ours (``n_layers``, ``hidden_size`` ...) and map one to one onto transformers'
``LlamaConfig`` (``llama.hf.hf_config``). ``seq_len`` is the context the model is built for
(the size of its RoPE tables); a point's sequence length overrides it.
"""
from __future__ import annotations

from dataclasses import dataclass

from accel_kit.models.common.rope import RopeScaling
from accel_kit.models.family import PaddedVocab


@dataclass(frozen=True)
class LlamaConfig(PaddedVocab):
    """Shape of a Llama 3 model (Dubey et al. 2024, "The Llama 3 Herd of Models", Table 3).

    Args:
        n_layers: decoder layers L.
        hidden_size: model width h.
        n_heads: query heads; head dim = hidden_size / n_heads (128 in every release).
        n_kv_heads: key/value heads (grouped-query attention; 8 in every release).
        ffn_hidden_size: the SwiGLU MLP's inner width (``llama.presets.llama3_ffn_width``).
        vocab_size: the tokenizer's vocabulary (Llama 3's tiktoken BPE: 128256).
        seq_len: context length the RoPE tables are built for.
        rope_theta: RoPE base frequency (Llama 3: 500000).
        rope_scaling: Llama 3.1's frequency scaling, or None for plain RoPE.
        rms_norm_eps: RMSNorm epsilon.
        tie_embeddings: the output projection shares the token embedding (Llama 3.2 1B, 3B).
        pad_vocab_multiple: embedding rows padded up to a multiple of this (faster matmuls).
        dropout: Llama is trained without dropout; only 0.0 is accepted.
    """

    n_layers: int
    hidden_size: int
    n_heads: int
    n_kv_heads: int
    ffn_hidden_size: int
    vocab_size: int = 128256
    seq_len: int = 131072
    rope_theta: float = 500000.0
    rope_scaling: RopeScaling | None = None
    rms_norm_eps: float = 1e-5
    tie_embeddings: bool = False
    pad_vocab_multiple: int = 1
    dropout: float = 0.0

    def __post_init__(self) -> None:
        for name in ("n_layers", "hidden_size", "n_heads", "n_kv_heads", "ffn_hidden_size", "vocab_size",
                     "seq_len", "pad_vocab_multiple"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)}")
        if self.hidden_size % self.n_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not a multiple of n_heads {self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads {self.n_heads} is not a multiple of n_kv_heads {self.n_kv_heads} "
                             f"(each key/value head serves a whole group of query heads)")
        if self.head_dim % 2:
            raise ValueError(f"head dim {self.head_dim} (hidden_size {self.hidden_size} / n_heads {self.n_heads}) "
                             f"is odd; RoPE rotates pairs of dimensions")
        if self.dropout != 0.0:
            raise ValueError(f"dropout {self.dropout}: Llama has no dropout, only 0.0 is accepted")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.n_heads
