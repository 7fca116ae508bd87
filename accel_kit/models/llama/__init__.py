"""The Llama 3 family: config, presets, model, RoPE, transformers conversion and its ``Family``.

    from accel_kit.models.llama import FAMILY, PRESETS
    model = FAMILY.build(FAMILY.with_overrides(PRESETS["llama3.1-8b"], seq_len=8192))
"""
from accel_kit.models.common.norm import RMSNorm
from accel_kit.models.common.rope import RopeScaling
from accel_kit.models.family import IGNORE_INDEX
from accel_kit.models.llama.config import LlamaConfig
from accel_kit.models.llama.family import Llama3
from accel_kit.models.llama.model import Llama, LlamaBlock
from accel_kit.models.llama.presets import PRESETS, SOURCES, llama3_ffn_width

FAMILY = Llama3()

__all__ = ["FAMILY", "IGNORE_INDEX", "Llama", "Llama3", "LlamaBlock", "LlamaConfig", "PRESETS", "RMSNorm",
           "RopeScaling", "SOURCES", "llama3_ffn_width"]
