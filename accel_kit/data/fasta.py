"""Tokenize FASTA genomes into codon tokens (GenSLM pre-training data).

Reading: ``.fasta .fa .fna .ffn .fas .fsa .seq`` files, optionally ``.gz``, or folders of them
(sorted). A record is a ``>`` header line followed by sequence lines; sequence lines may wrap,
be lower case and end in ``\\r\\n``; whitespace inside them is ignored; ``;`` comment lines are
skipped. Allowed sequence characters are letters and ``* - .`` (IUPAC codes and gaps); any
codon that is not pure ACGT becomes ``[UNK]``. Records with no complete codon are skipped
(and counted).

Two layouts (``block_size``):

* ``None`` (stream): each record's codon ids followed by the tokenizer's ``eos_id`` (codon-71:
  ``[EOS]``; codon-69: ``[SEP]``), concatenated; train on random windows like text.
* an int (rows): GenSLM's rule, i.e. a transformers tokenizer call with
  ``truncation=True, padding="max_length", max_length=block_size``: codon-71 wraps the record
  as ``[BOS] codons [EOS]`` and, if too long, drops codons from the end so that ``[EOS]`` is
  kept (the special tokens count towards ``block_size``); codon-69 adds no special tokens
  and keeps the first ``block_size`` codons. Shorter rows are filled with ``[PAD]``. One row
  per record, ``block_size`` tokens each; batches take whole rows (see
  :class:`accel_kit.data.batches.PaddedRowBatches`).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from accel_kit.data.inputs import ByteProgress, iter_lines, resolve_inputs
from accel_kit.data.store import (
    FORMAT_VERSION, SplitWriter, atomic_output_dir, build_meta, find_reusable, hash_inputs,
    hash_options, token_dtype, write_meta,
)
from accel_kit.errors import DataError, ParameterError
from accel_kit.json_types import JSONObject
from accel_kit.tokenizers import CodonTokenizer, load_tokenizer

FASTA_SUFFIXES = (".fasta", ".fa", ".fna", ".ffn", ".fas", ".fsa", ".seq")
FASTA_KINDS = {suffix: "fasta" for suffix in FASTA_SUFFIXES}
FASTA_WHAT = "FASTA files (" + " ".join(FASTA_SUFFIXES) + ", optionally .gz) or folders of them"
SPLIT_SEED = 2357
#: Records tokenized per batch (a batch is written with one call per split run).
BATCH_RECORDS = 256

_WHITESPACE = b" \t\r\n\v\f"
# Bytes allowed in sequence lines: letters, '*' (stop), '-' and '.' (gaps).
_ALLOWED = bytes(range(ord("A"), ord("Z") + 1)) + bytes(range(ord("a"), ord("z") + 1)) + b"*-."


def read_fasta(path: Path, progress: ByteProgress | None = None) -> Iterator[tuple[str, bytes]]:
    """Yield ``(header, sequence)`` for each record of a FASTA file (plain or .gz).

    The sequence is the concatenation of the record's lines without whitespace, case kept.

    Raises:
        DataError: ``file:line`` for sequence data before the first header or a character
            that cannot be in a sequence; ``file`` for a file with no records.
    """
    header: str | None = None
    chunks: list[bytes] = []
    n_records = 0
    for line_number, raw in iter_lines(path, progress):
        if line_number == 1 and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]  # a UTF-8 byte order mark written by some editors
        if raw.startswith(b">"):
            if header is not None:
                yield header, b"".join(chunks)
                n_records += 1
            header = raw[1:].strip().decode("utf-8", errors="replace")
            chunks = []
            continue
        if raw.startswith(b";"):
            continue
        line = raw.translate(None, _WHITESPACE)
        if not line:
            continue
        if header is None:
            raise DataError(f"{path}:{line_number}: sequence data before the first '>' header")
        bad = line.translate(None, _ALLOWED)
        if bad:
            shown = chr(bad[0]) if 0x21 <= bad[0] <= 0x7E else f"0x{bad[0]:02x}"
            raise DataError(f"{path}:{line_number}: character {shown!r} cannot be part of a "
                            f"nucleotide sequence")
        chunks.append(line)
    if header is not None:
        yield header, b"".join(chunks)
        n_records += 1
    if n_records == 0:
        raise DataError(f"{path}: no FASTA records (expected '>' header lines)")


def record_tokens(tokenizer: CodonTokenizer, sequence: bytes, block_size: int | None) -> np.ndarray:
    """Token ids of one record in the given layout (see the module docstring).

    Args:
        tokenizer: a codon tokenizer.
        sequence: the record's nucleotides.
        block_size: None for the stream layout (codons + eos_id), else the row length.

    Returns:
        int64 ids: codons + EOS/separator (stream), or exactly ``block_size`` ids (rows).
    """
    codons = tokenizer.encode_bytes(sequence)
    if block_size is None:
        return np.concatenate((codons, [tokenizer.eos_id]))
    row = np.full(block_size, tokenizer.pad_id, dtype=np.int64)
    if tokenizer.wraps:
        kept = codons[: block_size - 2]
        row[0] = tokenizer.bos_id
        row[1:1 + len(kept)] = kept
        row[1 + len(kept)] = tokenizer.eos_id
    else:
        kept = codons[:block_size]
        row[: len(kept)] = kept
    return row


def prepare_fasta(inputs: Sequence[str | os.PathLike] | str | os.PathLike, out_dir: str | os.PathLike,
                  tokenizer: str = "codon-71", block_size: int | None = None,
                  val_fraction: float = 0.0005, progress: bool = True) -> JSONObject:
    """Tokenize FASTA records into ``out_dir/{train,val}.bin`` + ``meta.json``.

    Same output format, atomic write and reuse rule as :func:`accel_kit.data.prepare_text`;
    records are split into train / val by the same seeded hash of their index.

    Args:
        inputs: FASTA files or folders.
        out_dir: output folder.
        tokenizer: ``codon-71`` (default) or ``codon-69``.
        block_size: None for one stream of records separated by ``eos_id``; an int for
            fixed rows of that many tokens (GenSLM: 2048).
        val_fraction: expected fraction of records held out, in [0, 1).
        progress: show a tqdm progress bar.

    Returns:
        The meta dict (``layout``, ``block_size``, ``records``, ``truncated_records``,
        ``skipped_records``, ``rules``, split token / record counts ...).

    Raises:
        DataError: missing files, malformed FASTA (``file:line``), no records with codons.
        ParameterError: a non-codon tokenizer, ``block_size`` too small, bad ``val_fraction``.
    """
    tok = load_tokenizer(tokenizer)
    if not isinstance(tok, CodonTokenizer):
        raise ParameterError(f"prepare_fasta needs a codon tokenizer (codon-69, codon-71), got {tokenizer!r}")
    if block_size is not None and block_size < (3 if tok.wraps else 1):
        raise ParameterError(f"block_size must be at least {3 if tok.wraps else 1} for {tok.name}, got {block_size}")
    if not 0 <= val_fraction < 1:
        raise ParameterError(f"val_fraction must be in [0, 1), got {val_fraction}")
    sources = resolve_inputs(inputs, FASTA_KINDS, allow_hf=False, what=FASTA_WHAT)
    inputs_sha256 = hash_inputs([named for source in sources for named in source.files])
    rules = ("non-overlapping codons from position 0; whitespace ignored; case-insensitive; "
             "codons with non-ACGT characters -> [UNK]; trailing partial codon dropped; "
             "records without a complete codon skipped; "
             + ("stream: codons + eos_id per record" if block_size is None else
                ("rows: [BOS] codons [EOS] truncated to keep [EOS], then [PAD]" if tok.wraps
                 else "rows: codons truncated, then [PAD]")))
    options = {"kind": "fasta", "format_version": FORMAT_VERSION, "tokenizer": tok.name,
               "block_size": block_size, "val_fraction": val_fraction, "split_seed": SPLIT_SEED}
    out_dir = Path(out_dir)
    reusable = find_reusable(out_dir, inputs_sha256, hash_options(options))
    if reusable is not None:
        return {**reusable, "reused": True}

    dtype = token_dtype(tok.vocab_size)
    stats = {"skipped_records": 0, "truncated_records": 0, "nucleotides": 0}
    with atomic_output_dir(out_dir) as partial:
        with SplitWriter(partial, dtype, val_fraction, SPLIT_SEED) as writer:
            _tokenize_records(sources, tok, block_size, writer, stats, progress)
        if writer.documents["train"] + writer.documents["val"] == 0:
            names = ", ".join(str(source.path) for source in sources)
            raise DataError(f"{names}: no records with a complete codon")
        meta = build_meta(
            kind="fasta", tokenizer=tok, dtype=dtype, layout="stream" if block_size is None else "rows",
            block_size=block_size, writer=writer, inputs_sha256=inputs_sha256, options=options,
            inputs=[{"path": str(source.path), "kind": source.kind, "bytes": source.size_bytes}
                    for source in sources],
            extra={"records": writer.documents["train"] + writer.documents["val"], **stats,
                   "bos_id": tok.bos_id, "rules": rules})
        write_meta(partial, meta)
    return meta


def _tokenize_records(sources, tok: CodonTokenizer, block_size: int | None, writer: SplitWriter,
                      stats: dict[str, int], progress: bool) -> None:
    from tqdm.auto import tqdm

    byte_progress = ByteProgress()
    capacity = None if block_size is None else (block_size - 2 if tok.wraps else block_size)
    batch: list[np.ndarray] = []
    n_written = 0

    def flush() -> None:
        nonlocal n_written
        to_val = writer.splits_for(n_written, len(batch))
        begin = 0
        for end in range(1, len(batch) + 1):  # one write per run of records in the same split
            if end < len(batch) and to_val[end] == to_val[begin]:
                continue
            run = batch[begin:end]
            tokens = np.concatenate(run).astype(writer.dtype)
            writer.write("val" if to_val[begin] else "train", tokens, n_docs=len(run),
                         last_doc_start=len(tokens) - len(run[-1]))
            begin = end
        n_written += len(batch)
        batch.clear()

    total = sum(source.size_bytes for source in sources)
    with tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc="tokenize",
              disable=not progress, dynamic_ncols=True) as bar:
        for source in sources:
            for _, sequence in read_fasta(source.path, byte_progress):
                n_codons = len(sequence) // 3
                if n_codons == 0:
                    stats["skipped_records"] += 1
                    continue
                stats["nucleotides"] += len(sequence)
                stats["truncated_records"] += capacity is not None and n_codons > capacity
                batch.append(record_tokens(tok, sequence, block_size))
                if len(batch) >= BATCH_RECORDS:
                    flush()
                    bar.update(byte_progress.done - bar.n)
        if batch:
            flush()
        bar.update(byte_progress.done - bar.n)
