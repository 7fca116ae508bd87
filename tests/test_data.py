"""Data pipelines: text and FASTA preparation, synthetic genomes, batch sources."""
from __future__ import annotations

import gzip
import json
import math
import sys
import types

import numpy as np
import pytest
import torch

from accel_kit.data import (
    IGNORE_INDEX, MemmapBatches, PaddedRowBatches, SyntheticBatches, default_text_corpus,
    open_batches, prepare_default_text, prepare_fasta, prepare_text, read_fasta, read_meta,
    synthetic_genomes,
)
from accel_kit.data import text as text_module
from accel_kit.data.corpus import default_text_documents
from accel_kit.data.text import split_long_text
from accel_kit.errors import DataError, ParameterError
from accel_kit.tokenizers import load_tokenizer

DOCS = ["Hello world.", "Second document,\nwith two lines.", "Ünïcödé 🙂 and <tags>"]


@pytest.fixture(scope="module")
def gpt2():
    return load_tokenizer("gpt2")


def write_jsonl(path, texts, opener=open):
    with opener(path, "wt", encoding="utf-8") as handle:
        for text in texts:
            handle.write(json.dumps({"text": text, "id": 1}) + "\n")
    return path


def read_tokens(folder, split="train"):
    meta = read_meta(folder)
    return np.fromfile(folder / meta["splits"][split]["file"], dtype=meta["dtype"])


def expected_stream(tokenizer, texts):
    return [token for text in texts for token in tokenizer.encode(text) + [tokenizer.eos_id]]


# --------------------------------------------------------------------------------------- text


def test_jsonl_tokens_match_direct_encode(tmp_path, gpt2):
    corpus = write_jsonl(tmp_path / "c.jsonl", DOCS)
    meta = prepare_text([corpus], tmp_path / "out", val_fraction=0.0, progress=False)
    assert read_tokens(tmp_path / "out").tolist() == expected_stream(gpt2, DOCS)
    assert meta["splits"]["train"]["documents"] == 3 and meta["splits"]["val"]["tokens"] == 0
    assert meta["dtype"] == "uint16" and meta["tokenizer"] == "gpt2" and meta["vocab_size"] == 50257
    assert meta["layout"] == "stream" and len(meta["inputs_sha256"]) == 64
    assert json.loads((tmp_path / "out" / "meta.json").read_text())["tokens"] == meta["tokens"]


def test_jsonl_gz_and_blank_lines(tmp_path, gpt2):
    path = tmp_path / "c.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as handle:
        handle.write(json.dumps({"text": DOCS[0]}) + "\n\n   \n" + json.dumps({"text": DOCS[1]}) + "\n")
    prepare_text([path], tmp_path / "out", val_fraction=0.0, progress=False)
    assert read_tokens(tmp_path / "out").tolist() == expected_stream(gpt2, DOCS[:2])


def test_txt_is_one_document_per_file_and_folders_sorted(tmp_path, gpt2):
    folder = tmp_path / "texts"
    folder.mkdir()
    (folder / "b.txt").write_text("second file\n\nwith a paragraph break\n", encoding="utf-8")
    (folder / "a.txt").write_text("first file\n", encoding="utf-8")
    (folder / ".hidden.txt").write_text("ignored", encoding="utf-8")
    meta = prepare_text([folder], tmp_path / "out", val_fraction=0.0, progress=False)
    assert meta["documents"] == 2
    assert read_tokens(tmp_path / "out").tolist() == expected_stream(
        gpt2, ["first file\n", "second file\n\nwith a paragraph break\n"])


def test_default_pydoc_corpus(tmp_path, gpt2):
    meta = prepare_default_text(tmp_path / "out", progress=False)
    documents = [text for _, text in default_text_documents()]
    assert meta["documents"] == len(documents) > 50
    assert meta["tokens"] == sum(len(ids) + 1 for ids in gpt2.encode_batch(documents))
    assert meta["splits"]["val"]["documents"] >= 1  # a positive fraction gives val a document
    assert default_text_corpus(tmp_path / "again").read_bytes() == \
        (tmp_path / ".out.corpus" / "pydoc_topics.jsonl").read_bytes()


def test_rerun_reuses_and_changes_invalidate(tmp_path):
    corpus = write_jsonl(tmp_path / "c.jsonl", DOCS)
    out = tmp_path / "out"
    first = prepare_text([corpus], out, progress=False)
    stamp = (out / "train.bin").stat().st_mtime_ns
    again = prepare_text([str(corpus)], out, progress=False)
    assert again["reused"] and again["inputs_sha256"] == first["inputs_sha256"]
    assert (out / "train.bin").stat().st_mtime_ns == stamp
    assert not prepare_text([corpus], out, val_fraction=0.5, progress=False).get("reused")
    write_jsonl(corpus, DOCS + ["one more"])
    assert prepare_text([corpus], out, val_fraction=0.5, progress=False)["documents"] == 4


def test_damaged_output_is_redone(tmp_path):
    corpus = write_jsonl(tmp_path / "c.jsonl", DOCS)
    out = tmp_path / "out"
    prepare_text([corpus], out, progress=False)
    with open(out / "train.bin", "ab") as handle:
        handle.write(b"\0\0")
    with pytest.raises(DataError, match="damaged"):
        read_meta(out)
    assert not prepare_text([corpus], out, progress=False).get("reused")
    read_meta(out)


def test_output_is_independent_of_workers_and_piece_size(tmp_path, monkeypatch):
    text = "\n".join(topic for _, topic in default_text_documents())
    corpus = write_jsonl(tmp_path / "c.jsonl", [text, "short"])
    prepare_text([corpus], tmp_path / "a", num_workers=None, progress=False)
    prepare_text([corpus], tmp_path / "b", num_workers=1, progress=False)
    monkeypatch.setattr(text_module, "PIECE_CHARS", 1000)  # cut the long document into pieces
    monkeypatch.setattr(text_module, "BATCH_CHARS", 5000)
    prepare_text([corpus], tmp_path / "c", progress=False)
    for split in ("train", "val"):
        reference = read_tokens(tmp_path / "a", split)
        assert np.array_equal(reference, read_tokens(tmp_path / "b", split))
        assert np.array_equal(reference, read_tokens(tmp_path / "c", split))


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_split_long_text_is_exact(gpt2, newline):
    text = "\n".join(topic for _, topic in default_text_documents()[:10]).replace("\n", newline)
    pieces = split_long_text(text, 500)
    assert len(pieces) > 10 and "".join(pieces) == text
    assert [token for piece in pieces for token in gpt2.encode(piece)] == gpt2.encode(text)
    assert split_long_text("x" * 5000, 500) == ["x" * 5000]  # no line end: stays whole


def test_long_txt_file_streams_in_pieces(tmp_path, gpt2, monkeypatch):
    text = "\n".join(topic for _, topic in default_text_documents()[:5])
    (tmp_path / "big.txt").write_text(text, encoding="utf-8")
    monkeypatch.setattr(text_module, "PIECE_CHARS", 700)
    meta = prepare_text([tmp_path / "big.txt"], tmp_path / "out", val_fraction=0.0, progress=False)
    assert meta["documents"] == 1
    assert read_tokens(tmp_path / "out").tolist() == gpt2.encode(text) + [gpt2.eos_id]


def test_val_split_is_by_document(tmp_path, gpt2):
    texts = [f"document number {i}." for i in range(200)]
    corpus = write_jsonl(tmp_path / "c.jsonl", texts)
    meta = prepare_text([corpus], tmp_path / "out", val_fraction=0.1, progress=False)
    assert 5 <= meta["splits"]["val"]["documents"] <= 40
    train, val = read_tokens(tmp_path / "out", "train"), read_tokens(tmp_path / "out", "val")
    assert len(train) + len(val) == len(expected_stream(gpt2, texts))
    assert val[-1] == gpt2.eos_id and train[-1] == gpt2.eos_id
    assert (val == gpt2.eos_id).sum() == meta["splits"]["val"]["documents"]


def test_empty_documents_skipped(tmp_path, gpt2):
    corpus = write_jsonl(tmp_path / "c.jsonl", ["", "text", ""])
    meta = prepare_text([corpus], tmp_path / "out", val_fraction=0.0, progress=False)
    assert meta["skipped_empty_documents"] == 2 and meta["documents"] == 1


@pytest.mark.parametrize("content, match", [
    (b"", r"c\.jsonl: empty corpus"),
    (b'{"text": ""}\n', r"c\.jsonl: empty corpus"),
    (b'{"text": "ok"}\n{"text": "caf\xe9"}\n', r"c\.jsonl:2: not valid UTF-8 \(byte 0xe9 at column 14\)"),
    (b'{"text": "ok"}\n\n{"text": "unterminated\n', r"c\.jsonl:3: not valid JSON"),
    (b'{"text": "ok"}\n{"body": "no text"}\n', r"c\.jsonl:2: no \"text\" field \(fields: body\)"),
    (b'{"text": 5}\n', r"c\.jsonl:1: \"text\" is int"),
    (b'["text"]\n', r"c\.jsonl:1: expected a JSON object"),
])
def test_jsonl_errors_name_file_and_line(tmp_path, content, match):
    (tmp_path / "c.jsonl").write_bytes(content)
    with pytest.raises(DataError, match=match):
        prepare_text([tmp_path / "c.jsonl"], tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()
    assert not [p for p in tmp_path.iterdir() if ".partial-" in p.name]


def test_other_input_errors(tmp_path):
    with pytest.raises(DataError, match=r"missing\.jsonl: no such file"):
        prepare_text([tmp_path / "missing.jsonl"], tmp_path / "out", progress=False)
    (tmp_path / "t.txt").write_bytes(b"line one\nline \xff two\n")
    with pytest.raises(DataError, match=r"t\.txt:2: not valid UTF-8"):
        prepare_text([tmp_path / "t.txt"], tmp_path / "out", progress=False)
    (tmp_path / "data.csv").write_text("text\nhello\n")
    with pytest.raises(DataError, match=r"data\.csv: unsupported input"):
        prepare_text([tmp_path / "data.csv"], tmp_path / "out", progress=False)
    with pytest.raises(DataError, match="no input files"):
        prepare_text([], tmp_path / "out", progress=False)
    with pytest.raises(ParameterError):
        prepare_text([tmp_path / "t.txt"], tmp_path / "out", val_fraction=1.0, progress=False)
    (tmp_path / "bad.jsonl.gz").write_bytes(b"not gzip at all")
    with pytest.raises(DataError, match=r"bad\.jsonl\.gz: not a valid gzip file"):
        prepare_text([tmp_path / "bad.jsonl.gz"], tmp_path / "out", progress=False)


def test_foreign_output_folder_is_not_overwritten(tmp_path):
    corpus = write_jsonl(tmp_path / "c.jsonl", DOCS)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "precious.txt").write_text("keep me")
    with pytest.raises(DataError, match="not an accel-kit prepared data folder"):
        prepare_text([corpus], tmp_path / "out", progress=False)
    assert (tmp_path / "out" / "precious.txt").read_text() == "keep me"


def test_failed_rerun_keeps_old_output_and_stale_partials_are_removed(tmp_path):
    corpus = write_jsonl(tmp_path / "c.jsonl", DOCS)
    out = tmp_path / "out"
    prepare_text([corpus], out, progress=False)
    before = (out / "train.bin").read_bytes()
    stale = tmp_path / ".out.partial-999999999-dead"  # a killed run's leftovers (no such pid)
    stale.mkdir()
    (stale / "train.bin").write_bytes(b"junk")
    with open(corpus, "ab") as handle:
        handle.write(b"{broken\n")
    with pytest.raises(DataError, match=r":4: not valid JSON"):
        prepare_text([corpus], out, progress=False)
    assert (out / "train.bin").read_bytes() == before and read_meta(out)
    assert not stale.exists()
    assert not [p for p in tmp_path.iterdir() if ".partial-" in p.name]


def _hf_folder(tmp_path):
    folder = tmp_path / "owt"
    folder.mkdir()
    (folder / "dataset_dict.json").write_text('{"splits": ["train"]}')
    (folder / "data-00000-of-00001.arrow").write_bytes(b"arrow bytes")
    return folder


def test_hf_folder_without_datasets_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` fail
    with pytest.raises(DataError, match=r"owt: is a Hugging Face datasets folder.*pip install datasets"):
        prepare_text([_hf_folder(tmp_path)], tmp_path / "out", progress=False)


class _FakeDataset:
    def __init__(self, texts):
        self.texts = texts
        self.column_names = ["text"]

    def __len__(self):
        return len(self.texts)

    def __getitem__(self, key):
        return {"text": self.texts[key]}


def test_hf_folder_with_datasets(tmp_path, monkeypatch, gpt2):
    folder = _hf_folder(tmp_path)
    splits = {"train": _FakeDataset(DOCS), "validation": _FakeDataset(["not read"])}
    fake = types.ModuleType("datasets")
    fake.load_from_disk = lambda path: splits if path == str(folder) else None
    monkeypatch.setitem(sys.modules, "datasets", fake)
    meta = prepare_text([folder], tmp_path / "out", val_fraction=0.0, progress=False)
    assert read_tokens(tmp_path / "out").tolist() == expected_stream(gpt2, DOCS)
    assert meta["inputs"][0]["kind"] == "hf"
    splits["train"] = _FakeDataset(["fine", None])
    (folder / "data-00000-of-00001.arrow").write_bytes(b"changed")
    with pytest.raises(DataError, match=r"owt \[train\]: row 1: \"text\" is NoneType"):
        prepare_text([folder], tmp_path / "out", progress=False)


# --------------------------------------------------------------------------------------- FASTA


FASTA = (">rec1 first record\n"
         "ATGGCC\n"
         "aaaNNN\n"
         "tt\n"
         ">rec2\r\n"
         "GGCgcc\r\n"
         "A\r\n"
         ">empty\n"
         ">short\n"
         "AC\n")


def test_fasta_reader_handles_multiline_case_crlf(tmp_path):
    (tmp_path / "g.fasta").write_text(FASTA, newline="")
    records = list(read_fasta(tmp_path / "g.fasta"))
    assert records == [("rec1 first record", b"ATGGCCaaaNNNtt"), ("rec2", b"GGCgccA"), ("empty", b""),
                       ("short", b"AC")]


def test_fasta_stream_layout(tmp_path):
    (tmp_path / "g.fa").write_text(FASTA, newline="")
    meta = prepare_fasta([tmp_path / "g.fa"], tmp_path / "out", val_fraction=0.0, progress=False)
    tok = load_tokenizer("codon-71")
    atg, gcc, aaa, ggc = (tok.vocab[c] for c in ("ATG", "GCC", "AAA", "GGC"))
    # rec1: ATG GCC AAA NNN(unk) + "tt" dropped; rec2: GGC GCC + "A" dropped; empty/short skipped
    assert read_tokens(tmp_path / "out").tolist() == [atg, gcc, aaa, 0, 3, ggc, gcc, 3]
    assert meta["records"] == 2 and meta["skipped_records"] == 2 and meta["layout"] == "stream"


def test_fasta_rows_layout_codon71(tmp_path):
    (tmp_path / "g.fa").write_text(FASTA, newline="")
    meta = prepare_fasta([tmp_path / "g.fa"], tmp_path / "out", block_size=5, val_fraction=0.0, progress=False)
    tok = load_tokenizer("codon-71")
    atg, gcc, ggc = (tok.vocab[c] for c in ("ATG", "GCC", "GGC"))
    rows = read_tokens(tmp_path / "out").reshape(-1, 5).tolist()
    assert rows == [[2, atg, gcc, tok.vocab["AAA"], 3],  # truncated, [EOS] kept
                    [2, ggc, gcc, 3, 5]]                 # padded with [PAD]=5
    assert meta["truncated_records"] == 1 and meta["block_size"] == 5 and meta["layout"] == "rows"


def test_fasta_rows_layout_codon69_gzip_folder(tmp_path):
    folder = tmp_path / "genomes"
    folder.mkdir()
    with gzip.open(folder / "b.fna.gz", "wt") as handle:
        handle.write(">x\nATGGCCAAA\n")
    (folder / "a.fasta").write_text(">y\nggc\n")
    (folder / "notes.md").write_text("not FASTA")
    prepare_fasta([folder], tmp_path / "out", tokenizer="codon-69", block_size=2, val_fraction=0.0,
                  progress=False)
    tok = load_tokenizer("codon-69")
    assert read_tokens(tmp_path / "out").reshape(-1, 2).tolist() == [
        [tok.vocab["GGC"], 3], [tok.vocab["ATG"], tok.vocab["GCC"]]]


@pytest.mark.parametrize("content, match", [
    ("", r"g\.fa: no FASTA records"),
    ("\n\n", r"g\.fa: no FASTA records"),
    ("ATG\n>rec\nATG\n", r"g\.fa:1: sequence data before the first '>' header"),
    (">rec\nATG\nAT9G\n", r"g\.fa:3: character '9' cannot be part"),
    (">rec\nAC\n>rec2\n", r"g\.fa: no records with a complete codon"),
])
def test_fasta_errors(tmp_path, content, match):
    (tmp_path / "g.fa").write_text(content)
    with pytest.raises(DataError, match=match):
        prepare_fasta([tmp_path / "g.fa"], tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_fasta_parameter_errors(tmp_path):
    (tmp_path / "g.fa").write_text(">r\nATG\n")
    with pytest.raises(ParameterError, match="codon tokenizer"):
        prepare_fasta([tmp_path / "g.fa"], tmp_path / "out", tokenizer="gpt2", progress=False)
    with pytest.raises(ParameterError, match="block_size"):
        prepare_fasta([tmp_path / "g.fa"], tmp_path / "out", block_size=2, progress=False)
    (tmp_path / "g.txt").write_text(">r\nATG\n")
    with pytest.raises(DataError, match=r"g\.txt: unsupported input"):
        prepare_fasta([tmp_path / "g.txt"], tmp_path / "out", progress=False)


def test_fasta_reuse(tmp_path):
    (tmp_path / "g.fa").write_text(">r\nATGGCC\n>s\nAAA\n")
    prepare_fasta([tmp_path / "g.fa"], tmp_path / "out", block_size=8, progress=False)
    assert prepare_fasta([tmp_path / "g.fa"], tmp_path / "out", block_size=8, progress=False)["reused"]
    assert not prepare_fasta([tmp_path / "g.fa"], tmp_path / "out", block_size=16, progress=False).get("reused")


# --------------------------------------------------------------------------------------- genomes


def test_synthetic_genomes_deterministic(tmp_path):
    a = synthetic_genomes(tmp_path / "a.fasta", 3, seed=7).read_bytes()
    b = synthetic_genomes(tmp_path / "b.fasta", 3, seed=7).read_bytes()
    c = synthetic_genomes(tmp_path / "c.fasta", 3, seed=8).read_bytes()
    five = synthetic_genomes(tmp_path / "d.fasta", 5, seed=7).read_bytes()
    assert a == b and a != c and five.startswith(a)  # record i does not depend on n_records
    gz = synthetic_genomes(tmp_path / "e.fasta.gz", 3, seed=7)
    assert gzip.decompress(gz.read_bytes()) == a
    assert synthetic_genomes(tmp_path / "f.fasta.gz", 3, seed=7).read_bytes() == gz.read_bytes()


def test_synthetic_genomes_look_like_genomes(tmp_path):
    path = synthetic_genomes(tmp_path / "g.fasta", 4, seed=0, length_nt=29_903)
    records = list(read_fasta(path))
    assert len(records) == 4 and all(len(seq) == 29_903 for _, seq in records)
    assert all(set(seq) <= set(b"ACGT") for _, seq in records)
    first = records[0][1].decode()
    assert first[:400].count("ATG") >= 1 and records[0][1] != records[1][1]  # variants differ
    tok = load_tokenizer("codon-71")
    ids = np.concatenate([tok.encode_bytes(seq) for _, seq in records])
    counts = np.bincount(ids, minlength=tok.vocab_size)[7:]
    p = counts[counts > 0] / counts.sum()
    entropy = float(-(p * np.log(p)).sum())
    assert entropy < math.log(64) - 0.2, entropy
    with pytest.raises(ParameterError):
        synthetic_genomes(tmp_path / "h.fasta", 0)


# --------------------------------------------------------------------------------------- batches


@pytest.fixture(scope="module")
def text_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("batches") / "text"
    prepare_default_text(out, progress=False)
    return out


def _batches_equal(a, b, steps=3):
    return all(torch.equal(x1, x2) and torch.equal(y1, y2) for (x1, y1), (x2, y2) in
               zip((a.next() for _ in range(steps)), (b.next() for _ in range(steps))))


def test_memmap_batches_deterministic_per_seed_and_rank(text_dir):
    same = _batches_equal(MemmapBatches(text_dir, 32, 4, seed=1, rank=0), MemmapBatches(text_dir, 32, 4, seed=1, rank=0))
    other_rank = _batches_equal(MemmapBatches(text_dir, 32, 4, seed=1, rank=0), MemmapBatches(text_dir, 32, 4, seed=1, rank=1))
    other_seed = _batches_equal(MemmapBatches(text_dir, 32, 4, seed=1, rank=0), MemmapBatches(text_dir, 32, 4, seed=2, rank=0))
    assert same and not other_rank and not other_seed


def test_memmap_batches_are_shifted_windows(text_dir):
    source = MemmapBatches(text_dir, 16, 8, seed=3)
    x, y = next(iter(source))
    assert x.shape == y.shape == (8, 16) and x.dtype == y.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    tokens = torch.from_numpy(read_tokens(text_dir).astype(np.int64))
    text = tokens.unfold(0, 17, 1)  # every window of 17 tokens
    for row in torch.cat([x, y[:, -1:]], dim=1):
        assert (text == row).all(dim=1).any()
    assert not source.synthetic and source.vocab_size == 50257
    raw = MemmapBatches(text_dir / "train.bin", 16, 2, seed=3)  # a bare .bin file works too
    assert raw.next()[0].shape == (2, 16)
    with pytest.raises(DataError, match="fewer than seq_len"):
        MemmapBatches(text_dir, 10**7, 1)


def test_padded_rows_mask_padding(tmp_path):
    (tmp_path / "g.fa").write_text(">a\nATGGCCAAA\n>b\nGGC\n>c\n" + "ACG" * 20 + "\n")
    prepare_fasta([tmp_path / "g.fa"], tmp_path / "out", block_size=8, val_fraction=0.0, progress=False)
    source = open_batches(tmp_path / "out", batch_size=16, seed=0)
    assert isinstance(source, PaddedRowBatches) and source.seq_len == 8
    x, y = source.next()
    assert x.shape == y.shape == (16, 8)
    assert (x[:, 0] == 2).all()  # every sample is a whole record starting with [BOS]
    pad = 5
    assert ((y == IGNORE_INDEX) == torch.cat([x[:, 1:] == pad, torch.ones(16, 1, dtype=torch.bool)], 1)).all()
    assert torch.equal(torch.where(y[:, :-1] == IGNORE_INDEX, pad, y[:, :-1]), x[:, 1:])
    rows = {tuple(row) for row in read_tokens(tmp_path / "out").reshape(-1, 8).tolist()}
    assert {tuple(row) for row in x.tolist()} <= rows
    again = open_batches(tmp_path / "out", batch_size=16, seed=0).next()
    assert torch.equal(again[0], x) and torch.equal(again[1], y)
    with pytest.raises(DataError, match="block_size 8"):
        open_batches(tmp_path / "out", batch_size=2, seq_len=16)
    with pytest.raises(DataError, match="padded rows"):
        MemmapBatches(tmp_path / "out", 4, 2)


def test_synthetic_batches():
    source = SyntheticBatches(vocab_size=100, seq_len=12, batch_size=3, seed=5, rank=2)
    x, y = source.next()
    assert source.synthetic and x.shape == (3, 12) and x.dtype == torch.int64
    assert 0 <= int(x.min()) and int(x.max()) < 100 and torch.equal(x[:, 1:], y[:, :-1])
    assert _batches_equal(SyntheticBatches(100, 12, 3, seed=5, rank=2), SyntheticBatches(100, 12, 3, seed=5, rank=2))
    assert not _batches_equal(SyntheticBatches(100, 12, 3, seed=5, rank=2), SyntheticBatches(100, 12, 3, seed=5, rank=3))


def test_open_batches_for_streams(text_dir):
    assert isinstance(open_batches(text_dir, batch_size=2, seq_len=8, split="val"), MemmapBatches)
    with pytest.raises(DataError, match="needs a seq_len"):
        open_batches(text_dir, batch_size=2)
    with pytest.raises(DataError, match="meta.json"):
        open_batches(text_dir.parent, batch_size=2, seq_len=8)


def test_cli_hook(tmp_path, capsys):
    import argparse

    from accel_kit.data.cli import add_prepare_parser

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
