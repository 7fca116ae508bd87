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

Reading: ``read_source`` reads a folder, a .jsonl file or an archive of them, each line through
``read_jsonl``, and ``upgrade`` gives a record of an older schema the current one's shape.
"""
from __future__ import annotations

import dataclasses
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
import tarfile
import uuid
import warnings
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Iterator, Literal, get_args

import pandas as pd

from accel_kit import SCHEMA_VERSION, __version__
from accel_kit.errors import DataError
from accel_kit.json_types import JSONObject, JSONValue
from accel_kit.mesh import LAYOUT_DEFAULTS, mesh_label

if TYPE_CHECKING:
    from accel_kit.devices.base import BaseAdapter

#: A point's outcome, the one status type of records and of the engine's results (``accel_kit.engine.result``).
Status = Literal["ok", "oom", "error", "unsupported", "skipped"]
# What ``read_source`` reads as an archive of record files (its members read in memory, never extracted).
ARCHIVES = (".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".tar", ".zip")


def new_run_id() -> str:
    """Identifier shared by the records of one invocation of a study."""
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + uuid.uuid4().hex[:6]


@dataclasses.dataclass(frozen=True)
class Record:
    """One record, typed: what a line of a records file holds (``to_dict``: that line's object, whose shape
    ``load`` flattens into columns; ``from_dict``: a line read back, of any schema, in the current shape)."""

    study: str
    kind: str
    system: str
    status: Status
    params: JSONObject
    run_id: str
    device: str | None = None
    model: str | None = None
    reason: str | None = None
    metrics: JSONObject = dataclasses.field(default_factory=dict)  # names declared in accel_kit.metrics
    times_s: list[float] = dataclasses.field(default_factory=list)
    warmup_times_s: list[float] = dataclasses.field(default_factory=list)
    env: JSONObject = dataclasses.field(default_factory=dict)
    traceback: str | None = None
    schema_version: int = SCHEMA_VERSION
    record_id: str = dataclasses.field(default_factory=lambda: uuid.uuid4().hex)
    timestamp: str = dataclasses.field(
        default_factory=lambda: _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))

    def __post_init__(self):
        if self.status not in get_args(Status):
            raise ValueError(f"status must be one of {get_args(Status)}, got {self.status!r}")
        if self.status != "ok" and not self.reason:
            raise ValueError(f"a record with status {self.status!r} needs a reason")

    def to_dict(self) -> JSONObject:
        """The record's JSON object, in the order a records file has always written it."""
        return {name: getattr(self, name) for name in RECORD_FIELDS}

    # Read by field name too, as the line of its records file reads (``engine.result.Result``'s way): a notebook's
    # ``run.records[0]["metrics"]``. Read only: a record is frozen; the package itself reads its fields.
    def __getitem__(self, name: str) -> JSONValue:
        if name not in RECORD_FIELDS:
            raise KeyError(name)
        return getattr(self, name)

    def get(self, name: str, default: JSONValue = None) -> JSONValue:
        value = getattr(self, name, None) if name in RECORD_FIELDS else None
        return default if value is None else value

    @classmethod
    def from_dict(cls, record: JSONObject) -> "Record":
        """A line read back (any schema, ``upgrade``), typed; ValueError or TypeError where it is no record."""
        return cls(**{k: v for k, v in upgrade(record).items() if k in RECORD_FIELDS})


# A record's fields in the order a records file writes them.
RECORD_FIELDS = ("schema_version", "record_id", "run_id", "timestamp", "study", "kind", "system", "device", "model",
                 "status", "reason", "params", "metrics", "times_s", "warmup_times_s", "env", "traceback")


def make_record(*, study: str, system: str, status: Status, params: JSONObject, run_id: str,
                kind: str | None = None, device: str | None = None, model: str | None = None, reason: str | None = None,
                metrics: JSONObject | None = None, times_s: list[float] | None = None,
                warmup_times_s: list[float] | None = None, env: JSONObject | None = None,
                traceback: str | None = None) -> Record:
    """Build one record. ``status`` other than ok needs a ``reason``;
    ``traceback`` keeps the full story.

    ``kind``: the point's kind (the sweep runner's ``accel_kit.engine.sweep.record_of`` always gives it;
    None: as a schema-1 record of ``study`` is read, ``schema1_kind``). ``metrics``: names declared in
    ``accel_kit.metrics`` (tests check that every metric a real record carries is declared).
    """
    return Record(study=study, kind=kind or schema1_kind(study), system=system, status=status, params=params,
                  run_id=run_id, device=device, model=model, reason=reason,
                  metrics={k: _finite(v) for k, v in (metrics or {}).items()}, times_s=times_s or [],
                  warmup_times_s=warmup_times_s or [], env=env or {}, traceback=traceback)


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


# The point kinds of schema 1's studies (records that predate the ``kind`` field): the microbenchmark timed
# blocks, every other study of that schema trained. A fact of records already written, not a registry: the
# sweep runner records every point's kind (``accel_kit.engine.kinds``), so a study or kind added since
# needs no line here.
SCHEMA1_BLOCK_STUDIES = ("microbenchmark",)


def schema1_kind(study: str) -> str:
    """The point kind of a record of ``study`` that names none (schema 1)."""
    return "block" if study in SCHEMA1_BLOCK_STUDIES else "train"


# An older record's name of the data-parallel degree (``dp`` in the current schema).
OLD_DP_NAME = "data_parallel_size"


def upgrade(record: dict) -> dict:
    """A record of an older schema in the current one's shape (version 1 had no ``kind``; a training
    record before the parallel layouts had no ``tp``, ``pp``, ``cp``, ``dp`` or ``mesh``, and one written
    before ``dp`` was the data-parallel degree's one name carries it as ``data_parallel_size``); others as
    they are."""
    if record.get("schema_version", 1) < 2 and "kind" not in record and "study" in record:
        record = dict(record)
        record["kind"] = schema1_kind(record["study"])
    if record.get("kind") == "train" and isinstance(record.get("params"), dict):
        record = _with_layout(record)
    return record


def _with_layout(record: dict) -> dict:
    params, metrics = record["params"], record.get("metrics") or {}
    missing = {k: v for k, v in LAYOUT_DEFAULTS.items() if k not in params}
    old_dp = OLD_DP_NAME in metrics
    dp = metrics.get("dp", metrics.get(OLD_DP_NAME))
    derived = {}
    if "dp" not in metrics and dp is not None:
        derived["dp"] = dp
    if "mesh" not in metrics and dp is not None:
        layout = LAYOUT_DEFAULTS | params
        derived["mesh"] = mesh_label(pp=layout["pp"], dp=dp, cp=layout["cp"], tp=layout["tp"], ep=layout["ep"])
    if not missing and not derived and not old_dp:
        return record
    metrics = {k: v for k, v in metrics.items() if k != OLD_DP_NAME} | derived
    return dict(record, params=missing | params, metrics=metrics)


def _finite(value: JSONValue) -> JSONValue:
    # JSON has no NaN/inf; a non-finite metric is "not measured", i.e. null.
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def append_record(path: str | os.PathLike, record: Record, *, make_folder: bool = True) -> None:
    """Append ``record`` to the JSON Lines file ``path`` (created if missing, with its folder unless
    ``make_folder`` is false: a sweep's folder removed mid-run is an error, not a fresh folder).

    Raises:
        OutputError: the disk, a quota or the folder refused the record (one line naming ``path``); the
            records before it are intact, since a line written in part is cut off again.
    """
    from accel_kit.atomic import output_errors

    path = Path(path)
    line = (json.dumps(record.to_dict(), default=str, allow_nan=False) + "\n").encode()
    with output_errors(path, "records"):
        if make_folder:
            path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            _drop_partial_tail(fd)
            size = os.fstat(fd).st_size
            try:
                view = memoryview(line)
                while view:  # a full disk or a size limit writes part of the line, then fails
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            except OSError:
                # Cut the part written, so the file ends with the last whole record (a full disk still
                # lets a file shrink); a later append would cut it too, but the run may not append again.
                try:
                    os.ftruncate(fd, size)
                except OSError:
                    pass
                raise
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


def iter_records(path: str | os.PathLike) -> Iterable[Record]:
    """Records from a .jsonl file or every .jsonl under a folder; incomplete lines are skipped."""
    path = Path(path)
    files = sorted(path.rglob("*.jsonl")) if path.is_dir() else [path]
    for file in files:
        with open(file, "rb") as f:
            yield from read_jsonl(f, str(file))


# What makes a JSON line a record at all: a line without them is another tool's (skipped, not an error).
IDENTITY_FIELDS = ("record_id", "study", "system", "status")


def read_jsonl(lines: Iterable[bytes], name: str) -> Iterable[Record]:
    """Records from the lines of one JSON Lines file (``name`` for messages), each in the current schema
    (``Record.from_dict``): the one place a line becomes a ``Record``. An incomplete final line is skipped
    with a warning, a JSON line without a record's ``IDENTITY_FIELDS`` is skipped, and a line that is not
    JSON, or a record that does not read as one (an unknown status), is a one-line DataError."""
    for lineno, raw in enumerate(lines, 1):
        if not raw.endswith(b"\n"):
            warnings.warn(f"{name}:{lineno}: skipping an incomplete final record")
            continue
        if raw.strip():
            try:
                obj = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise DataError(f"{name}:{lineno}: not a JSON record ({exc.msg})") from None
            if not isinstance(obj, dict) or not all(obj.get(k) for k in IDENTITY_FIELDS):
                continue
            try:
                yield Record.from_dict(obj)
            except (TypeError, ValueError) as exc:
                raise DataError(f"{name}:{lineno}: not a valid record ({exc})") from None


def read_source(path: str | Path) -> Iterator[Record]:
    """Records from a folder (every .jsonl below it), a .jsonl file or an archive of either (its members
    read in memory, never extracted): what the cross-system report and the predictor's held-out check read."""
    path = Path(path)
    if not path.exists():
        raise DataError(f"{path}: no such folder, file or archive")
    if path.is_dir():
        yield from iter_records(path)
    elif path.name.endswith(ARCHIVES):
        yield from _archive_records(path)
    elif path.suffix == ".jsonl":
        yield from iter_records(path)
    else:
        raise DataError(f"{path}: not a folder, a .jsonl file or an archive ({', '.join(ARCHIVES)})")


def _archive_records(path: Path) -> Iterator[Record]:
    try:
        if path.suffix == ".zip":
            with zipfile.ZipFile(path) as zf:
                for info in sorted(zf.infolist(), key=lambda i: i.filename):
                    if not info.is_dir() and info.filename.endswith(".jsonl"):
                        with zf.open(info) as f:
                            yield from read_jsonl(f, f"{path}!{info.filename}")
        else:
            with tarfile.open(path, "r:*") as tf:
                for member in sorted(tf.getmembers(), key=lambda m: m.name):
                    if member.isfile() and member.name.endswith(".jsonl"):
                        f = tf.extractfile(member)
                        if f is not None:
                            yield from read_jsonl(f, f"{path}!{member.name}")
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, OSError) as exc:
        raise DataError(f"{path}: cannot read the archive ({exc})") from None


def load(path: str | os.PathLike) -> pd.DataFrame:
    """All records under a file or folder as a DataFrame.

    Columns: the record's own fields, then every parameter and metric flattened to the top
    level (metric names carry units), then ``env.*``. Missing metrics are NaN. ``point_key`` is
    always filled (``point_key_of``: a record from before the sweep stored it keeps a key of its own).
    """
    return frame(iter_records(path))


def frame(records: Iterable[Record]) -> pd.DataFrame:
    """Records as a DataFrame, flattened as ``load`` describes (the cross-system report reads
    records from several folders and archives, then frames them here)."""
    rows = []
    for rec in records:
        row = {k: getattr(rec, k) for k in RECORD_FIELDS if k not in ("params", "metrics", "env")}
        row.update(rec.params)
        row.update(rec.metrics)
        row.update(_flatten(rec.env, "env."))
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


def point_key_of(record: Record) -> str:
    """The one identity of "the same point": the sweep's ``params.point_key`` (``Point.key()``, a hash of
    every field that determines the measurement), which resume, the study tables, the figures, the
    findings, the report and the predictor all group by. A record written before the sweep stored it:
    a hash of its parameters, so an old record keeps one key of its own, the same every time it is read."""
    params = record.params or {}
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
def git_commit() -> JSONObject:
    """The commit of the accel-kit checkout (and whether it has uncommitted changes)."""
    return git_state(Path(__file__).resolve().parent.parent)


def git_state(repo: Path) -> JSONObject:
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


def environment(adapter: BaseAdapter | None = None) -> JSONObject:
    """Software and hardware provenance for records."""
    import torch

    env: JSONObject = {
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
