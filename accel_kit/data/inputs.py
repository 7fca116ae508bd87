"""Resolving input paths into files, and reading them line by line with good errors."""
from __future__ import annotations

import gzip
import os
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Iterator, Sequence

from accel_kit.errors import DataError

#: Files whose presence marks a Hugging Face ``save_to_disk`` folder (Dataset or DatasetDict).
HF_MARKERS = ("dataset_info.json", "state.json", "dataset_dict.json")


@dataclass
class Source:
    """One input as given by the user, expanded into the files it covers.

    Attributes:
        path: the path as given.
        kind: ``"jsonl"``, ``"txt"``, ``"hf"`` (a datasets folder) or ``"fasta"``.
        files: ``(name, path)`` of every file that makes up the input, in reading order;
            ``name`` is stable under moving the input (used for hashing and in meta.json).
    """

    path: Path
    kind: str
    files: list[tuple[str, Path]] = field(default_factory=list)

    @property
    def size_bytes(self) -> int:
        return sum(path.stat().st_size for _, path in self.files)


def file_kind(path: Path, kinds: dict[str, str]) -> str | None:
    """The kind of a file from its (possibly .gz) suffix, per ``kinds`` (suffix -> kind)."""
    name = path.name.lower()
    if name.endswith(".gz"):
        name = name[:-3]
    return kinds.get(Path(name).suffix)


def resolve_inputs(inputs: Sequence[str | os.PathLike] | str | os.PathLike, kinds: dict[str, str], *, allow_hf: bool,
                   what: str) -> list[Source]:
    """Check that the inputs exist and expand folders into their files.

    A folder is a Hugging Face datasets folder if ``allow_hf`` and it holds one of
    :data:`HF_MARKERS`; otherwise every non-hidden file below it with a known suffix, in
    sorted order.

    Args:
        inputs: files or folders.
        kinds: known file suffix (without ``.gz``) -> kind, e.g. ``{".jsonl": "jsonl"}``.
        allow_hf: recognise datasets folders.
        what: a description of accepted files, for error messages.

    Raises:
        DataError: no inputs, a missing path, an unsupported file, a folder without inputs.
    """
    if isinstance(inputs, (str, os.PathLike)):
        inputs = [inputs]
    if not inputs:
        raise DataError(f"no input files given (expected {what})")
    sources = []
    for given in inputs:
        path = Path(given)
        if not path.exists():
            raise DataError(f"{path}: no such file or folder")
        if path.is_dir():
            if allow_hf and any((path / marker).is_file() for marker in HF_MARKERS):
                files = sorted(p for p in path.rglob("*") if p.is_file())
                sources.append(Source(path, "hf", [(f"{path.name}/{p.relative_to(path).as_posix()}", p)
                                                   for p in files]))
                continue
            found = 0
            # One Source per file (sorted by path) keeps readers and error messages simple.
            for file in sorted(p for p in path.rglob("*") if p.is_file()):
                if any(part.startswith(".") for part in file.relative_to(path).parts):
                    continue  # hidden files and folders (editor backups, caches)
                kind = file_kind(file, kinds)
                if kind is not None:
                    name = f"{path.name}/{file.relative_to(path).as_posix()}"
                    sources.append(Source(file, kind, [(name, file)]))
                    found += 1
            if not found:
                raise DataError(f"{path}: folder holds no input files (expected {what})")
            continue
        kind = file_kind(path, kinds)
        if kind is None:
            raise DataError(f"{path}: unsupported input (expected {what})")
        sources.append(Source(path, kind, [(path.name, path)]))
    return sources


class ByteProgress:
    """Input bytes consumed so far, read by the progress bar between batches.

    Readers set ``position`` (bytes of the current file, compressed for .gz) as they go;
    ``base`` is the size of the files already finished.
    """

    def __init__(self) -> None:
        self.base = 0
        self.position = 0

    @property
    def done(self) -> int:
        return self.base + self.position

    def finish_file(self, size: int) -> None:
        self.base += size
        self.position = 0


def iter_lines(path: Path, progress: ByteProgress | None = None) -> Iterator[tuple[int, bytes]]:
    """Yield ``(line_number, raw_line_bytes)`` of a plain or gzip-compressed file.

    Lines keep their terminator. ``progress.position`` follows the on-disk (compressed)
    offset so that a progress bar over file sizes is accurate for .gz files too.

    Raises:
        DataError: the file cannot be opened, or is a damaged gzip file.
    """
    try:
        raw: BinaryIO = open(path, "rb")
    except OSError as error:
        raise DataError(f"{path}: cannot open ({error.strerror})") from None
    with raw:
        stream: BinaryIO = gzip.GzipFile(fileobj=raw, mode="rb") if path.name.lower().endswith(".gz") else raw
        try:
            for line_number, line in enumerate(stream, 1):
                if progress is not None:
                    progress.position = raw.tell()
                yield line_number, line
        except (gzip.BadGzipFile, EOFError, zlib.error) as error:
            raise DataError(f"{path}: not a valid gzip file ({error})") from None
    if progress is not None:
        progress.finish_file(path.stat().st_size)


def decode_utf8(line: bytes, path: Path, line_number: int) -> str:
    """Decode one line as strict UTF-8 (a BOM on line 1 is dropped).

    Raises:
        DataError: ``path:line: not valid UTF-8 ...``.
    """
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as error:
        raise DataError(f"{path}:{line_number}: not valid UTF-8 (byte 0x{line[error.start]:02x} "
                        f"at column {error.start + 1})") from None
    if line_number == 1 and text.startswith("\ufeff"):
        text = text[1:]
    return text
