"""Named model shapes, one table; ``build_model`` and ``count_params`` take a name and overrides.

Sources:
- GPT-2 (Radford et al. 2019, Table 2; shapes as released): small 12/12/768 ... XL 48/25/1600.
  gpt2-xl-16h: the same model with 16 heads of 100, as the Cerebras ModelZoo's gpt2_xl config
  has it (its CS-2 runs); parameters and FLOPs are those of gpt2-xl.
- GPT-3 (Brown et al. 2020, Table 2.1): XL 24 layers, d 2048 (its 24 heads of 128 do not
  tile 2048; we use 16 heads of 128, as Cerebras-GPT 1.3B and the paper's CS-2 GPT-3 XL do);
  6.7B 32/32/4096;
  13B 40 layers, 40 heads, d 5140 in the table, which is not divisible by 40: we use 5120
  (d_head 128), as Megatron-LM and Cerebras-GPT 13B do.
- GPT-3 30B: not a size in Brown et al.; the paper's sparsity study names it without a
  shape, so we use OPT-30B's (Zhang et al. 2022, Table 1): 48 layers, 56 heads, d 7168.
- gpt2-13b: the paper's GenSLM 13B on SN30/A100 (44 layers, 64 heads, d 4992, vocab 71).
- GenSLM (Zvyagin et al. 2022; ramanathanlab/genslm configs, vocab 69): 25M 8/8/512,
  250M 16/16/1152, 2.5B 30/32/2624, 25B 64/64/5760; the CS-2 GPT-3 XL variant 24/16/2048
  with vocab 70 at sequence 10240 (docs/study.md, Study 3).
"""
from __future__ import annotations

from typing import Any

import torch

from accel_kit.errors import ParameterError
from accel_kit.models.gpt import GPT, GPTConfig

GPT2_VOCAB = 50257

PRESETS: dict[str, GPTConfig] = {
    # GPT-2 family, text, GPT-2 BPE
    "gpt2-debug": GPTConfig(n_layers=2, n_heads=4, hidden_size=64, vocab_size=GPT2_VOCAB, seq_len=256),
    "gpt2-small": GPTConfig(12, 12, 768, GPT2_VOCAB, 1024),
    "gpt2-medium": GPTConfig(24, 16, 1024, GPT2_VOCAB, 1024),
    "gpt2-large": GPTConfig(36, 20, 1280, GPT2_VOCAB, 1024),
    "gpt2-xl": GPTConfig(48, 25, 1600, GPT2_VOCAB, 1024),
    "gpt2-xl-16h": GPTConfig(48, 16, 1600, GPT2_VOCAB, 1024),  # the Cerebras ModelZoo's GPT-2 XL
    "gpt3-xl": GPTConfig(24, 16, 2048, GPT2_VOCAB, 2048),
    "gpt3-6.7b": GPTConfig(32, 32, 4096, GPT2_VOCAB, 2048),
    "gpt3-13b": GPTConfig(40, 40, 5120, GPT2_VOCAB, 2048),
    "gpt3-30b": GPTConfig(48, 56, 7168, GPT2_VOCAB, 2048),
    # genome models, codon tokenizers (69 or 71 tokens; 70 for the CS-2 GPT-3 XL run)
    "genslm-debug": GPTConfig(n_layers=2, n_heads=4, hidden_size=64, vocab_size=71, seq_len=2048),
    "genslm-25m": GPTConfig(8, 8, 512, 69, 2048),
    "genslm-250m": GPTConfig(16, 16, 1152, 69, 2048),
    "genslm-2.5b": GPTConfig(30, 32, 2624, 69, 2048),
    "genslm-25b": GPTConfig(64, 64, 5760, 69, 2048),
    "gpt2-13b": GPTConfig(44, 64, 4992, 71, 1024),
    "genslm-gpt3-xl": GPTConfig(24, 16, 2048, 70, 10240),
}

# Overrides build_model/count_params accept: GPTConfig fields other than the shape itself.
OVERRIDABLE = ("vocab_size", "seq_len", "pad_vocab_multiple", "dropout", "narrow_linear_fast_path")


def get_config(preset: str, **overrides: Any) -> GPTConfig:
    """The preset's config with ``overrides`` (vocab_size, seq_len, pad_vocab_multiple, dropout)."""
    try:
        cfg = PRESETS[preset]
    except KeyError:
        raise ParameterError(f"unknown model preset {preset!r}; known: {', '.join(PRESETS)}") from None
    bad = sorted(set(overrides) - set(OVERRIDABLE))
    if bad:
        raise ParameterError(f"model override {bad[0]!r} not allowed; allowed: {', '.join(OVERRIDABLE)}")
    return cfg.replace(**{k: v for k, v in overrides.items() if v is not None})


def build_model(preset: str, *, activation_checkpointing: bool = False, device: torch.device | str | None = None,
                **overrides: Any) -> GPT:
    """Instantiate a preset (randomly initialised, GPT-2 init)."""
    cfg = get_config(preset, **overrides)
    with torch.device(device or "cpu"):
        return GPT(cfg, activation_checkpointing=activation_checkpointing)


def count_params(preset: str, **overrides: Any) -> int:
    """Parameter count without allocating memory (the model is built on the meta device)."""
    cfg = get_config(preset, **overrides)
    with torch.device("meta"):
        return GPT(cfg).num_params()
