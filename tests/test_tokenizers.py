"""Tokenizers: GPT-2 ids against transformers, codon vocabularies and encoding rules."""
from __future__ import annotations

import json

import pytest

from accel_kit.errors import ParameterError
from accel_kit.tokenizers import CODONS, TOKENIZER_NAMES, TokenizerLike, load_tokenizer
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
