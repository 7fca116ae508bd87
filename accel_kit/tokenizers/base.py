"""What every accel-kit tokenizer provides, and vocabulary padding for models."""
from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable


@runtime_checkable
class TokenizerLike(Protocol):
    """The interface shared by the GPT-2 BPE and the codon tokenizers.

    Attributes:
        name: registry name (``gpt2``, ``codon-69``, ``codon-71``).
        vocab_size: number of token ids (ids are ``0 .. vocab_size - 1``).
        eos_id: id appended after each document / record when data is prepared.
        pad_id: id used to pad fixed-length rows.
    """

    name: str
    vocab_size: int
    eos_id: int
    pad_id: int

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str: ...

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = True) -> list[list[int]]: ...


def padded_vocab_size(vocab_size: int, multiple: int = 64) -> int:
    """Round a vocabulary size up to a multiple, for embedding tables that tile well.

    GPT-2's 50257 becomes 50304 with ``multiple=64`` (the nanoGPT / Megatron trick: matmuls
    whose dimensions are multiples of 64 map onto tensor cores and systolic arrays without
    ragged edges). The extra ids are never produced by the tokenizer.

    Args:
        vocab_size: the tokenizer's vocabulary size (> 0).
        multiple: the granularity to round up to (> 0).

    Returns:
        The smallest multiple of ``multiple`` that is >= ``vocab_size``.
    """
    if vocab_size <= 0 or multiple <= 0:
        raise ValueError(f"vocab_size and multiple must be positive, got {vocab_size}, {multiple}")
    return -(-vocab_size // multiple) * multiple
