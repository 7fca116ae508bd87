"""What every accel-kit tokenizer provides."""
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

