"""Tokenizers: GPT-2 ids against transformers, codon vocabularies and encoding rules, tokenizer files."""
from __future__ import annotations

import hashlib
import json
import sys

import pytest
from tokenizer_files import MERGES, write_llama_style_json, write_ranks, write_tokenizer_json

from accel_kit.data.text import split_long_text
from accel_kit.errors import DataError, ParameterError, UnavailableError
from accel_kit.tokenizers import CODONS, TOKENIZER_NAMES, TokenizerLike, load_tokenizer
from accel_kit.tokenizers.files import ALNUM_CUT_CHARS, LLAMA3_PATTERN, llama3_special_tokens
from accel_kit.tokenizers.gpt2 import gpt2_files

SAMPLES = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "  leading spaces, trailing spaces   ",
    "tabs\tand\nnewlines\n\n\nand\r\nCRLF",
    "I'm sure they'll say it's 1,234,567.89 -- isn't it?",
    "héllo wörld, naïve café; Größe; ØÆÅ",
    "日本語のテキスト and 中文 and 한국어",
    "emoji 🙂🚀 and combining e\u0301 and zero\u200bwidth",
    "def f(x):\n    return x ** 2  # comment\n",
    "text with <|endoftext|> inside",
    "",
]


@pytest.fixture(scope="module")
def gpt2():
    return load_tokenizer("gpt2")


@pytest.fixture(scope="module")
def oracles(tmp_path_factory):
    """transformers' fast and slow GPT-2 tokenizers built from the same files (vocab.json, merges.txt)."""
    transformers = pytest.importorskip("transformers")
    folder = tmp_path_factory.mktemp("gpt2-hf")
    encoder_json, vocab_bpe = gpt2_files()
    (folder / "vocab.json").write_text(encoder_json.read_text(encoding="utf-8"), encoding="utf-8")
    (folder / "merges.txt").write_text(vocab_bpe.read_text(encoding="utf-8"), encoding="utf-8")
    fast = transformers.GPT2TokenizerFast.from_pretrained(str(folder))
    slow = transformers.GPT2Tokenizer.from_pretrained(str(folder))
    assert len(fast) == 50257 and len(slow) == 50257  # not the empty-tokenizer pitfall
    return fast, slow


def test_known_ids(gpt2):
    assert gpt2.encode("Hello world") == [15496, 995]
    assert gpt2.encode("<|endoftext|>") == [50256]
    assert gpt2.vocab_size == 50257 and gpt2.eos_id == 50256 and gpt2.name == "gpt2"


@pytest.mark.parametrize("text", SAMPLES)
def test_gpt2_matches_transformers(gpt2, oracles, text):
    fast, slow = oracles
    ids = gpt2.encode(text)
    assert ids == fast.encode(text)
    assert ids == slow.encode(text)


@pytest.mark.parametrize("text", SAMPLES)
def test_gpt2_round_trip(gpt2, text):
    assert gpt2.decode(gpt2.encode(text)) == text


def test_gpt2_batch_equals_single(gpt2):
    assert gpt2.encode_batch(SAMPLES) == [gpt2.encode(text) for text in SAMPLES]


def test_gpt2_decode_special_and_range(gpt2):
    ids = gpt2.encode("a") + [gpt2.eos_id]
    assert gpt2.decode(ids) == "a<|endoftext|>"
    assert gpt2.decode(ids, skip_special_tokens=True) == "a"
    with pytest.raises(ValueError, match="outside"):
        gpt2.decode([50257])


def test_codon_vocabularies():
    c69, c71 = load_tokenizer("codon-69"), load_tokenizer("codon-71")
    assert (c69.vocab_size, c71.vocab_size) == (69, 71)
    assert [c69.vocab[t] for t in ("[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]")] == [0, 1, 2, 3, 4]
    assert [c71.vocab[t] for t in ("[UNK]", "[CLS]", "[BOS]", "[EOS]", "[SEP]", "[PAD]", "[MASK]")] == list(range(7))
    assert [c69.vocab[c] for c in CODONS] == list(range(5, 69))
    assert [c71.vocab[c] for c in CODONS] == list(range(7, 71))
    assert CODONS[:3] == ("GGC", "GCC", "ATC") and CODONS[-3:] == ("CGA", "TGA", "TAG")
    assert (c69.eos_id, c69.pad_id, c69.bos_id) == (2, 3, None)  # [SEP] separates records
    assert (c71.eos_id, c71.pad_id, c71.bos_id) == (3, 5, 2)


def test_codon_encode_rules():
    c69, c71 = load_tokenizer("codon-69"), load_tokenizer("codon-71")
    atg, gcc = 7 + CODONS.index("ATG"), 7 + CODONS.index("GCC")
    assert c71.encode("ATGGCC") == [2, atg, gcc, 3] == [2, 12, 8, 3]
    assert c71.encode("ATGGCC", add_special_tokens=False) == [12, 8]
    assert c69.encode("ATGGCC") == [10, 6]  # codon-69 never wraps
    assert c71.encode("atggcc") == c71.encode("ATGGCC")  # case-insensitive
    assert c71.encode("ATG GCC\r\n") == c71.encode("ATGGCC")  # whitespace ignored
    assert c71.encode("ATGGCCTA") == c71.encode("ATGGCC")  # trailing partial codon dropped
    assert c71.encode("ATGGCCT") == c71.encode("ATGGCC")
    assert c71.encode("ATGNCCGCC", add_special_tokens=False) == [12, 0, 8]  # ambiguous -> [UNK]
    assert c71.encode("AT-RYKGCC", add_special_tokens=False) == [0, 0, 8]
    assert c71.encode("ATé", add_special_tokens=False) == [0]  # non-ASCII is one [UNK] character
    assert c71.encode("") == [2, 3]
    assert c71.encode_batch(["ATG", "GCC"]) == [[2, 12, 3], [2, 8, 3]]


def test_codon_all_codons_and_bytes_path():
    c71 = load_tokenizer("codon-71")
    text = "".join(CODONS)
    assert c71.encode(text, add_special_tokens=False) == list(range(7, 71))
    assert c71.encode_bytes(text.lower().encode()).tolist() == list(range(7, 71))


def test_codon_decode():
    c71 = load_tokenizer("codon-71")
    ids = c71.encode("ATGNCCGCCTT")
    assert c71.decode(ids) == "[BOS] ATG [UNK] GCC [EOS]"
    assert c71.decode(ids, skip_special_tokens=True) == "ATG GCC"
    sequence = "ATGAAATTTGGGCCCTAA"
    assert c71.decode(c71.encode(sequence), skip_special_tokens=True).replace(" ", "") == sequence
    with pytest.raises(ValueError):
        c71.decode([71])


def test_registry():
    for name in TOKENIZER_NAMES:
        tokenizer = load_tokenizer(name)
        assert isinstance(tokenizer, TokenizerLike) and tokenizer.name == name
        assert load_tokenizer(name) is tokenizer  # built once
    with pytest.raises(ParameterError, match="unknown tokenizer"):
        load_tokenizer("bert")


def test_gpt2_files_are_the_openai_ones():
    encoder_json, vocab_bpe = gpt2_files()
    assert len(json.loads(encoder_json.read_text(encoding="utf-8"))) == 50257
    assert vocab_bpe.read_text(encoding="utf-8").startswith("#version")


# ------------------------------------------------------------------ tokenizer files the user brings


def _sha12(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()[:12]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tokenizer-files")
    return write_tokenizer_json(folder / "tokenizer.json"), write_ranks(folder / "tokenizer.model")


def test_tokenizer_json_file(files):
    path = files[0]
    tok = load_tokenizer(path)
    assert isinstance(tok, TokenizerLike) and tok.name == f"file:tokenizer.json@{_sha12(path)}"
    assert tok.vocab_size == 300 and tok.eos_id == tok.pad_id == 0  # the trainer's first id is its special token
    assert tok.file_meta() == {"path": str(path.resolve()), "sha256": tok.sha256, "format": "tokenizer.json"}
    for text in SAMPLES:
        assert tok.decode(tok.encode(text)) == text
    assert tok.encode_batch(SAMPLES) == [tok.encode(text) for text in SAMPLES]
    assert tok.decode(tok.encode("a") + [tok.eos_id]) == "a<|end_of_text|>"
    assert tok.cut_after_chars == ALNUM_CUT_CHARS  # GPT-2's pre-tokenizer: cuts keep the ids
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.decode([300])
    assert load_tokenizer(str(path)) is not tok  # a file is read again: it may have changed


def test_tiktoken_file_reads_as_llama3(files):
    path = files[1]
    tok = load_tokenizer(path)
    n = 256 + len(MERGES)
    assert isinstance(tok, TokenizerLike) and tok.name == f"file:tokenizer.model@{_sha12(path)}"
    assert (tok.vocab_size, tok.bos_id, tok.eos_id) == (n + 256, n, n + 1)
    specials = llama3_special_tokens(128_000)  # Llama 3's own numbering, from Meta's reference code
    assert specials["<|begin_of_text|>"] == 128_000 and specials["<|end_of_text|>"] == 128_001
    assert specials["<|eot_id|>"] == 128_009 and max(specials.values()) == 128_255 and len(specials) == 256
    hello = 256 + MERGES.index(b"Hello")
    assert tok.encode("Hello world", add_special_tokens=False) == [hello, 256 + MERGES.index(b" world")]
    assert tok.encode("Hello") == [n, hello]  # <|begin_of_text|> first, as Llama 3's tokenizer.json
    # Special tokens written in the text stay text, as Meta's encode does by default.
    assert tok.eos_id not in tok.encode("a <|end_of_text|> b")
    for text in SAMPLES:
        assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    assert tok.encode_batch(SAMPLES, add_special_tokens=False) == [tok.encode(t, add_special_tokens=False)
                                                                 for t in SAMPLES]
    assert tok.decode([hello, tok.eos_id]) == "Hello<|end_of_text|>"
    assert tok.decode([tok.bos_id, hello, tok.eos_id], skip_special_tokens=True) == "Hello"


def test_a_llama_style_tokenizer_json_and_the_tiktoken_file_agree(files, tmp_path):
    """The same ranks as Llama 3's tokenizer.json is built (its regex, then bytes) give the same ids,
    and that file's pre-tokenizer is recognised as one a newline cut after a letter keeps."""
    hf = load_tokenizer(write_llama_style_json(tmp_path / "llama.json", LLAMA3_PATTERN))
    tiktoken_file = load_tokenizer(files[1])
    assert hf.eos_id == tiktoken_file.eos_id and hf.cut_after_chars == ALNUM_CUT_CHARS
    for text in SAMPLES:
        assert hf.encode(text, add_special_tokens=False) == tiktoken_file.encode(text, add_special_tokens=False)


def test_long_text_cuts_keep_llama3_ids(files):
    """Llama 3's regex joins punctuation to the newline after it, so GPT-2's cut rule would change ids."""
    tok = load_tokenizer(files[1])
    text = "end.\nnext\nHello world.\nend.\n" * 20
    whole = tok.encode(text, add_special_tokens=False)
    assert 256 + MERGES.index(b".\n") in whole
    pieces = split_long_text(text, 7, cut_after=tok.cut_after_chars)
    assert len(pieces) > 10 and "".join(pieces) == text
    assert [i for piece in pieces for i in tok.encode(piece, add_special_tokens=False)] == whole
    gpt2_cut = split_long_text(text, 7)  # after any printable character, "." included
    assert [i for piece in gpt2_cut for i in tok.encode(piece, add_special_tokens=False)] != whole


def test_other_tokenizer_json_pre_tokenizers_are_never_cut(tmp_path):
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

    tokenizer = Tokenizer(models.BPE(vocab={"a": 0, "</s>": 1}, merges=[]))
    tokenizer.add_special_tokens(["</s>"])
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()  # SentencePiece's prefix space: a cut would add one
    tokenizer.save(str(tmp_path / "sp.json"))
    tok = load_tokenizer(tmp_path / "sp.json")
    assert tok.eos_id == 1 and tok.cut_after_chars == ""
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.save(str(tmp_path / "nfc.json"))
    assert load_tokenizer(tmp_path / "nfc.json").cut_after_chars == ""


@pytest.mark.parametrize("content, message", [
    (None, "no such tokenizer file"),
    ("", "empty; not a tokenizer file"),
    ("just some text\n", "neither a Hugging Face tokenizer.json nor a tiktoken BPE file (line 1"),
    (b"\n\x08\x12\x00\xff binary", "neither a Hugging Face tokenizer.json nor a tiktoken BPE file"),
    ('{"model": "nope"}', "not a Hugging Face tokenizer.json"),
    ("QQ== 0\nQg== 2\n", "the ranks are not 0..1"),
    ("QQ== 0\nQg== 1\n", "lacks 254 of the 256 single-byte tokens"),
])
def test_bad_tokenizer_files(tmp_path, content, message):
    path = tmp_path / "tok.model"
    if content is not None:
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(DataError, match=message.replace("(", r"\(").replace(".", r"\.")):
        load_tokenizer(path)


def test_tokenizer_json_without_end_of_text(tmp_path):
    path = write_tokenizer_json(tmp_path / "tokenizer.json", specials=("<pad>",))
    with pytest.raises(DataError, match=r"no end-of-text token .*<\|end_of_text\|>, </s>, <\|endoftext\|>"):
        load_tokenizer(path)


def test_tiktoken_file_without_tiktoken(files, monkeypatch):
    monkeypatch.setitem(sys.modules, "tiktoken", None)  # import tiktoken now raises ImportError
    with pytest.raises(UnavailableError, match="needs the tiktoken package: pip install tiktoken"):
        load_tokenizer(files[1])


def test_names_and_paths(tmp_path):
    with pytest.raises(ParameterError, match="unknown tokenizer 'llama3'.*or give the path of a tokenizer file"):
        load_tokenizer("llama3")
    with pytest.raises(DataError, match="no such tokenizer file"):
        load_tokenizer("tokenizer.json")  # a file's name, not a registered one
    with pytest.raises(DataError, match="is a folder"):
        load_tokenizer(tmp_path)
