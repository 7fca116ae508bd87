"""accel_kit.data.fasta: FASTA reading and codon tokens, as a stream or padded rows."""
import gzip

import pytest

from accel_kit.data import prepare_fasta, read_fasta
from accel_kit.errors import DataError, ParameterError
from accel_kit.tokenizers import load_tokenizer

from .common import read_tokens


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
