"""Models: the GPT-2 block (microbenchmark) and the GPT model zoo built from it.

    from accel_kit.models import PRESETS, build_model, count_params
    model = build_model("gpt2-xl", seq_len=2048)
"""
from accel_kit.models.block import Block, BlockConfig
from accel_kit.models.gpt import GPT, IGNORE_INDEX, GPTConfig
from accel_kit.models.memory import MemoryEstimate, estimate_training_memory, fits
from accel_kit.models.presets import PRESETS, build_model, count_params, get_config

__all__ = ["Block", "BlockConfig", "GPT", "GPTConfig", "IGNORE_INDEX", "PRESETS", "build_model", "count_params",
           "get_config", "MemoryEstimate", "estimate_training_memory", "fits"]
