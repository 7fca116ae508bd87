"""Tokenizers read from a local file the user brings: a Hugging Face ``tokenizer.json``, or a
tiktoken BPE ranks file (Llama 3's ``tokenizer.model``).

Meta's tokenizer files come from Meta (or a Hugging Face repository behind its licence), never
from a package registry, so accel-kit ships none; ``accel-kit prepare text ... --tokenizer FILE``
reads the user's.

The format is told from the contents, not the name:

* a JSON object: a ``tokenizer.json``, loaded with the ``tokenizers`` library, as transformers
  does (so added tokens written in the text, ``<|end_of_text|>`` say, become their ids);
* lines of ``base64(token) rank``: tiktoken ranks, read the way Meta's reference code reads
  Llama 3's: the ranks are ids ``0 .. n-1``, Llama 3's pre-tokenizer regex, and 256 special
  tokens numbered from ``n`` (``<|begin_of_text|>`` n, ``<|end_of_text|>`` n + 1, ...), so
  Llama 3's 128,000 ranks give a vocabulary of 128,256. Special tokens written in the text stay
  ordinary text, as Meta's ``encode`` does by default. Needs ``pip install tiktoken``.

A file tokenizer's ``name`` is ``file:<file name>@<first 12 hex digits of its sha256>``: the
name recorded in a prepared folder's meta says which file made it, and a changed file makes a
new name (so an old preparation is not reused).
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
from pathlib import Path
from typing import Sequence

from accel_kit.errors import DataError, UnavailableError
from accel_kit.json_types import JSONObject

#: Llama 3's pre-tokenizer regex (tiktoken syntax): contractions, letter runs with at most one
#: leading non-letter, digit groups of up to 3, punctuation runs with their trailing newlines,
#: newline runs, then other whitespace.
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                  r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_SPECIAL_COUNT = 256
#: The named special tokens of Llama 3.1 onwards, in id order after the ranks; the rest of the 256
#: are ``<|reserved_special_token_K|>``. (Llama 3.0 named slots 4, 5, 8, 10 and 11 otherwise;
#: the ids, and so prepared data, are the same.)
LLAMA3_NAMED_SPECIALS = (
    "<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>", "<|reserved_special_token_1|>",
    "<|finetune_right_pad_id|>", "<|step_id|>", "<|start_header_id|>", "<|end_header_id|>",
    "<|eom_id|>", "<|eot_id|>", "<|python_tag|>", "<|image|>",
)
#: End-of-document tokens looked for among a tokenizer.json's added tokens, in this order.
EOS_CANDIDATES = ("<|end_of_text|>", "</s>", "<|endoftext|>")
#: A newline cut after one of these keeps the ids of GPT-2- and Llama-3-style byte-level BPEs
#: (see ``accel_kit.data.text.split_long_text``): no pre-token joins a letter or digit to the
#: newline after it, and none looks behind.
ALNUM_CUT_CHARS = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_TIKTOKEN_HINT = "pip install tiktoken (or pip install 'accel-kit[tiktoken]')"


def llama3_special_tokens(n_ranks: int) -> dict[str, int]:
    """Llama 3's 256 special tokens and their ids, which follow the ``n_ranks`` BPE ranks."""
    names = list(LLAMA3_NAMED_SPECIALS)
    names += [f"<|reserved_special_token_{2 + i}|>" for i in range(LLAMA3_SPECIAL_COUNT - len(names))]
    return {name: n_ranks + index for index, name in enumerate(names)}


def looks_like_path(name: str) -> bool:
    """Whether a ``--tokenizer`` value names a file rather than a registered tokenizer: it has a
    folder separator, starts with ``~`` or ``.``, or ends in a suffix such as ``.json``."""
    separators = [os.sep] + ([os.altsep] if os.altsep else [])
    suffix = Path(name).suffix[1:]
    return any(sep in name for sep in separators) or name.startswith(("~", ".")) or suffix.isalpha()


def load_file_tokenizer(path: str | os.PathLike) -> "FileTokenizer":
    """The tokenizer in a local file, its format told from its contents (see the module docstring).

    Not cached: the file may change between calls, and its name (which holds its hash) with it.

    Raises:
        DataError: no such file, a folder, or a file of neither format, or one without an
            end-of-text token.
        UnavailableError: a tiktoken file when tiktoken is not installed.
    """
    path = Path(path).expanduser()
    if path.is_dir():
        raise DataError(f"{path}: is a folder; give the tokenizer file in it (tokenizer.json, or a tiktoken "
                        f"tokenizer.model)")
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise DataError(f"{path}: no such tokenizer file") from None
    except OSError as error:
        raise DataError(f"{path}: cannot read the tokenizer file ({error.strerror or error})") from None
    if data.lstrip()[:1] == b"{":
        return HFFileTokenizer(path, data)
    return TiktokenFileTokenizer(path, data, parse_ranks(path, data))


def parse_ranks(path: Path, data: bytes) -> dict[bytes, int]:
    """The ``token bytes -> rank`` map of a tiktoken BPE file, checked to be a usable byte-level BPE.

    Read here rather than by ``tiktoken.load.load_tiktoken_bpe``, whose cache is keyed by the
    path, so an edited file at the same path could be answered from the old copy.
    """
    ranks: dict[bytes, int] = {}
    for number, line in enumerate(data.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split()
        try:
            if len(parts) != 2:
                raise ValueError
            token, rank = base64.b64decode(parts[0], validate=True), int(parts[1])
        except (ValueError, binascii.Error):
            raise DataError(f"{path}: neither a Hugging Face tokenizer.json nor a tiktoken BPE file (line {number} "
                            f"is not 'base64-token rank'; a SentencePiece .model, as Llama 1 and 2 use, is not "
                            f"supported)") from None
        ranks[token] = rank
    if not ranks:
        raise DataError(f"{path}: empty; not a tokenizer file")
    if sorted(ranks.values()) != list(range(len(ranks))):
        # Special ids are numbered from the rank count, so gaps or repeats would collide with them.
        raise DataError(f"{path}: the ranks are not 0..{len(ranks) - 1}, each once; not a tiktoken BPE file")
    missing = [byte for byte in range(256) if bytes([byte]) not in ranks]
    if missing:
        raise DataError(f"{path}: lacks {len(missing)} of the 256 single-byte tokens (byte {missing[0]} first); "
                        f"a byte-level BPE needs them all")
    return ranks


class FileTokenizer:
    """What both file kinds share: the file's identity, and checked token ids on decode.

    Attributes:
        name: ``file:<file name>@<sha256[:12]>``.
        path: the file, resolved.
        sha256: the file's full hash.
        format: ``tokenizer.json`` or ``tiktoken``.
        vocab_size, eos_id, pad_id: as :class:`~accel_kit.tokenizers.TokenizerLike`; ``pad_id``
            is ``eos_id`` (text data is a stream, never padded).
        cut_after_chars: characters after which ``prepare_text`` may cut a long document at a
            newline without changing its ids ("" = never cut).
    """

    format: str = ""
    vocab_size: int
    eos_id: int
    pad_id: int
    cut_after_chars: str = ""

    def __init__(self, path: Path, data: bytes) -> None:
        self.path = path.resolve()
        self.sha256 = hashlib.sha256(data).hexdigest()
        self.name = f"file:{path.name}@{self.sha256[:12]}"

    def file_meta(self) -> JSONObject:
        """What a prepared folder's meta records of the file (beside ``tokenizer`` and ``vocab_size``)."""
        return {"path": str(self.path), "sha256": self.sha256, "format": self.format}

    def _checked(self, ids: Sequence[int]) -> list[int]:
        ids = [int(i) for i in ids]
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"token id {bad[0]} outside the vocabulary of {self.name} (0..{self.vocab_size - 1})")
        return ids

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, vocab_size={self.vocab_size}, eos_id={self.eos_id})"


class HFFileTokenizer(FileTokenizer):
    """A Hugging Face ``tokenizer.json``, run by the Rust ``tokenizers`` library."""

    format = "tokenizer.json"

    def __init__(self, path: Path, data: bytes) -> None:
        super().__init__(path, data)
        from tokenizers import Tokenizer

        try:
            text = data.decode("utf-8")
            self._tokenizer = Tokenizer.from_str(text)
        except Exception as error:  # noqa: BLE001 - a parse error's type varies; report one line
            first = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise DataError(f"{path}: not a Hugging Face tokenizer.json ({first})") from None
        added = {token.content: index for index, token in self._tokenizer.get_added_tokens_decoder().items()}
        eos = next((name for name in EOS_CANDIDATES if name in added), None)
        if eos is None:
            raise DataError(f"{path}: no end-of-text token among its added tokens (looked for "
                            f"{', '.join(EOS_CANDIDATES)}); prepared text needs one between documents")
        self.eos_id = self.pad_id = added[eos]
        # Ids need not be dense: the largest one bounds what the model must embed.
        self.vocab_size = max(self._tokenizer.get_vocab(with_added_tokens=True).values()) + 1
        self.cut_after_chars = ALNUM_CUT_CHARS if _cuts_are_exact(json.loads(text), added) else ""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``; ``add_special_tokens`` runs the file's post-processor (a BOS, say)."""
        return self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = True) -> list[list[int]]:
        """Token ids of many texts, in parallel on the Rust thread pool (as the GPT-2 tokenizer)."""
        encodings = self._tokenizer.encode_batch_fast(list(texts), add_special_tokens=add_special_tokens)
        return [encoding.ids for encoding in encodings]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self._tokenizer.decode(self._checked(ids), skip_special_tokens=skip_special_tokens)


def _cuts_are_exact(spec: JSONObject, added: dict[str, int]) -> bool:
    """Whether a newline cut after a letter or digit leaves this tokenizer.json's ids unchanged.

    Only for the pre-tokenizers known to split there and nowhere across it: no normalizer, and
    either GPT-2's (a byte-level regex split, no prefix space) or Llama 3's (its regex, then a
    byte-level map without regex or prefix space); and no added token holding a newline. Any
    other (SentencePiece's prefix space, say) might differ at a cut, so its documents stay whole.
    """
    if spec.get("normalizer") is not None or any("\n" in token for token in added):
        return False
    pre = spec.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]

    def byte_level(step: JSONObject, regex: bool) -> bool:
        return (step.get("type") == "ByteLevel" and not step.get("add_prefix_space", True)
                and step.get("use_regex", True) == regex)

    if len(steps) == 1:
        return byte_level(steps[0], regex=True)
    if len(steps) == 2:
        split = steps[0]
        return (split.get("type") == "Split" and split.get("pattern") == {"Regex": LLAMA3_PATTERN}
                and split.get("behavior") == "Isolated" and not split.get("invert", False)
                and byte_level(steps[1], regex=False))
    return False


class TiktokenFileTokenizer(FileTokenizer):
    """A tiktoken BPE ranks file read as Llama 3 (see the module docstring)."""

    format = "tiktoken"
    cut_after_chars = ALNUM_CUT_CHARS  # Llama 3's regex: see ALNUM_CUT_CHARS

    def __init__(self, path: Path, data: bytes, ranks: dict[bytes, int]) -> None:
        super().__init__(path, data)
        try:
            import tiktoken
        except ImportError:
            raise UnavailableError(f"{path}: a tiktoken BPE file; reading it needs the tiktoken package: "
                                   f"{_TIKTOKEN_HINT}") from None
        self.special_tokens = llama3_special_tokens(len(ranks))
        self._encoding = tiktoken.Encoding(name=self.name, pat_str=LLAMA3_PATTERN, mergeable_ranks=ranks,
                                           special_tokens=self.special_tokens)
        self.n_ranks = len(ranks)
        self.vocab_size = len(ranks) + len(self.special_tokens)
        self.bos_id = self.special_tokens["<|begin_of_text|>"]
        self.eos_id = self.pad_id = self.special_tokens["<|end_of_text|>"]

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``; ``add_special_tokens`` puts ``<|begin_of_text|>`` first, as Llama 3's
        tokenizer.json does."""
        ids = self._encoding.encode_ordinary(text)
        return [self.bos_id, *ids] if add_special_tokens else ids

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = True) -> list[list[int]]:
        """``encode`` of many texts on tiktoken's threads, as many as the Rust tokenizers' pool would
        use (``RAYON_NUM_THREADS``, which ``prepare_text --workers`` sets, else every core)."""
        threads = int(os.environ.get("RAYON_NUM_THREADS") or 0) or os.cpu_count() or 1
        batch = self._encoding.encode_ordinary_batch(list(texts), num_threads=threads)
        return [[self.bos_id, *ids] for ids in batch] if add_special_tokens else batch

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        ids = self._checked(ids)
        if skip_special_tokens:
            ids = [i for i in ids if i < self.n_ranks]
        return self._encoding.decode(ids)
