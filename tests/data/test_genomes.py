"""accel_kit.data.genomes: synthetic SARS-CoV-2-like genomes."""
import gzip
import math

import numpy as np
import pytest

from accel_kit.data import read_fasta, synthetic_genomes
from accel_kit.errors import ParameterError
from accel_kit.tokenizers import load_tokenizer


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
