"""accel_kit.data.batches: memmap windows, padded rows, synthetic tokens, open_batches."""
import numpy as np
import pytest
import torch

from accel_kit.data import (
    IGNORE_INDEX, MemmapBatches, PaddedRowBatches, SyntheticBatches, open_batches, prepare_default_text, prepare_fasta,
)
from accel_kit.errors import DataError

from .common import read_tokens


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
