"""accel_kit.data.text: JSONL, txt and datasets folders to GPT-2 token streams."""
import gzip
import json
import sys
import types

import numpy as np
import pytest
from tokenizer_files import write_ranks, write_tokenizer_json

from accel_kit.data import prepare_text
from accel_kit.data import text as text_module
from accel_kit.data.corpus import default_text_documents
from accel_kit.data.text import split_long_text
from accel_kit.errors import DataError, ParameterError
from accel_kit.tokenizers import load_tokenizer

from .common import DOCS, expected_stream, read_tokens, write_jsonl


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


@pytest.mark.parametrize("kind", ["tiktoken", "tokenizer.json with a normalizer"])
def test_long_txt_file_with_a_tokenizer_file(tmp_path, monkeypatch, kind):
    """Llama 3's regex allows cuts after letters and digits only (it joins "." to the newline after it);
    a tokenizer.json whose rule is not known is never cut. Either way the ids are the whole text's."""
    if kind == "tiktoken":
        path = write_ranks(tmp_path / "tokenizer.model")
    else:
        spec = json.loads(write_tokenizer_json(tmp_path / "tokenizer.json").read_text())
        (tmp_path / "tokenizer.json").write_text(json.dumps({**spec, "normalizer": {"type": "NFC"}}))
        path = tmp_path / "tokenizer.json"
    text = "end.\nnext line\nHello world.\n" * 200
    (tmp_path / "big.txt").write_text(text, encoding="utf-8")
    monkeypatch.setattr(text_module, "PIECE_CHARS", 700)
    prepare_text([tmp_path / "big.txt"], tmp_path / "out", tokenizer=path, val_fraction=0.0, progress=False)
    tok = load_tokenizer(path)
    assert read_tokens(tmp_path / "out").tolist() == tok.encode(text, add_special_tokens=False) + [tok.eos_id]


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


def test_val_fraction_must_leave_training_data(tmp_path):
    corpus = write_jsonl(tmp_path / "c.jsonl", DOCS)
    with pytest.raises(ParameterError):
        prepare_text([corpus], tmp_path / "out", val_fraction=1.0, progress=False)
