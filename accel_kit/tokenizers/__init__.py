"""Tokenizers by name: the GPT-2 BPE for text and GenSLM's codon vocabularies for genomes.

    >>> tok = load_tokenizer("gpt2")
    >>> tok.encode("Hello world")
    [15496, 995]
    >>> load_tokenizer("codon-71").encode("ATGGCC")     # [BOS] ATG GCC [EOS]
    [2, 12, 8, 3]

Every tokenizer has ``name``, ``vocab_size``, ``eos_id``, ``pad_id``, ``encode(text)``,
``encode_batch(texts)`` and ``decode(ids)`` (see :class:`TokenizerLike`).
"""
from __future__ import annotations

import functools

from accel_kit.errors import ParameterError
from accel_kit.tokenizers.base import TokenizerLike
from accel_kit.tokenizers.codon import CODONS, CodonTokenizer
from accel_kit.tokenizers.gpt2 import GPT2Tokenizer

#: Names accepted by :func:`load_tokenizer`.
TOKENIZER_NAMES: tuple[str, ...] = ("gpt2", "codon-69", "codon-71")


@functools.lru_cache(maxsize=None)
def load_tokenizer(name: str) -> TokenizerLike:
    """The tokenizer registered under ``name`` (built once per process, then shared).

    Args:
        name: one of :data:`TOKENIZER_NAMES`.

    Raises:
        ParameterError: unknown name.
    """
    if name == "gpt2":
        return GPT2Tokenizer()
    if name in ("codon-69", "codon-71"):
        return CodonTokenizer(name)
    raise ParameterError(f"unknown tokenizer {name!r}; choose one of {', '.join(TOKENIZER_NAMES)}")


__all__ = ["CODONS", "CodonTokenizer", "GPT2Tokenizer", "TOKENIZER_NAMES", "TokenizerLike", "load_tokenizer"]
