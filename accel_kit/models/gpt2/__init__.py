"""The GPT-2 family: GPT-2, the GPT-3 shapes and GenSLM's genome models (one architecture)."""
from accel_kit.models.gpt2.block import Block, BlockConfig
from accel_kit.models.gpt2.family import GPT2
from accel_kit.models.gpt2.model import GPT, GPTConfig

FAMILY = GPT2()

__all__ = ["FAMILY", "GPT", "GPT2", "GPTConfig", "Block", "BlockConfig"]
