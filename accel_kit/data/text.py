"""Tokenize a text corpus into ``train.bin`` / ``val.bin`` (GPT-2 pre-training data, or any
tokenizer's: ``tokenizer`` may be the path of a ``tokenizer.json`` or tiktoken file, see
:mod:`accel_kit.tokenizers.files`).

Inputs (any mix, in the order given):

* ``*.jsonl`` / ``*.jsonl.gz``: JSON Lines, one document per line in the ``"text"`` field
  (other fields ignored; blank lines skipped).
* ``*.txt`` / ``*.txt.gz``: **one document per file** (blank lines inside a file are
  paragraph breaks, not document boundaries). For many small documents use JSONL or a folder.
* a folder: every non-hidden ``.jsonl[.gz]`` / ``.txt[.gz]`` file below it, in sorted order;
  or, if it holds ``dataset_info.json`` / ``state.json`` / ``dataset_dict.json``, a Hugging
  Face ``save_to_disk`` folder (read with ``datasets.load_from_disk``, which needs
  ``pip install datasets``; of a DatasetDict only the ``train`` split is read when it exists,
  else every split; the ``text`` column is used).

Each document is tokenized and followed by the tokenizer's ``eos_id`` (GPT-2: 50256); empty
documents are skipped (and counted). Documents are assigned to train / val by a seeded hash
of their index (see :func:`accel_kit.data.store.split_is_val`), so the split does not depend on
batching or worker count, and the output is byte-identical for any ``num_workers``.

Speed: documents are encoded in batches by the Rust tokenizer's thread pool (on 2 cores about
2-3x a one-document-at-a-time loop over transformers' GPT2TokenizerFast; see
benchmarks/prepare_throughput.py). Documents longer than :data:`PIECE_CHARS` are encoded in
pieces cut at line ends (see :func:`split_long_text`); the GPT-2 pre-tokenizer never merges
across such a point, so the ids equal those of the whole text, and a large .txt file is
streamed rather than read whole. A tokenizer file gets the same where its pre-tokenizer is known
to allow it (Llama 3's, cutting after letters and digits only); any other encodes whole documents.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from accel_kit.data.inputs import ByteProgress, Source, decode_utf8, iter_lines, resolve_inputs
from accel_kit.data.store import (
    FORMAT_VERSION, SplitWriter, atomic_output_dir, build_meta, find_reusable, hash_inputs,
    hash_options, token_dtype, write_meta,
)
from accel_kit.errors import DataError, ParameterError
from accel_kit.json_types import JSONObject
from accel_kit.tokenizers import load_tokenizer
from accel_kit.tokenizers.files import FileTokenizer
from accel_kit.tokenizers.gpt2 import CUT_AFTER_CHARS as GPT2_CUT_AFTER

TEXT_KINDS = {".jsonl": "jsonl", ".txt": "txt"}
TEXT_WHAT = ".jsonl, .jsonl.gz, .txt, .txt.gz files or a datasets save_to_disk folder"

#: Longest text encoded in one call; longer documents are cut into pieces (see module doc).
PIECE_CHARS = 1 << 20
#: A batch handed to the Rust thread pool: enough text to keep every core busy.
BATCH_CHARS = 1 << 21
BATCH_PIECES = 4096
#: Seed of the train/val document hash.
SPLIT_SEED = 2357
HF_BATCH_ROWS = 1000

# A piece of a document: (text, is the document's first piece, is its last piece).
Piece = tuple[str, bool, bool]


def split_long_text(text: str, piece_chars: int | None = None, cut_after: str = GPT2_CUT_AFTER) -> list[str]:
    """Cut a long text into pieces whose GPT-2 encodings concatenate to the whole's.

    Each cut is at a line end, between a printable ASCII character (not a space) and the
    ``"\n"`` or ``"\r\n"`` that follows it. The GPT-2 pre-tokenizer regex never joins a
    non-space character with the whitespace after it, and never looks behind, so encoding the
    pieces separately gives the same ids. A text with no such line end stays whole.

    Other tokenizers say after which characters a cut keeps their ids (``cut_after_chars``:
    Llama 3's regex joins punctuation to the newlines after it, so only letters and digits).

    Args:
        text: the document.
        piece_chars: cut at the first eligible line end at or after this many characters
            (default :data:`PIECE_CHARS`).
        cut_after: the characters a cut may follow (default GPT-2's; "" never cuts).

    Returns:
        The pieces, in order (one piece if ``text`` is short or has no cut point).
    """
    piece_chars = piece_chars or PIECE_CHARS
    pieces = []
    start = 0
    while len(text) - start > piece_chars:
        cut = _find_cut(text, start, start + piece_chars, cut_after)
        if cut < 0:
            break
        pieces.append(text[start:cut])
        start = cut
    pieces.append(text[start:])
    return pieces


def _find_cut(text: str, start: int, from_index: int, cut_after: str) -> int:
    """First cut point > start at a newline at or after ``from_index``, or -1 (see above)."""
    newline = text.find("\n", from_index)
    while newline >= 0:
        cut = newline
        while cut > start and text[cut - 1] == "\r":
            cut -= 1
        if cut > start and text[cut - 1] in cut_after:
            return cut
        newline = text.find("\n", newline + 1)
    return -1


# ---------------------------------------------------------------------------------------
# Readers: each yields the pieces of its documents and counts empty documents.


class _Counts:
    def __init__(self) -> None:
        self.skipped_empty = 0


def _document_pieces(text: str, counts: _Counts, cut_after: str) -> Iterator[Piece]:
    if not text:
        counts.skipped_empty += 1
        return
    pieces = split_long_text(text, cut_after=cut_after) if len(text) > PIECE_CHARS else [text]
    last = len(pieces) - 1
    for index, piece in enumerate(pieces):
        yield piece, index == 0, index == last


def _jsonl_pieces(path: Path, progress: ByteProgress, counts: _Counts, cut_after: str) -> Iterator[Piece]:
    for line_number, raw in iter_lines(path, progress):
        line = decode_utf8(raw, path, line_number)
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise DataError(f"{path}:{line_number}: not valid JSON ({error.msg} at column "
                            f"{error.colno})") from None
        if not isinstance(record, dict):
            raise DataError(f"{path}:{line_number}: expected a JSON object with a \"text\" field, "
                            f"got {type(record).__name__}")
        if "text" not in record:
            raise DataError(f"{path}:{line_number}: no \"text\" field (fields: "
                            f"{', '.join(sorted(record)) or 'none'})")
        text = record["text"]
        if not isinstance(text, str):
            raise DataError(f"{path}:{line_number}: \"text\" is {type(text).__name__}, not a string")
        yield from _document_pieces(text, counts, cut_after)


def _txt_pieces(path: Path, progress: ByteProgress, counts: _Counts, cut_after: str) -> Iterator[Piece]:
    """One document per file, streamed: a large file is never held in memory whole."""
    buffer: list[str] = []
    buffered_chars = 0
    threshold = 2 * PIECE_CHARS
    first = True
    for line_number, raw in iter_lines(path, progress):
        line = decode_utf8(raw, path, line_number)
        buffer.append(line)
        buffered_chars += len(line)
        if buffered_chars >= threshold:
            pieces = split_long_text("".join(buffer), cut_after=cut_after)
            for piece in pieces[:-1]:
                yield piece, first, False
                first = False
            buffer, buffered_chars = [pieces[-1]], len(pieces[-1])
            # No cut point found: wait for twice as much text (keeps the joins linear).
            threshold = 2 * PIECE_CHARS if len(pieces) > 1 else 2 * buffered_chars
    text = "".join(buffer)
    if first and not text:
        counts.skipped_empty += 1
        return
    yield text, first, True


def _hf_pieces(source: Source, progress: ByteProgress, counts: _Counts, cut_after: str) -> Iterator[Piece]:
    path = source.path
    try:
        import datasets
    except ImportError:
        raise DataError(f"{path}: is a Hugging Face datasets folder; reading it needs the "
                        f"`datasets` package: pip install datasets") from None
    try:
        loaded = datasets.load_from_disk(str(path))
    except Exception as error:  # noqa: BLE001 - datasets raises many types; report one line
        raise DataError(f"{path}: cannot load the datasets folder "
                        f"({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''})") from None
    if hasattr(loaded, "keys"):  # a DatasetDict
        names = ["train"] if "train" in loaded else list(loaded.keys())
        parts = [(f"{path} [{name}]", loaded[name]) for name in names]
    else:
        parts = [(str(path), loaded)]
    total_rows = sum(len(dataset) for _, dataset in parts) or 1
    size = source.size_bytes
    rows_done = 0
    for label, dataset in parts:
        if "text" not in dataset.column_names:
            raise DataError(f"{label}: no \"text\" column (columns: {', '.join(dataset.column_names)})")
        for start in range(0, len(dataset), HF_BATCH_ROWS):
            texts = dataset[start:start + HF_BATCH_ROWS]["text"]
            for offset, text in enumerate(texts):
                if not isinstance(text, str):
                    raise DataError(f"{label}: row {start + offset}: \"text\" is "
                                    f"{type(text).__name__}, not a string")
                yield from _document_pieces(text, counts, cut_after)
            rows_done += len(texts)
            progress.position = size * rows_done // total_rows
    progress.finish_file(size)


def _all_pieces(sources: Sequence[Source], progress: ByteProgress, counts: _Counts,
                cut_after: str) -> Iterator[Piece]:
    for source in sources:
        if source.kind == "jsonl":
            yield from _jsonl_pieces(source.path, progress, counts, cut_after)
        elif source.kind == "txt":
            yield from _txt_pieces(source.path, progress, counts, cut_after)
        else:
            yield from _hf_pieces(source, progress, counts, cut_after)


def _batches(pieces: Iterator[Piece]) -> Iterator[list[Piece]]:
    batch: list[Piece] = []
    chars = 0
    for piece in pieces:
        batch.append(piece)
        chars += len(piece[0])
        if chars >= BATCH_CHARS or len(batch) >= BATCH_PIECES:
            yield batch
            batch, chars = [], 0
    if batch:
        yield batch


# ---------------------------------------------------------------------------------------
# Tokenize + write


def _configure_workers(num_workers: int | None) -> int:
    """Return the effective worker count; N > 1 sizes the Rust pool if it has not started.

    The Rust ``tokenizers`` thread pool reads ``RAYON_NUM_THREADS`` once, when first used in
    the process; later values are ignored (the pool then keeps its size, normally all cores).
    """
    cores = os.cpu_count() or 1
    if num_workers is None or num_workers <= 0:
        return cores
    if num_workers > 1:
        os.environ.setdefault("RAYON_NUM_THREADS", str(num_workers))
    return num_workers


def encode_pieces_to_stream(pieces: Iterator[Piece], tokenizer, writer: SplitWriter,
                            num_workers: int, on_batch=None) -> None:
    """Encode pieces batch by batch, append EOS after each document, write to the splits.

    Args:
        pieces: ``(text, first piece of doc, last piece of doc)`` in order.
        tokenizer: an accel-kit tokenizer.
        writer: the split writer (decides train / val per document).
        num_workers: 1 encodes one piece per call (single thread); more uses the batch pool.
        on_batch: called after each batch (progress bar updates).
    """
    eos = tokenizer.eos_id
    next_doc = 0  # index of the document the next piece belongs to
    for batch in _batches(pieces):
        texts = [text for text, _, _ in batch]
        if num_workers == 1:
            id_lists = [tokenizer.encode_batch([text], add_special_tokens=False)[0] for text in texts]
        else:
            id_lists = tokenizer.encode_batch(texts, add_special_tokens=False)
        flat: list[int] = []
        starts = []
        doc_of_piece = []
        for (_, _, is_last), ids in zip(batch, id_lists):
            starts.append(len(flat))
            flat.extend(ids)
            if is_last:
                flat.append(eos)
            doc_of_piece.append(next_doc)
            next_doc += is_last
        starts.append(len(flat))
        tokens = np.array(flat, dtype=writer.dtype)
        to_val = writer.splits_for(doc_of_piece[0], doc_of_piece[-1] - doc_of_piece[0] + 1)
        _write_runs(writer, batch, tokens, starts, [bool(to_val[d - doc_of_piece[0]]) for d in doc_of_piece])
        if on_batch is not None:
            on_batch(len(tokens))


def _write_runs(writer: SplitWriter, batch: list[Piece], tokens: np.ndarray, starts: list[int],
                to_val: list[bool]) -> None:
    """Write consecutive pieces that go to the same split with one call each."""
    run_begin = 0
    for index in range(1, len(batch) + 1):
        if index < len(batch) and to_val[index] == to_val[run_begin]:
            continue
        run = range(run_begin, index)
        doc_starts = [starts[i] - starts[run_begin] for i in run if batch[i][1]]
        writer.write("val" if to_val[run_begin] else "train",
                     tokens[starts[run_begin]:starts[index]],
                     n_docs=sum(1 for i in run if batch[i][2]),
                     last_doc_start=doc_starts[-1] if doc_starts else None)
        run_begin = index


def prepare_text(inputs: Sequence[str | os.PathLike], out_dir: str | os.PathLike,
                 tokenizer: str | os.PathLike = "gpt2",
                 val_fraction: float = 0.0005, num_workers: int | None = None,
                 progress: bool = True) -> JSONObject:
    """Tokenize a text corpus into ``out_dir/{train,val}.bin`` + ``meta.json``.

    If ``out_dir`` already holds the output of the same inputs (names and contents) and
    options, it is reused and its meta returned immediately (with ``"reused": True``).

    Args:
        inputs: files or folders (see the module docstring for the formats).
        out_dir: output folder; replaced atomically (never partially written).
        tokenizer: tokenizer name (``gpt2``), or the path of a tokenizer file (a ``tokenizer.json``,
            or a tiktoken BPE file such as Llama 3's ``tokenizer.model``); its name in the meta
            is ``file:<file name>@<sha256[:12]>``, its path and hash in ``tokenizer_file``.
        val_fraction: expected fraction of documents held out for validation, in [0, 1).
            With two or more documents and a positive fraction, val gets at least one.
        num_workers: tokenizer threads: None = all cores, 1 = single-threaded.
        progress: show a tqdm progress bar (stderr) over input bytes.

    Returns:
        The meta dict written to ``meta.json`` (see :func:`accel_kit.data.store.build_meta`).

    Raises:
        DataError: a missing or unsupported input, bad UTF-8 or JSON (``file:line``), a
            corpus with no documents, or an ``out_dir`` that holds foreign files.
        ParameterError: ``val_fraction`` outside [0, 1), or an unknown tokenizer name.
        UnavailableError: a tiktoken file without the tiktoken package.
    """
    if not 0 <= val_fraction < 1:
        raise ParameterError(f"val_fraction must be in [0, 1), got {val_fraction}")
    tok = load_tokenizer(tokenizer)
    sources = resolve_inputs(inputs, TEXT_KINDS, allow_hf=True, what=TEXT_WHAT)
    files = [named for source in sources for named in source.files]
    inputs_sha256 = hash_inputs(files)
    options = {"kind": "text", "format_version": FORMAT_VERSION, "tokenizer": tok.name,
               "val_fraction": val_fraction, "split_seed": SPLIT_SEED,
               "txt_documents": "one per file", "eos_after_document": True}
    out_dir = Path(out_dir)
    reusable = find_reusable(out_dir, inputs_sha256, hash_options(options))
    if reusable is not None:
        return {**reusable, "reused": True}

    workers = _configure_workers(num_workers)
    dtype = token_dtype(tok.vocab_size)
    counts = _Counts()
    byte_progress = ByteProgress()
    with atomic_output_dir(out_dir) as partial:
        with SplitWriter(partial, dtype, val_fraction, SPLIT_SEED) as writer:
            _run_with_progress(sources, tok, writer, workers, counts, byte_progress, progress)
        if writer.documents["train"] + writer.documents["val"] == 0:
            names = ", ".join(str(source.path) for source in sources)
            raise DataError(f"{names}: empty corpus (no non-empty documents)")
        meta = build_meta(
            kind="text", tokenizer=tok, dtype=dtype, layout="stream", block_size=None,
            writer=writer, inputs_sha256=inputs_sha256, options=options,
            inputs=[{"path": str(source.path), "kind": source.kind, "bytes": source.size_bytes}
                    for source in sources],
            extra={"skipped_empty_documents": counts.skipped_empty, "num_workers": workers,
                   **({"tokenizer_file": tok.file_meta()} if isinstance(tok, FileTokenizer) else {})})
        write_meta(partial, meta)
    return meta


def _run_with_progress(sources, tok, writer, workers, counts, byte_progress, progress) -> None:
    from tqdm.auto import tqdm

    total_bytes = sum(source.size_bytes for source in sources)
    with tqdm(total=total_bytes, unit="B", unit_scale=True, unit_divisor=1024, desc="tokenize",
              disable=not progress, dynamic_ncols=True) as bar:
        tokens_done = [0]

        def on_batch(n_tokens: int) -> None:
            tokens_done[0] += n_tokens
            bar.update(byte_progress.done - bar.n)
            bar.set_postfix(tokens=f"{tokens_done[0]:,}", refresh=False)

        # A tokenizer that does not say where a cut keeps its ids gets whole documents.
        pieces = _all_pieces(sources, byte_progress, counts, getattr(tok, "cut_after_chars", ""))
        encode_pieces_to_stream(pieces, tok, writer, workers, on_batch)
        bar.update(byte_progress.done - bar.n)
