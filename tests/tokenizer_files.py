"""Tiny tokenizer files built in the tests, of both kinds accel-kit reads (no model hub, no Meta files).

* :func:`write_tokenizer_json`: a byte-level BPE trained by the ``tokenizers`` library on a few
  sentences, ``<|end_of_text|>`` its special token (GPT-2's pre-tokenizer, as many files have).
* :func:`write_ranks`: a tiktoken BPE file, ``base64(token) rank`` per line: the 256 single bytes,
  optional filler ranks (to push the vocabulary past uint16), then a few merges.
* :func:`write_llama_style_json`: the same ranks as a tokenizer.json the way Llama 3's is built
  (its regex split, then a byte-level map), to check both kinds give the same ids.
"""
from __future__ import annotations

import base64
from pathlib import Path

SENTENCES = ["Hello world.", "Second document,\nwith two lines.", "Ünïcödé 🙂 and <tags>",
             "The quick brown fox jumps over the lazy dog.", "end.\nnext line\n"]
MERGES = [b"He", b"ll", b"llo", b"Hello", b" w", b"or", b"ld", b" wor", b" world", b".\n", b"ne", b"xt"]


def write_tokenizer_json(path: Path, specials: tuple[str, ...] = ("<|end_of_text|>",), vocab_size: int = 300) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(specials), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(SENTENCES * 3, trainer)
    tokenizer.save(str(path))
    return path


def ranks_of(fillers: int = 0) -> dict[bytes, int]:
    """Single bytes, then ``fillers`` 3-byte tokens no merge can form (no 2-byte token starts or ends
    them), then :data:`MERGES`: so with fillers the merges' ids are the highest."""
    tokens = [bytes([b]) for b in range(256)]
    tokens += [bytes([0xF8 + (i >> 16), (i >> 8) & 0xFF, i & 0xFF]) for i in range(fillers)]
    tokens += MERGES
    return {token: rank for rank, token in enumerate(tokens)}


def write_ranks(path: Path, fillers: int = 0) -> Path:
    lines = [f"{base64.b64encode(token).decode()} {rank}" for token, rank in ranks_of(fillers).items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def _byte_symbols() -> dict[int, str]:
    """The printable character the byte-level BPE writes for each byte (GPT-2's scheme): printable
    Latin-1 bytes stand for themselves, the others for the code points from 256 on."""
    kept = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    symbols = {b: chr(b) for b in kept}
    for offset, b in enumerate(b for b in range(256) if b not in symbols):
        symbols[b] = chr(256 + offset)
    return symbols


def write_llama_style_json(path: Path, pattern: str) -> Path:
    """The ranks of :func:`ranks_of` (no fillers) as a tokenizer.json with Llama 3's pre-tokenizer."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    symbols = _byte_symbols()
    ranks = ranks_of()
    vocab = {"".join(symbols[b] for b in token): rank for token, rank in ranks.items()}
    merges = []
    for token in MERGES:  # each merge's halves: the one split whose both sides are tokens
        cut = next(i for i in range(1, len(token)) if token[:i] in ranks and token[i:] in ranks)
        merges.append(("".join(symbols[b] for b in token[:cut]), "".join(symbols[b] for b in token[cut:])))
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tokenizer.decoder = decoders.ByteLevel()
    n = len(ranks)
    tokenizer.add_special_tokens([AddedToken("<|begin_of_text|>", special=True),
                                  AddedToken("<|end_of_text|>", special=True)])
    assert tokenizer.token_to_id("<|end_of_text|>") == n + 1
    tokenizer.save(str(path))
    return path
