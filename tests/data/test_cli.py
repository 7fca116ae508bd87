"""accel_kit.data.cli: the prepare subcommands; text with a tokenizer file; data too large for the model."""
import argparse
import hashlib
import sys
from types import SimpleNamespace

import numpy as np
import pytest
from cli_checks import fail_one_line
from tokenizer_files import write_ranks, write_tokenizer_json

from accel_kit import cli
from accel_kit.data import read_meta, tokenizer_of
from accel_kit.data.cli import add_prepare_parser
from accel_kit.errors import ParameterError
from accel_kit.studies import training
from accel_kit.tokenizers import load_tokenizer

from .common import DOCS, read_tokens, write_jsonl


def test_cli_hook(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    add_prepare_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["prepare", "synthetic-genome", "--out", str(tmp_path / "g.fa"), "--records", "2"])
    assert args.func(args) == 0
    args = parser.parse_args(["prepare", "fasta", str(tmp_path / "g.fa"), "--out", str(tmp_path / "f"),
                              "--block-size", "64", "-q"])
    assert args.func(args) == 0
    args = parser.parse_args(["prepare", "text", "--out", str(tmp_path / "t"), "--workers", "1", "-q"])
    assert args.func(args) == 0
    output = capsys.readouterr().out
    assert "2 synthetic genomes" in output and "rows" in output and "gpt2" in output
    assert read_meta(tmp_path / "t")["documents"] > 50


# ------------------------------------------------------------------ --tokenizer FILE

def _documents(tokens, tokenizer):
    """The decoded documents of a stream (each ends with the tokenizer's EOS)."""
    assert tokens[-1] == tokenizer.eos_id
    cuts = np.flatnonzero(tokens == tokenizer.eos_id)
    return [tokenizer.decode(doc[:-1].tolist()) for doc in np.split(tokens, cuts + 1)[:-1]]


def _prepare(corpus, out, tokenizer_file):
    assert cli.main(["prepare", "text", str(corpus), "--out", str(out), "--tokenizer", str(tokenizer_file),
                     "--val-fraction", "0", "-q"]) == 0
    return read_meta(out)


def test_prepare_text_with_a_tokenizer_json(tmp_path, capsys):
    tok_file = write_tokenizer_json(tmp_path / "tokenizer.json")
    meta = _prepare(write_jsonl(tmp_path / "c.jsonl", DOCS), tmp_path / "out", tok_file)
    sha = hashlib.sha256(tok_file.read_bytes()).hexdigest()
    assert meta["tokenizer"] == f"file:tokenizer.json@{sha[:12]}" == tokenizer_of(str(tmp_path / "out"))
    assert meta["tokenizer_file"] == {"path": str(tok_file.resolve()), "sha256": sha, "format": "tokenizer.json"}
    assert meta["vocab_size"] == 300 and meta["dtype"] == "uint16" and meta["eos_id"] == 0
    assert _documents(read_tokens(tmp_path / "out"), load_tokenizer(tok_file)) == DOCS
    assert f"file:tokenizer.json@{sha[:12]} (uint16, stream)" in capsys.readouterr().out


def test_prepare_text_with_a_tiktoken_file_past_uint16(tmp_path):
    """Llama 3's vocabulary (128,256) does not fit uint16: nor does this one, whose merges' ids pass 65,535."""
    tok_file = write_ranks(tmp_path / "tokenizer.model", fillers=65_400)
    meta = _prepare(write_jsonl(tmp_path / "c.jsonl", DOCS), tmp_path / "out", tok_file)
    sha = hashlib.sha256(tok_file.read_bytes()).hexdigest()
    assert meta["tokenizer"] == f"file:tokenizer.model@{sha[:12]}"
    assert meta["tokenizer_file"]["sha256"] == sha and meta["tokenizer_file"]["format"] == "tiktoken"
    assert meta["vocab_size"] == 256 + 65_400 + 12 + 256 and meta["dtype"] == "uint32"
    tokens = read_tokens(tmp_path / "out")
    assert tokens.max() > 65_535  # "Hello" and the end-of-text id, held whole
    assert _documents(tokens, load_tokenizer(tok_file)) == DOCS


def test_bad_tokenizer_files_are_one_line(tmp_path, capsys, monkeypatch):
    corpus = str(write_jsonl(tmp_path / "c.jsonl", DOCS))
    (tmp_path / "notes.txt").write_text("not a tokenizer\n")
    no_eos = write_tokenizer_json(tmp_path / "tokenizer.json", specials=("<pad>",))
    ranks = write_ranks(tmp_path / "tokenizer.model")

    def fail(tokenizer):
        return fail_one_line(["prepare", "text", corpus, "--out", str(tmp_path / "out"), "--tokenizer", str(tokenizer)], capsys)

    assert "missing.json: no such tokenizer file" in fail(tmp_path / "missing.json")
    assert "neither a Hugging Face tokenizer.json nor a tiktoken BPE file" in fail(tmp_path / "notes.txt")
    assert "no end-of-text token" in fail(no_eos)
    assert "is a genome tokenizer (prepare fasta)" in fail("codon-71")
    monkeypatch.setitem(sys.modules, "tiktoken", None)
    assert "needs the tiktoken package: pip install tiktoken" in fail(ranks)
    assert not (tmp_path / "out").exists()


def test_data_with_more_tokens_than_the_model_fails_before_work(tmp_path, capsys, monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("ran although the data's tokens do not fit the model")

    monkeypatch.setattr(training, "run_sweep", never)
    monkeypatch.setattr(training, "resolve_data", never)
    monkeypatch.setenv("ACCEL_KIT_OUTPUT_DIR", str(tmp_path / "results"))
    folder = tmp_path / "prepared"
    _prepare(write_jsonl(tmp_path / "c.jsonl", DOCS), folder, write_tokenizer_json(tmp_path / "tokenizer.json"))
    # (the quick profile: the smoke one sets a vocabulary of its own, which would be what the data is checked against)
    run = ["run", "gas", "--system", "cpu", "--profile", "quick", "-p", "preset", "genslm-debug", "-q"]
    err = fail_one_line([*run, "-p", "data", str(folder)], capsys)
    assert "has 300 tokens, more than the 71 of model preset 'genslm-debug'" in err and "file:tokenizer.json@" in err
    # The embedded corpus is GPT-2's: known to be too large without preparing it.
    assert "tokenizer gpt2 has 50,257 tokens, more than the 71" in fail_one_line([*run, "-p", "data", "text"], capsys)
    assert not (tmp_path / "results" / "data").exists()


def test_data_vocab_check_per_point(tmp_path):
    folder = tmp_path / "prepared"
    _prepare(write_jsonl(tmp_path / "c.jsonl", DOCS), folder, write_tokenizer_json(tmp_path / "tokenizer.json"))

    def point(preset, vocab_size=None, data=str(folder), data_path=None):
        return SimpleNamespace(preset=preset, vocab_size=vocab_size, data=data, data_path=data_path)

    training.check_data_vocab([point("gpt2-debug"), point("genslm-debug", vocab_size=300), point("genslm-debug", data="synthetic"),
                      point("genslm-debug", vocab_size=300, data="genomes", data_path=str(folder))])
    with pytest.raises(ParameterError, match="more than the 299 of model preset 'genslm-debug' with vocab_size 299"):
        training.check_data_vocab([point("genslm-debug", vocab_size=299, data="genomes", data_path=str(folder))])
    assert tokenizer_of(None) is None
