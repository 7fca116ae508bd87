"""Data pipelines: tokenize corpora and genomes to memmap files, and batch them for training.

Preparing (writes ``train.bin``, ``val.bin``, ``meta.json``; atomic; reused when unchanged):

* :func:`prepare_text`: JSONL / txt / datasets folders -> GPT-2 tokens (OpenWebText: see
  :mod:`accel_kit.data.corpus`); :func:`prepare_default_text` for the embedded corpus.
* :func:`prepare_fasta`: FASTA genomes -> codon tokens, as a stream or GenSLM padded rows.
* :func:`synthetic_genomes`: a FASTA of SARS-CoV-2-like genomes for runs without real data.
* :func:`tokenizer_of`: the tokenizer a prepared folder's tokens came from (None: synthetic).

Batching (``(x, y)`` int64 tensors, deterministic per ``(seed, rank)``):

* :class:`MemmapBatches` (random windows), :class:`PaddedRowBatches` (whole rows, ``-100``
  targets at padding), :class:`SyntheticBatches` (uniform random tokens), and
  :func:`open_batches` which picks the right one for a prepared folder.
"""
from accel_kit.data.batches import (
    IGNORE_INDEX, MemmapBatches, PaddedRowBatches, SyntheticBatches, open_batches,
)
from accel_kit.data.corpus import default_text_corpus, prepare_default_text
from accel_kit.data.fasta import prepare_fasta, read_fasta
from accel_kit.data.genomes import synthetic_genomes
from accel_kit.data.store import read_meta, tokenizer_of
from accel_kit.data.text import prepare_text

__all__ = [
    "IGNORE_INDEX", "MemmapBatches", "PaddedRowBatches", "SyntheticBatches", "default_text_corpus",
    "open_batches", "prepare_default_text", "prepare_fasta", "prepare_text", "read_fasta",
    "read_meta", "synthetic_genomes", "tokenizer_of",
]
