"""Result records: one JSON object per measured point, appended atomically to JSON Lines files.

A record carries everything needed to trust and re-run the number:
schema version, study, system, device, model, the fully resolved parameters, the
environment (versions, hardware, git commit, math mode), a status with its reason, the
per-trial times and the derived metrics with units in their names. "Not measured" is a
missing metric with a reason, never 0.

Durability: each record is serialised first and written with one ``write`` on an
``O_APPEND`` descriptor, then fsynced. A process killed mid-write can at worst leave a
final line without its newline; the next append cuts that fragment off, and ``load``
skips it, so no half-written record is ever read.
"""
from __future__ import annotations

import datetime as _dt
import functools
import hashlib
import importlib.metadata
import json
import math
import os
import platform
import socket
import subprocess
import sys
import uuid
import warnings
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

from accel_kit import SCHEMA_VERSION, __version__

STATUSES = ("ok", "oom", "error", "unsupported", "skipped")


def new_run_id() -> str:
    """Identifier shared by the records of one invocation of a study."""
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + uuid.uuid4().hex[:6]


def make_record(*, study: str, system: str, status: str, params: dict[str, Any], run_id: str,
                kind: str | None = None, device: str | None = None, model: str | None = None, reason: str | None = None,
                metrics: dict[str, Any] | None = None, times_s: list[float] | None = None,
                warmup_times_s: list[float] | None = None, env: dict[str, Any] | None = None,
                traceback: str | None = None) -> dict:
    """Build one record. ``status`` other than ok needs a ``reason``; ``traceback`` keeps the full story.

    ``kind``: the point's kind (None: the study's, ``kind_of_study``). ``metrics``: names declared in
    ``accel_kit.metrics`` (tests check that every metric a real record carries is declared).
    """
    if status not in STATUSES:
        raise ValueError(f"status must be one of {STATUSES}, got {status!r}")
    if status != "ok" and not reason:
        raise ValueError(f"a record with status {status!r} needs a reason")
    return {
        "schema_version": SCHEMA_VERSION,
        "record_id": uuid.uuid4().hex,
        "run_id": run_id,
        "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "study": study,
        "kind": kind or kind_of_study(study),
        "system": system,
        "device": device,
        "model": model,
        "status": status,
        "reason": reason,
        "params": params,
        "metrics": {k: _finite(v) for k, v in (metrics or {}).items()},
        "times_s": times_s or [],
        "warmup_times_s": warmup_times_s or [],
        "env": env or {},
        "traceback": traceback,
    }


def precision_text(params: dict) -> str:
    """A record's precision for a reader: ``bf16, asked auto. Why: ...``: what ran, what was asked, then the
    reason without the "auto: bf16 (...)" wrapper that repeats the precision (a run-on sentence otherwise)."""
    ran, asked = params.get("precision") or "?", params.get("precision_requested")
    reason = (params.get("precision_reason") or "").strip()
    for prefix in (f"{asked}: {ran}" if asked else None, f"auto: {ran}", ran):
        if prefix and reason.startswith(prefix):
            reason = reason[len(prefix):].strip(" :")
            break
    if reason.startswith("(") and reason.endswith(")"):
        reason = reason[1:-1]
    head = f"{ran}, asked {asked}" if asked and asked != ran else ran
    return f"{head}. Why: {reason}" if reason else f"{head} (no reason recorded)"


def kind_of_study(study: str) -> str:
    """The point kind of a study's records: the microbenchmark times blocks, every other study trains."""
    return "block" if study == "microbenchmark" else "train"


# A training record's parallel layout as columns (``accel_kit.engine.layout``), at the training point's
# defaults (``accel_kit.engine.point.TrainSpec``) where a record predates them: one model replica per
# device, under the engine it names (ddp where it names none), no context parallelism.
LAYOUT_DEFAULTS: dict[str, Any] = {"tp": 1, "pp": 1, "cp": 1, "engine": "ddp"}
# The device mesh's dimensions, outermost first (torchtitan's order): tp innermost, as its all-reduces run
# in every block, then cp, whose ring exchanges keys and values once per block. The engine builds its mesh
# in this order (accel_kit.engine.layout) and records name it so (``mesh_label``).
MESH_DIMS = ("pp", "dp", "cp", "tp")


def mesh_label(**sizes: int) -> str:
    """The mesh as a record's ``mesh`` shows it, ``pp 1 x dp 2 x cp 1 x tp 1``, from each of ``MESH_DIMS``' sizes."""
    return " x ".join(f"{name} {sizes[name]}" for name in MESH_DIMS)


def upgrade(record: dict) -> dict:
    """A record of an older schema in the current one's shape (version 1 had no ``kind``; a training
    record before the parallel layouts had no ``tp``, ``pp``, ``cp``, ``dp`` or ``mesh``); others as they are."""
    if record.get("schema_version", 1) < 2 and "kind" not in record and "study" in record:
        record = dict(record)
        record["kind"] = kind_of_study(record["study"])
    if record.get("kind") == "train" and isinstance(record.get("params"), dict):
        record = _with_layout(record)
    return record


def _with_layout(record: dict) -> dict:
    params, metrics = record["params"], record.get("metrics") or {}
    missing = {k: v for k, v in LAYOUT_DEFAULTS.items() if k not in params}
    dp = metrics.get("dp", metrics.get("data_parallel_size"))
    derived = {}
    if "dp" not in metrics and dp is not None:
        derived["dp"] = dp
    if "mesh" not in metrics and dp is not None:
        layout = LAYOUT_DEFAULTS | params
        derived["mesh"] = mesh_label(pp=layout["pp"], dp=dp, cp=layout["cp"], tp=layout["tp"])
    if not missing and not derived:
        return record
    return dict(record, params=missing | params, metrics=metrics | derived)


def _finite(value: Any) -> Any:
    # JSON has no NaN/inf; a non-finite metric is "not measured", i.e. null.
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def append_record(path: str | os.PathLike, record: dict) -> None:
    """Append ``record`` to the JSON Lines file ``path`` (created with its folder if missing)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = (json.dumps(record, default=str, allow_nan=False) + "\n").encode()
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        _drop_partial_tail(fd)
        view = memoryview(line)
        while view:  # a regular-file write is all-or-nothing in practice; loop for the rare short write
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)


def _drop_partial_tail(fd: int) -> None:
    """Cut a final line that lacks its newline (left by a writer killed mid-write)."""
    size = os.fstat(fd).st_size
    if size == 0:
        return
    if os.pread(fd, 1, size - 1) == b"\n":
        return
    chunk = 1 << 16
    end = size
    while end > 0:
        start = max(0, end - chunk)
        data = os.pread(fd, end - start, start)
        nl = data.rfind(b"\n")
        if nl >= 0:
            os.ftruncate(fd, start + nl + 1)
            return
        end = start
    os.ftruncate(fd, 0)


def iter_records(path: str | os.PathLike) -> Iterable[dict]:
    """Records from a .jsonl file or every .jsonl under a folder; incomplete lines are skipped."""
    path = Path(path)
    files = sorted(path.rglob("*.jsonl")) if path.is_dir() else [path]
    for file in files:
        with open(file, "rb") as f:
            yield from read_jsonl(f, str(file))


def read_jsonl(lines: Iterable[bytes], name: str) -> Iterable[dict]:
    """Records from the lines of one JSON Lines file (``name`` for messages); an incomplete
    final line is skipped with a warning, a line that is not JSON is a one-line DataError."""
    from accel_kit.errors import DataError

    for lineno, raw in enumerate(lines, 1):
        if not raw.endswith(b"\n"):
            warnings.warn(f"{name}:{lineno}: skipping an incomplete final record")
            continue
        if raw.strip():
            try:
                record = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise DataError(f"{name}:{lineno}: not a JSON record ({exc.msg})") from None
            yield upgrade(record) if isinstance(record, dict) else record


def load(path: str | os.PathLike) -> pd.DataFrame:
    """All records under a file or folder as a DataFrame.

    Columns: the record's own fields, then every parameter and metric flattened to the top
    level (metric names carry units), then ``env.*``. Missing metrics are NaN. ``point_key`` is
    always filled (``point_key_of``: a record from before the sweep stored it keeps a key of its own).
    """
    return frame(iter_records(path))


def frame(records: Iterable[dict]) -> pd.DataFrame:
    """Records as a DataFrame, flattened as ``load`` describes (the cross-system report reads
    records from several folders and archives, then frames them here)."""
    rows = []
    for rec in records:
        row = {k: v for k, v in rec.items() if k not in ("params", "metrics", "env")}
        row.update(rec.get("params", {}))
        row.update(rec.get("metrics", {}))
        row.update(_flatten(rec.get("env", {}), "env."))
        row["point_key"] = point_key_of(rec)
        rows.append(row)
    return pd.DataFrame(rows)


def _flatten(d: dict, prefix: str) -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out


def point_key_of(record: dict) -> str:
    """The one identity of "the same point": the sweep's ``params.point_key`` (``Point.key()``, a hash of
    every field that determines the measurement), which resume, the study tables, the figures, the
    findings, the report and the predictor all group by. A record written before the sweep stored it:
    a hash of its parameters, so an old record keeps one key of its own, the same every time it is read."""
    params = record.get("params") or {}
    key = params.get("point_key")
    if key:
        return str(key)
    text = json.dumps(params, sort_keys=True, default=str)
    return "params-" + hashlib.sha256(text.encode()).hexdigest()[:16]


# What a point is within a records frame: its study and system (the record's own fields, which an old
# record's params do not repeat) and its key.
POINT = ("study", "system", "point_key")


def point_columns(df: pd.DataFrame) -> list[str]:
    """The columns of ``POINT`` that ``df`` has (a frame from ``load`` has them all)."""
    return [c for c in POINT if c in df.columns]


def latest(df: pd.DataFrame) -> pd.DataFrame:
    """Each point's most recent record (re-runs supersede old ones); a point is ``POINT``."""
    if df.empty:
        return df
    return df.sort_values("timestamp", kind="stable").groupby(point_columns(df), dropna=False,
                                                              as_index=False).tail(1)


@functools.lru_cache(maxsize=1)
def git_commit() -> dict[str, Any]:
    """The commit of the accel-kit checkout (and whether it has uncommitted changes)."""
    return git_state(Path(__file__).resolve().parent.parent)


def git_state(repo: Path) -> dict[str, Any]:
    """``repo``'s commit and whether its tracked files changed, read without writing to the repository."""
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True,
                                timeout=5, check=True).stdout.strip()
        # --no-optional-locks: a plain `git status` refreshes the index under .git/index.lock, and a run
        # killed meanwhile (Ctrl-C, SIGKILL, a timeout) left that lock behind: the user's next commit failed.
        dirty = bool(subprocess.run(["git", "--no-optional-locks", "status", "--porcelain", "--untracked-files=no"],
                                    cwd=repo, capture_output=True, text=True, timeout=5).stdout.strip())
        return {"commit": commit, "dirty": dirty}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


def environment(adapter=None) -> dict[str, Any]:
    """Software and hardware provenance for records."""
    import torch

    env: dict[str, Any] = {
        "accel_kit": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "git": git_commit(),
        "argv": sys.argv[:1],
    }
    try:  # the version without importing the package (seconds saved in every worker)
        env["transformers"] = importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:
        env["transformers"] = None
    if adapter is not None:
        desc = adapter.describe()
        env["device"] = {"adapter": desc.adapter, "model": desc.device_model, "count": desc.device_count,
                         "versions": desc.versions, **desc.extra}
        env["math_mode"] = adapter.math_mode()
    return env
