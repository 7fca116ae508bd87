"""Tokenizers by name: the GPT-2 BPE for text and GenSLM's codon vocabularies for genomes.

    >>> tok = load_tokenizer("gpt2")
    >>> tok.encode("Hello world")
    [15496, 995]
    >>> load_tokenizer("codon-71").encode("ATGGCC")     # [BOS] ATG GCC [EOS]
    [2, 12, 8, 3]

Every tokenizer has ``name``, ``vocab_size``, ``eos_id``, ``pad_id``, ``encode(text)``,
``encode_batch(texts)`` and ``decode(ids)`` (see :class:`TokenizerLike`).

A path instead of a name loads the tokenizer in that file: a Hugging Face ``tokenizer.json``
or a tiktoken BPE file such as Llama 3's ``tokenizer.model`` (:mod:`accel_kit.tokenizers.files`).
"""
from __future__ import annotations

import functools
import os

from accel_kit.errors import ParameterError
from accel_kit.tokenizers.base import TokenizerLike
from accel_kit.tokenizers.codon import CODONS, CodonTokenizer
from accel_kit.tokenizers.gpt2 import GPT2Tokenizer

#: Names accepted by :func:`load_tokenizer`.
TOKENIZER_NAMES: tuple[str, ...] = ("gpt2", "codon-69", "codon-71")


def load_tokenizer(name: str | os.PathLike) -> TokenizerLike:
    """The tokenizer registered under ``name``, or the one in the file ``name`` names.

    Args:
        name: one of :data:`TOKENIZER_NAMES` (built once per process, then shared), or the path
            of a ``tokenizer.json`` or tiktoken BPE file (read on every call: the file may change).

    Raises:
        ParameterError: neither a registered name nor a file's path.
        DataError: a missing or unreadable file, one of neither format, or one without an
            end-of-text token.
        UnavailableError: a tiktoken file when tiktoken is not installed.
    """
    name = os.fspath(name)
    if name in TOKENIZER_NAMES:
        return _registered(name)
    from accel_kit.tokenizers.files import load_file_tokenizer, looks_like_path

    if looks_like_path(name) or os.path.exists(name):
        return load_file_tokenizer(name)
    raise ParameterError(f"unknown tokenizer {name!r}; choose one of {', '.join(TOKENIZER_NAMES)}, or give the "
                         f"path of a tokenizer file (a tokenizer.json, or a tiktoken file such as Llama 3's "
                         f"tokenizer.model)")


@functools.lru_cache(maxsize=None)
def _registered(name: str) -> TokenizerLike:
    if name == "gpt2":
        return GPT2Tokenizer()
    return CodonTokenizer(name)


__all__ = ["CODONS", "CodonTokenizer", "GPT2Tokenizer", "TOKENIZER_NAMES", "TokenizerLike", "load_tokenizer"]
