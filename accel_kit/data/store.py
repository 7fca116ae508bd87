"""The on-disk format of prepared token data, written atomically and reused when unchanged.

A prepared folder holds::

    train.bin   token ids, a flat array in native byte order (np.uint16, or np.uint32 when the
                vocabulary exceeds 65535): read it with np.memmap(path, dtype, mode="r")
    val.bin     the same for the validation split (may be empty)
    meta.json   what the folder holds (written last; see `build_meta` for the fields)

``layout`` in meta.json says how to read the tokens: ``"stream"`` is one long sequence with
``eos_id`` after every document (sample random windows); ``"rows"`` is fixed-length rows of
``block_size`` tokens, one record each, padded with ``pad_id`` (sample whole rows).

Atomicity: everything is written into a hidden sibling folder (named as in
:mod:`accel_kit.atomic`) and renamed onto ``out_dir`` only when complete, so a killed run never
leaves a folder that a later run could mistake for finished output. Stale partial folders of
dead processes are removed by the next run.

Reuse: ``meta.json`` records a sha256 of the inputs (names and contents) and of the options;
a later call with the same hashes returns the existing meta without re-tokenizing.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np

from accel_kit.atomic import fsync_dir, fsync_path, partial_path, remove_stale_partials
from accel_kit.errors import DataError
from accel_kit.json_types import JSONObject

#: Version of the folder format; part of the options hash, so bumping it invalidates caches.
FORMAT_VERSION = 1
FORMAT_NAME = "accel-kit-tokens"
SPLITS = ("train", "val")
_HASH_BLOCK_BYTES = 1 << 20


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits (GPT-2's 50257 does), else uint32."""
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


# ---------------------------------------------------------------------------------------
# Hashing


def hash_inputs(files: Sequence[tuple[str, Path]]) -> str:
    """sha256 over the names, sizes and contents of the input files, in order.

    Args:
        files: ``(name, path)`` pairs; ``name`` is what identifies the file (its base name, or
            its path relative to an input folder), so moving a corpus keeps the hash.
    """
    digest = hashlib.sha256()
    for name, path in files:
        digest.update(f"{len(name)}:{name}:{path.stat().st_size}:".encode())
        with open(path, "rb") as handle:
            while block := handle.read(_HASH_BLOCK_BYTES):
                digest.update(block)
    return digest.hexdigest()


def hash_options(options: JSONObject) -> str:
    """sha256 of the canonical JSON of the options that change the output."""
    return hashlib.sha256(json.dumps(options, sort_keys=True).encode()).hexdigest()


# ---------------------------------------------------------------------------------------
# Reading meta / reuse


def read_meta(out_dir: str | os.PathLike) -> JSONObject:
    """Read and check the meta.json of a prepared folder.

    Raises:
        DataError: no meta.json, or not an accel-kit token folder, or a .bin file whose size
            does not match its token count (a damaged folder).
    """
    out_dir = Path(out_dir)
    meta = _try_read_meta(out_dir)
    if meta is None:
        raise DataError(f"{out_dir / 'meta.json'}: missing or not an accel-kit prepared data folder "
                        f"(run `accel-kit prepare` first)")
    problem = _check_bins(out_dir, meta)
    if problem:
        raise DataError(problem)
    return meta


def tokenizer_of(data_path: str | os.PathLike | None) -> str | None:
    """Which tokenizer made a point's data: None for synthetic data (no folder), else the name in
    the prepared folder's meta (``gpt2``, ``codon-71``, ``file:tokenizer.model@<sha256[:12]>``).

    Raises:
        DataError: ``data_path`` is not a prepared folder (see :func:`read_meta`).
    """
    return None if data_path is None else read_meta(data_path)["tokenizer"]


def _try_read_meta(out_dir: Path) -> JSONObject | None:
    """meta.json as a dict if it exists and is ours, else None."""
    try:
        meta = json.loads((out_dir / "meta.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_NAME:
        return None
    return meta


def _check_bins(out_dir: Path, meta: JSONObject) -> str | None:
    """A one-line problem if a split's .bin is missing or of the wrong size, else None."""
    try:
        itemsize = np.dtype(meta["dtype"]).itemsize
        for split in SPLITS:
            info = meta["splits"][split]
            path = out_dir / info["file"]
            expected = int(info["tokens"]) * itemsize
            if not path.is_file():
                return f"{path}: missing (the folder is incomplete; prepare it again)"
            if path.stat().st_size != expected:
                return (f"{path}: {path.stat().st_size} bytes, expected {expected} "
                        f"(the folder is damaged; prepare it again)")
    except (KeyError, TypeError, ValueError) as error:
        return f"{out_dir / 'meta.json'}: malformed ({error})"
    return None


def find_reusable(out_dir: Path, inputs_sha256: str, options_sha256: str) -> JSONObject | None:
    """The meta of ``out_dir`` if it was prepared from the same inputs and options, else None."""
    meta = _try_read_meta(out_dir)
    if meta is None or meta.get("inputs_sha256") != inputs_sha256 \
            or meta.get("options_sha256") != options_sha256 or _check_bins(out_dir, meta):
        return None
    return meta


# ---------------------------------------------------------------------------------------
# Atomic output folder


def _check_replaceable(out_dir: Path) -> None:
    """Refuse to replace a folder that is neither empty nor accel-kit prepared output."""
    if not out_dir.exists():
        return
    if not out_dir.is_dir():
        raise DataError(f"{out_dir}: exists and is not a folder")
    if any(out_dir.iterdir()) and _try_read_meta(out_dir) is None:
        raise DataError(f"{out_dir}: exists and is not an accel-kit prepared data folder; "
                        f"remove it or choose another --out")


@contextmanager
def atomic_output_dir(out_dir: Path) -> Iterator[Path]:
    """Yield a fresh partial folder beside ``out_dir``; on success rename it onto ``out_dir``.

    The folder-wise form of :func:`accel_kit.atomic.atomic_path` (same partial naming and
    stale clean-up). ``os.replace`` cannot replace a non-empty folder, so a previous
    ``out_dir`` (empty, or an older accel-kit preparation) is first renamed aside, then
    deleted. On error or interruption the partial folder is deleted and ``out_dir`` is left
    untouched.

    Raises:
        DataError: ``out_dir`` holds something else (we never delete foreign files).
    """
    out_dir = out_dir.absolute()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    _check_replaceable(out_dir)
    remove_stale_partials(out_dir)
    partial = partial_path(out_dir)
    partial.mkdir()
    try:
        yield partial
        for path in partial.iterdir():
            fsync_path(path)
        old = out_dir.parent / f".{out_dir.name}.old-{partial.name.rsplit('.partial-', 1)[1]}"
        if out_dir.exists():
            os.rename(out_dir, old)
        os.rename(partial, out_dir)
        fsync_dir(out_dir.parent)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        if partial.exists():
            shutil.rmtree(partial, ignore_errors=True)


# ---------------------------------------------------------------------------------------
# Writing the splits


def split_is_val(doc_indices: np.ndarray, val_fraction: float, seed: int) -> np.ndarray:
    """Which documents go to the validation split: a seeded hash of the document index.

    A splitmix64 hash of ``(seed, index)`` mapped to [0, 1) is compared with
    ``val_fraction``: deterministic, streaming (no need to know the document count), and
    independent of how documents are batched.
    """
    if val_fraction <= 0:
        return np.zeros(len(doc_indices), dtype=bool)
    with np.errstate(over="ignore"):
        z = doc_indices.astype(np.uint64) + np.uint64((seed * 0x9E3779B97F4A7C15) % (1 << 64))
        z = (z + np.uint64(0x9E3779B97F4A7C15))
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(np.float64) / float(1 << 53) < val_fraction


class SplitWriter:
    """Append documents' tokens to ``train.bin`` / ``val.bin`` in a folder.

    Documents are assigned to splits by :func:`split_is_val`. At :meth:`close`, if
    ``val_fraction > 0`` and there are at least two documents but the hash put none of them
    in validation (a tiny corpus), the last document is moved from train to val; likewise
    the last val document moves to train if train would be empty. So a split asked for is
    never empty when it can be filled.

    The files are written in place, not each through :func:`accel_kit.atomic.atomic_path`:
    the three files of a folder must change together (publishing each on its own would let a
    reader pair a new train.bin with an old meta.json), so ``folder`` is the partial folder of
    :func:`atomic_output_dir`, which publishes them at once; and the fix-up at :meth:`close`
    edits both .bin files after they are written.

    Args:
        folder: where the .bin files go (the partial folder of :func:`atomic_output_dir`).
        dtype: token dtype.
        val_fraction: expected fraction of documents in val, in [0, 1).
        seed: seed of the split hash.
    """

    def __init__(self, folder: Path, dtype: np.dtype, val_fraction: float, seed: int) -> None:
        self.dtype = np.dtype(dtype)
        self.val_fraction = val_fraction
        self.seed = seed
        self.paths = {split: folder / f"{split}.bin" for split in SPLITS}
        self._files = {split: open(path, "wb") for split, path in self.paths.items()}
        self.tokens = dict.fromkeys(SPLITS, 0)
        self.documents = dict.fromkeys(SPLITS, 0)
        # Token offset where each split's most recent document starts (for the final fix-up).
        self._last_start = dict.fromkeys(SPLITS, 0)

    def splits_for(self, first_doc: int, n_docs: int) -> np.ndarray:
        """Boolean 'goes to val' for documents ``first_doc .. first_doc + n_docs - 1``."""
        return split_is_val(np.arange(first_doc, first_doc + n_docs), self.val_fraction, self.seed)

    def write(self, split: str, tokens: np.ndarray, n_docs: int, last_doc_start: int | None) -> None:
        """Append a run of whole documents (or one document's continuation) to a split.

        Args:
            split: ``"train"`` or ``"val"``.
            tokens: the ids, already in ``self.dtype``.
            n_docs: how many documents this run completes.
            last_doc_start: offset within ``tokens`` where the last document that starts in
                this run begins, or None if none starts here (a continuation piece).
        """
        if last_doc_start is not None:
            self._last_start[split] = self.tokens[split] + last_doc_start
        self._files[split].write(np.ascontiguousarray(tokens).data)
        self.tokens[split] += len(tokens)
        self.documents[split] += n_docs

    def __enter__(self) -> "SplitWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        # Success: flush and fix up the splits. Failure: just close; the caller's atomic
        # output folder is discarded, so no fix-up is wasted on a partial corpus.
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def abort(self) -> None:
        """Close the files after an error (the partial folder is deleted by the caller)."""
        for handle in self._files.values():
            handle.close()

    def close(self) -> None:
        """Flush the files and apply the non-empty-split fix-up."""
        for handle in self._files.values():
            handle.close()
        if self.val_fraction > 0 and self.documents["train"] + self.documents["val"] >= 2:
            if self.documents["val"] == 0:
                self._move_last_document("train", "val")
            elif self.documents["train"] == 0:
                self._move_last_document("val", "train")

    def _move_last_document(self, source: str, target: str) -> None:
        """Move the last document of ``source`` to the end of ``target`` (streamed copy)."""
        itemsize = self.dtype.itemsize
        start = self._last_start[source]
        with open(self.paths[source], "r+b") as src, open(self.paths[target], "ab") as dst:
            src.seek(start * itemsize)
            shutil.copyfileobj(src, dst, _HASH_BLOCK_BYTES)
            src.truncate(start * itemsize)
        moved = self.tokens[source] - start
        self.tokens[source] -= moved
        self.tokens[target] += moved
        self.documents[source] -= 1
        self.documents[target] += 1


def build_meta(*, kind: str, tokenizer, dtype: np.dtype, layout: str, block_size: int | None,
               writer: SplitWriter, inputs: Iterable[JSONObject], inputs_sha256: str,
               options: JSONObject, extra: JSONObject | None = None) -> JSONObject:
    """The meta.json contents of a prepared folder.

    Fields: ``format``, ``format_version``, ``kind`` (text / fasta), ``accel_kit_version``,
    ``created`` (UTC, informative only), ``tokenizer``, ``vocab_size``, ``eos_id``,
    ``pad_id``, ``dtype``, ``layout`` (stream / rows), ``block_size``, ``splits`` (per split:
    ``file``, ``tokens``, ``documents``), ``documents`` and ``tokens`` (totals), ``inputs``
    (path, name, bytes), ``inputs_sha256``, ``options``, ``options_sha256``, plus ``extra``.
    """
    from accel_kit import __version__

    meta: JSONObject = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "kind": kind,
        "accel_kit_version": __version__,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "tokenizer": tokenizer.name,
        "vocab_size": tokenizer.vocab_size,
        "eos_id": tokenizer.eos_id,
        "pad_id": tokenizer.pad_id,
        "dtype": np.dtype(dtype).name,
        "layout": layout,
        "block_size": block_size,
        "splits": {split: {"file": f"{split}.bin", "tokens": writer.tokens[split],
                           "documents": writer.documents[split]} for split in SPLITS},
        "documents": sum(writer.documents.values()),
        "tokens": sum(writer.tokens.values()),
        "inputs": list(inputs),
        "inputs_sha256": inputs_sha256,
        "options": options,
        "options_sha256": hash_options(options),
    }
    meta.update(extra or {})
    return meta


def write_meta(folder: Path, meta: JSONObject) -> None:
    """Write meta.json (pretty-printed, so people can read it)."""
    (folder / "meta.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
