"""Batch sources for training: random windows, whole padded rows, or synthetic tokens.

Every source yields ``(x, y)``: int64 CPU tensors of shape ``(batch_size, seq_len)`` where
``y`` is the next-token target of ``x`` (``-100`` marks positions without a target; PyTorch's
``cross_entropy`` ignores them by default). Sources are infinite: call ``next(source)`` /
``source.next()`` or iterate. Each has ``synthetic`` (bool), ``batch_size``, ``seq_len``,
``vocab_size``.

Determinism: a source draws from its own ``torch.Generator`` seeded with a hash of
``(seed, rank)``, so the batch sequence is a function of ``(data, seed, rank)`` only, and
data-parallel ranks with the same seed draw different samples. Sampling is with replacement
(no epochs): at pre-training scale a window is rarely drawn twice.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from accel_kit.data.store import read_meta
from accel_kit.errors import DataError
from accel_kit.models.family import IGNORE_INDEX  # targets the loss skips (padding)


def rank_seed(seed: int, rank: int) -> int:
    """A 63-bit generator seed from ``(seed, rank)``, well mixed so ranks are unrelated."""
    digest = hashlib.sha256(f"accel-kit-batches:{seed}:{rank}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


class _Source:
    """Shared iteration protocol and generator handling."""

    synthetic = False

    def __init__(self, batch_size: int, seq_len: int, seed: int, rank: int) -> None:
        if batch_size < 1 or seq_len < 1:
            raise ValueError(f"batch_size and seq_len must be >= 1, got {batch_size}, {seq_len}")
        self.batch_size = batch_size
        self.seq_len = seq_len
        self.generator = torch.Generator().manual_seed(rank_seed(seed, rank))

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.next()

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return self


def _open_tokens(path: Path, dtype: np.dtype) -> np.ndarray:
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    if path.stat().st_size == 0:
        return np.zeros(0, dtype=dtype)
    if path.stat().st_size % np.dtype(dtype).itemsize:
        raise DataError(f"{path}: size is not a multiple of {np.dtype(dtype).itemsize} bytes "
                        f"(not a {np.dtype(dtype).name} token file?)")
    return np.memmap(path, dtype=dtype, mode="r")


class MemmapBatches(_Source):
    """Random windows of ``seq_len + 1`` tokens from a token stream (text, FASTA stream).

    ``x = window[:-1]``, ``y = window[1:]``. Windows may cross document boundaries (the EOS
    token between documents tells the model), as in GPT-2 / nanoGPT training.

    Args:
        path: a ``.bin`` token file, or a prepared folder (then ``split`` picks the file and
            meta.json gives dtype and vocab_size).
        seq_len: tokens per sample.
        batch_size: samples per batch.
        seed, rank: determine the sample sequence (see module docstring).
        split: ``"train"`` or ``"val"`` when ``path`` is a folder.
        dtype: token dtype when ``path`` is a file (default uint16).
        vocab_size: recorded on the source when ``path`` is a file (optional).
    """

    def __init__(self, path: str | os.PathLike, seq_len: int, batch_size: int, seed: int = 0,
                 rank: int = 0, split: str = "train", dtype: str | np.dtype = "uint16",
                 vocab_size: int | None = None) -> None:
        super().__init__(batch_size, seq_len, seed, rank)
        path = Path(path)
        self.vocab_size = vocab_size
        if path.is_dir():
            meta = read_meta(path)
            if meta["layout"] != "stream":
                raise DataError(f"{path}: holds padded rows (block_size {meta['block_size']}); "
                                f"use PaddedRowBatches / open_batches")
            dtype, self.vocab_size = meta["dtype"], meta["vocab_size"]
            path = path / meta["splits"][split]["file"]
        self.path = path
        self.tokens = _open_tokens(path, np.dtype(dtype))
        if len(self.tokens) < seq_len + 1:
            raise DataError(f"{path}: {len(self.tokens)} tokens, fewer than seq_len + 1 = {seq_len + 1}")

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        """One batch ``(x, y)`` of shape ``(batch_size, seq_len)``, int64."""
        starts = torch.randint(0, len(self.tokens) - self.seq_len, (self.batch_size,),
                               generator=self.generator).tolist()
        windows = np.stack([self.tokens[start:start + self.seq_len + 1] for start in starts])
        windows = torch.from_numpy(windows.astype(np.int64))
        return windows[:, :-1], windows[:, 1:]


class PaddedRowBatches(_Source):
    """Whole fixed-length rows (one record each) from a ``block_size`` FASTA preparation.

    Rule: a sample is one row drawn at random, so a batch never mixes records. ``x`` is the
    row (``seq_len = block_size``); ``y[t] = x[t + 1]``, except ``-100`` where that target is
    ``[PAD]`` and at the last position (no next token). This is exactly what transformers'
    causal-LM loss computes from ``labels = input_ids`` with pads set to -100 (GenSLM), but
    with the shift done here.

    Args:
        path: a prepared folder whose meta.json has ``layout == "rows"``.
        batch_size: rows per batch.
        seed, rank: determine the sample sequence.
        split: ``"train"`` or ``"val"``.
    """

    def __init__(self, path: str | os.PathLike, batch_size: int, seed: int = 0, rank: int = 0,
                 split: str = "train") -> None:
        path = Path(path)
        meta = read_meta(path)
        if meta["layout"] != "rows":
            raise DataError(f"{path}: holds a token stream, not padded rows; use MemmapBatches")
        super().__init__(batch_size, int(meta["block_size"]), seed, rank)
        self.vocab_size = meta["vocab_size"]
        self.pad_id = meta["pad_id"]
        self.path = path / meta["splits"][split]["file"]
        tokens = _open_tokens(self.path, np.dtype(meta["dtype"]))
        self.rows = tokens.reshape(-1, self.seq_len)
        if len(self.rows) == 0:
            raise DataError(f"{self.path}: no rows")

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        """One batch ``(x, y)`` of shape ``(batch_size, block_size)``, int64."""
        rows = torch.randint(0, len(self.rows), (self.batch_size,), generator=self.generator)
        x = torch.from_numpy(self.rows[rows.numpy()].astype(np.int64))
        y = torch.full_like(x, IGNORE_INDEX)
        y[:, :-1] = x[:, 1:]
        y[y == self.pad_id] = IGNORE_INDEX
        return x, y


class SyntheticBatches(_Source):
    """Uniform random tokens, for throughput-only runs (``synthetic = True``).

    ``x`` and ``y`` are the two shifts of ``seq_len + 1`` random ids, so a model sees the same
    shapes and dtypes as with real data; the loss stays near ``ln(vocab_size)``.
    """

    synthetic = True

    def __init__(self, vocab_size: int, seq_len: int, batch_size: int, seed: int = 0, rank: int = 0) -> None:
        super().__init__(batch_size, seq_len, seed, rank)
        if vocab_size < 1:
            raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
        self.vocab_size = vocab_size

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = torch.randint(0, self.vocab_size, (self.batch_size, self.seq_len + 1),
                               generator=self.generator, dtype=torch.int64)
        return tokens[:, :-1], tokens[:, 1:]


def open_batches(path: str | os.PathLike, batch_size: int, seq_len: int | None = None, seed: int = 0,
                 rank: int = 0, split: str = "train") -> MemmapBatches | PaddedRowBatches:
    """The right source for a prepared folder: windows for streams, whole rows for rows.

    Args:
        path: a prepared folder (from ``prepare_text`` / ``prepare_fasta``).
        batch_size: samples per batch.
        seq_len: window length for streams (required); for rows it must be None or equal
            ``block_size``.
        seed, rank, split: see the sources.

    Raises:
        DataError: not a prepared folder, too few tokens, or a seq_len / block_size mismatch.
    """
    meta = read_meta(path)
    if meta["layout"] == "rows":
        if seq_len is not None and seq_len != meta["block_size"]:
            raise DataError(f"{path}: rows of block_size {meta['block_size']} cannot give seq_len {seq_len}")
        return PaddedRowBatches(path, batch_size, seed=seed, rank=rank, split=split)
    if seq_len is None:
        raise DataError(f"{path}: a token stream needs a seq_len")
    return MemmapBatches(path, seq_len, batch_size, seed=seed, rank=rank, split=split)
