"""GenSLM-compatible codon tokenizers (word-level, one token per codon).

GenSLM (Zvyagin et al. 2022) tokenizes genomes into non-overlapping codons with a word-level
vocabulary of special tokens followed by the 64 codons in a fixed order. Two variants exist:

``codon-69``: ``[UNK]`` 0, ``[CLS]`` 1, ``[SEP]`` 2, ``[PAD]`` 3, ``[MASK]`` 4, codons 5..68.
    No BOS/EOS token: ``[SEP]`` (2) separates records in a concatenated stream (``eos_id``).
``codon-71``: ``[UNK]`` 0, ``[CLS]`` 1, ``[BOS]`` 2, ``[EOS]`` 3, ``[SEP]`` 4, ``[PAD]`` 5,
    ``[MASK]`` 6, codons 7..70. A sequence is wrapped as ``[BOS] codons [EOS]``.

Encoding rules (both variants):

* whitespace is removed first, so ``"ATG GCC"`` (GenSLM's space-separated form) and multi-line
  text encode like ``"ATGGCC"``; then the text is upper-cased;
* codons are read without overlap from position 0; a trailing partial codon (1-2 letters) is
  dropped;
* a codon containing any character other than A, C, G, T (N, R, Y, ``-`` ...) becomes ``[UNK]``.

``encode(text)`` applies the wrapping (``add_special_tokens=True``, like a GenSLM / transformers
tokenizer call); ``encode(text, add_special_tokens=False)`` returns the bare codon ids.
``decode`` joins tokens with single spaces (GenSLM's word-level decoding), e.g.
``"[BOS] ATG GCC [EOS]"``; ``skip_special_tokens=True`` leaves only the codons.

The encoder is vectorised with numpy lookup tables (``encode_bytes``) because genome corpora
run to gigabases.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

#: The 64 codons in GenSLM's vocabulary order (identical in both variants).
CODONS: tuple[str, ...] = tuple(
    "GGC GCC ATC GAC GAA ATG GTG CTG GTC GCG GAT AAA GGT AAG GAG ACC AAC GTT ATT GCA CTC CGC "
    "GCT CAG CCG TTC GTA TCG GGA AAT TAC CTT TTG ACG TCC GGG AGC CCC ACA ACT TCT TTA CGT TAT "
    "CAA CGG TTT CAC CCT CCA TGG ATA TCA TGC AGT AGA CAT TGT CTA AGG TAA CGA TGA TAG".split()
)
assert len(CODONS) == 64 and len(set(CODONS)) == 64

SPECIALS_69: tuple[str, ...] = ("[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]")
SPECIALS_71: tuple[str, ...] = ("[UNK]", "[CLS]", "[BOS]", "[EOS]", "[SEP]", "[PAD]", "[MASK]")

_BASES = "ACGT"


def _base_table() -> np.ndarray:
    """Byte -> base index (A0 C1 G2 T3, either case); every other byte -> 4 (invalid)."""
    table = np.full(256, 4, dtype=np.uint8)
    for index, base in enumerate(_BASES):
        table[ord(base)] = index
        table[ord(base.lower())] = index
    return table


_BASE_INDEX = _base_table()


class CodonTokenizer:
    """A word-level codon tokenizer (see the module docstring for the rules).

    Args:
        name: ``"codon-69"`` or ``"codon-71"``.

    Attributes:
        vocab_size: 69 or 71.
        eos_id: ``[EOS]`` (3) for codon-71; ``[SEP]`` (2) for codon-69, which has no EOS and
            uses the separator between records.
        pad_id: ``[PAD]`` (3 or 5).
        unk_id: ``[UNK]`` (0).
        bos_id: ``[BOS]`` (2) for codon-71, ``None`` for codon-69.
        wraps: whether ``encode`` adds ``[BOS]`` / ``[EOS]`` around a sequence.
        vocab: token string -> id.
    """

    def __init__(self, name: str) -> None:
        if name == "codon-69":
            specials = SPECIALS_69
        elif name == "codon-71":
            specials = SPECIALS_71
        else:
            raise ValueError(f"unknown codon tokenizer {name!r}")
        self.name = name
        tokens = list(specials) + list(CODONS)
        self.vocab: dict[str, int] = {token: index for index, token in enumerate(tokens)}
        self._id_to_token = tokens
        self.vocab_size = len(tokens)
        self.unk_id = self.vocab["[UNK]"]
        self.pad_id = self.vocab["[PAD]"]
        self.wraps = "[BOS]" in self.vocab
        self.bos_id = self.vocab["[BOS]"] if self.wraps else None
        self.eos_id = self.vocab["[EOS]"] if self.wraps else self.vocab["[SEP]"]
        self.special_ids = frozenset(range(len(specials)))
        # ACGT index of a codon (16*b0 + 4*b1 + b2) -> token id.
        self._codon_id = np.empty(64, dtype=np.int64)
        for codon in CODONS:
            b0, b1, b2 = (_BASES.index(base) for base in codon)
            self._codon_id[16 * b0 + 4 * b1 + b2] = self.vocab[codon]

    def encode_bytes(self, sequence: bytes | bytearray | memoryview | np.ndarray,
                     add_special_tokens: bool = False) -> np.ndarray:
        """Codon ids of a nucleotide byte string with no whitespace (the fast path).

        Args:
            sequence: ASCII nucleotides, either case (or a uint8 array of them).
            add_special_tokens: wrap in ``[BOS]`` ... ``[EOS]`` (codon-71 only; no-op for 69).

        Returns:
            int64 array of token ids.
        """
        raw = np.frombuffer(sequence, dtype=np.uint8) if not isinstance(sequence, np.ndarray) else sequence
        n_codons = len(raw) // 3  # a trailing partial codon is dropped
        bases = _BASE_INDEX[raw[: 3 * n_codons]].reshape(n_codons, 3)
        valid = (bases < 4).all(axis=1)
        index = (bases[:, 0].astype(np.int64) * 16 + bases[:, 1] * 4 + bases[:, 2]) & 63
        ids = np.where(valid, self._codon_id[index], self.unk_id)
        if add_special_tokens and self.wraps:
            ids = np.concatenate(([self.bos_id], ids, [self.eos_id]))
        return ids

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of a nucleotide string (codon-71 wraps it in ``[BOS]``/``[EOS]``)."""
        # One byte per character: a non-ASCII character becomes one '?' (so one [UNK] codon)
        # instead of shifting the reading frame by its UTF-8 length.
        compact = "".join(text.split()).encode("ascii", errors="replace")
        return self.encode_bytes(compact, add_special_tokens=add_special_tokens).tolist()

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = True) -> list[list[int]]:
        """``encode`` applied to each text."""
        return [self.encode(text, add_special_tokens) for text in texts]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """Tokens joined by single spaces, e.g. ``"[BOS] ATG GCC [EOS]"``.

        Args:
            ids: token ids.
            skip_special_tokens: leave out ``[BOS]``, ``[PAD]``, ``[UNK]`` ... (codons only).
        """
        tokens = []
        for token_id in ids:
            token_id = int(token_id)
            if not 0 <= token_id < self.vocab_size:
                raise ValueError(f"token id {token_id} outside the {self.name} vocabulary "
                                 f"(0..{self.vocab_size - 1})")
            if skip_special_tokens and token_id in self.special_ids:
                continue
            tokens.append(self._id_to_token[token_id])
        return " ".join(tokens)

    def __repr__(self) -> str:
        return f"CodonTokenizer({self.name!r}, vocab_size={self.vocab_size}, eos_id={self.eos_id})"
