"""Atomic file output: a file appears complete under its name, or not at all.

Everything accel-kit writes whole (a worker's result JSON, a generated FASTA, a job script,
a figure) is written to a hidden sibling ``.<name>.partial-<pid>@<host>-<random>``, flushed
to disk, then renamed onto the target with ``os.replace``, which is atomic on POSIX and on
Windows within one filesystem; that is why the temporary is a sibling and not in /tmp. A
reader therefore sees the old file or the new one, never a truncated mix, and a process
killed mid-write leaves only the hidden partial, which the next write to the same target
removes once its process is gone.

Prepared data folders (``accel_kit.data.store.atomic_output_dir``) follow the same rule
folder-wise and share the partial naming and clean-up here. JSON Lines records are appended,
not replaced, and have their own rule (``accel_kit.results.append_record``).
"""
from __future__ import annotations

import errno
import glob
import json
import os
import secrets
import shutil
import socket
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from accel_kit.errors import OutputError

_PARTIAL = ".partial-"
# The host is part of the owner tag because a pid means nothing on another machine: on a
# filesystem shared by several nodes, a partial whose pid is not alive *here* may still be
# being written there.
_HOST = socket.gethostname().split(".")[0] or "localhost"


def partial_path(target: str | os.PathLike) -> Path:
    """A fresh hidden sibling of ``target`` to write into, named after this process and host."""
    target = Path(target)
    return target.with_name(f".{target.name}{_PARTIAL}{os.getpid()}@{_HOST}-{secrets.token_hex(4)}")


def _owner_alive(owner: str) -> bool:
    """Whether the process that named a partial ``<pid>[@<host>]`` may still be writing it."""
    pid_text, _, host = owner.partition("@")
    if host and host != _HOST:
        return True  # another machine's process: we cannot tell, so keep it
    try:
        pid = int(pid_text)
    except ValueError:
        return True  # not one of ours
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    return True


def remove_stale_partials(target: str | os.PathLike) -> None:
    """Delete the partial files or folders of ``target`` left by processes that no longer exist."""
    target = Path(target)
    prefix = f".{target.name}{_PARTIAL}"
    for partial in target.parent.glob(f"{glob.escape(prefix)}*"):  # escaped: a name may hold [ ] * ?
        # "<pid>@<host>-<random>" (or "<pid>-<random>" from before the host was added)
        owner = partial.name[len(prefix):].rsplit("-", 1)[0]
        if not _owner_alive(owner):
            if partial.is_dir() and not partial.is_symlink():
                shutil.rmtree(partial, ignore_errors=True)
            else:
                partial.unlink(missing_ok=True)


def fsync_path(path: str | os.PathLike) -> None:
    """Flush a file's data to disk (before a rename publishes it: power-loss safety)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(folder: str | os.PathLike) -> None:
    """Flush a folder's entries, so a rename into it survives a power loss (best effort)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # e.g. Windows cannot open a folder; the rename is still atomic
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems (and platforms) refuse fsync on a folder
    finally:
        os.close(fd)


# What the user's disk or folder, not accel-kit, is the cause of (a full disk or quota, a file over the
# size limit, a read-only or forbidden folder): one line naming the path, not a traceback.
_ENVIRONMENT_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM})


@contextmanager
def output_errors(path: str | os.PathLike, what: str, folder: str | os.PathLike | None = None) -> Iterator[None]:
    """Turn an OSError from writing ``what`` at ``path`` that the user's environment caused into one
    OutputError line naming the path: a full disk (ENOSPC), a quota (EDQUOT), a size limit (EFBIG), a
    read-only or forbidden folder (EROFS, EACCES, EPERM), or its folder removed meanwhile (ENOENT or
    ENOTDIR while the folder is gone; ``folder`` is the folder meant, by default ``path``'s). Any other
    OSError is a bug and keeps its traceback.
    """
    try:
        yield
    except OSError as exc:
        folder = Path(folder if folder is not None else Path(path).parent)
        removed = exc.errno in (errno.ENOENT, errno.ENOTDIR) and not folder.is_dir()
        if exc.errno not in _ENVIRONMENT_ERRNOS and not removed:
            raise
        why = f"its folder {str(folder)!r} is gone (removed during the run?)" if removed else exc.strerror or str(exc)
        raise OutputError(f"cannot write the {what} {str(path)!r}: {why}", str(path), exc.errno) from exc


@contextmanager
def atomic_path(target: str | os.PathLike, what: str = "file") -> Iterator[Path]:
    """Yield a temporary path beside ``target``; once the block succeeds it replaces ``target``.

    The block creates the file at the yielded path and closes it (any writer works: ``open``,
    ``gzip``, ``write_html``). On success the file is fsynced and renamed onto ``target``
    (replacing an existing file). On an exception, including KeyboardInterrupt, the temporary
    file is removed and ``target`` is left as it was.

    Args:
        target: the file to produce; its folder is created if missing.
        what: what the file is, for the one-line error (e.g. "figure").

    Raises:
        FileNotFoundError: the block did not create the file.
        OutputError: the disk, a quota or the folder refused the file (see :func:`output_errors`).
    """
    target = Path(target)
    with output_errors(target, what):
        target.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_partials(target)
    tmp = partial_path(target)
    try:
        with output_errors(target, what):
            yield tmp
            fsync_path(tmp)
            os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(target.parent)


def write_bytes_atomic(path: str | os.PathLike, data: bytes, what: str = "file") -> None:
    """Write ``data`` to ``path`` atomically (see :func:`atomic_path`)."""
    with atomic_path(path, what) as tmp:
        tmp.write_bytes(data)


def write_text_atomic(path: str | os.PathLike, text: str, encoding: str = "utf-8", what: str = "file") -> None:
    """Write ``text`` to ``path`` atomically (see :func:`atomic_path`)."""
    write_bytes_atomic(path, text.encode(encoding), what)


def write_json_atomic(path: str | os.PathLike, data: object, what: str = "file") -> None:
    """Write ``data`` as compact JSON atomically; values JSON lacks (paths, dtypes) become ``str``."""
    write_text_atomic(path, json.dumps(data, default=str), what=what)
