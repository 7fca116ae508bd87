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
