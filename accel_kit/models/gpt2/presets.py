"""The GPT-2 family's presets, one table, with where each shape comes from (``SOURCES``).

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
  with vocab 70 at sequence 10240 (docs/study.md, "GenSLM").
"""
from __future__ import annotations

from accel_kit.models.gpt2.model import GPTConfig

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

_GPT2 = "GPT-2 as released (Radford et al. 2019, Table 2)"
_GPT3 = "GPT-3 (Brown et al. 2020, Table 2.1)"
_GENSLM = "GenSLM (Zvyagin et al. 2022; ramanathanlab/genslm configs)"
SOURCES: dict[str, str] = {
    "gpt2-debug": "a tiny GPT-2 for tests",
    "gpt2-small": _GPT2, "gpt2-medium": _GPT2, "gpt2-large": _GPT2, "gpt2-xl": _GPT2,
    "gpt2-xl-16h": "GPT-2 XL with 16 heads of 100, as the CS-2 model zoo's gpt2_xl config",
    "gpt3-xl": f"{_GPT3}, 16 heads of 128 as the paper's CS-2 GPT-3 XL", "gpt3-6.7b": _GPT3,
    "gpt3-13b": f"{_GPT3}, width 5120 (d_head 128) as Megatron-LM's 13B",
    "gpt3-30b": "OPT-30B's shape (Zhang et al. 2022, Table 1); the paper names GPT-3 30B without one",
    "genslm-debug": "a tiny GenSLM for tests", "genslm-25m": _GENSLM, "genslm-250m": _GENSLM,
    "genslm-2.5b": _GENSLM, "genslm-25b": _GENSLM,
    "gpt2-13b": "the paper's GenSLM 13B on SN30 and A100",
    "genslm-gpt3-xl": "the paper's CS-2 GenSLM run: GPT-3 XL, vocabulary 70, sequence 10240 (docs/study.md, GenSLM)",
}
