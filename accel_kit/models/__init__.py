"""Models: the GPT-2 block (microbenchmark) and the GPT model zoo built from it."""
from accel_kit.models.block import Block, BlockConfig

__all__ = ["Block", "BlockConfig"]
