"""Where the project's parameter files live and where results go."""
from __future__ import annotations

import os
from pathlib import Path

from accel_kit.errors import AccelKitError

_PACKAGE_DIR = Path(__file__).resolve().parent


def project_root() -> Path:
    """The folder holding ``params/``: $ACCEL_KIT_ROOT, the checkout this package lives in, or a parent of cwd."""
    env = os.environ.get("ACCEL_KIT_ROOT")
    candidates = [Path(env)] if env else []
    candidates.append(_PACKAGE_DIR.parent)
    cwd = Path.cwd().resolve()
    candidates += [cwd, *cwd.parents]
    for path in candidates:
        if (path / "params" / "systems").is_dir():
            return path
    raise AccelKitError("cannot find the accel-kit params/ folder: run from the project checkout or set ACCEL_KIT_ROOT")


def params_dir() -> Path:
    return project_root() / "params"


def output_dir(explicit: str | os.PathLike | None = None) -> Path:
    """Results root: the argument, else $ACCEL_KIT_OUTPUT_DIR, else <project>/outputs."""
    if explicit:
        return Path(explicit)
    env = os.environ.get("ACCEL_KIT_OUTPUT_DIR")
    return Path(env) if env else project_root() / "outputs"


def output_dir_origin(explicit: str | os.PathLike | None = None) -> str:
    """Where ``output_dir(explicit)`` comes from, for messages: the argument, $ACCEL_KIT_OUTPUT_DIR or the default."""
    if explicit:
        return "--output-dir / output_dir"
    if os.environ.get("ACCEL_KIT_OUTPUT_DIR"):
        return f"$ACCEL_KIT_OUTPUT_DIR={os.environ['ACCEL_KIT_OUTPUT_DIR']}"
    return "the default, <project>/outputs"


def writable_dir(path: str | os.PathLike, what: str) -> Path:
    """Create the folder ``path`` (and its parents) and a temporary file in it, so that a run that
    would write there fails now, in one line, rather than after its work is done.

    Args:
        path: the folder.
        what: what the folder is, for the message (e.g. "output folder (from $ACCEL_KIT_OUTPUT_DIR=/x)").

    Returns:
        ``path`` as a Path (it exists and takes files).

    Raises:
        AccelKitError: naming the folder and why it cannot be written (a missing or read-only
            parent, a file in the way, no permission, a full disk).
    """
    import tempfile

    path = Path(path)
    blocked = next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), None)
    if blocked is not None:
        raise AccelKitError(f"{what} {str(path)!r} cannot be written: {str(blocked)!r} is a file, not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".accel-kit-write-check-"):
            pass
    except OSError as exc:
        # Name the parent that could not be made; not the folder itself, nor the random temporary file.
        failed = Path(exc.filename) if exc.filename else None
        where = f": {str(failed)!r}" if failed is not None and failed in path.parents else ""
        raise AccelKitError(f"{what} {str(path)!r} cannot be written: {exc.strerror or exc}{where}") from None
    return path


def writable_file(path: str | os.PathLike, what: str) -> Path:
    """``path``, once its folder passed ``writable_dir`` (created, takes files); the same one-line error otherwise."""
    path = Path(path)
    if path.is_dir():
        raise AccelKitError(f"{what} {str(path)!r} is a folder; give a file name")
    writable_dir(path.parent, f"the folder of the {what}")
    return path
