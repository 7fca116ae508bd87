"""The process's one cstorch backend (CPU, or CSX with its ``ClusterConfig``) and cstorch's mixed precision."""
from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from multiprocessing import util as mp_util
from pathlib import Path

import cerebras.pytorch as cstorch

from accel_kit.devices.cerebras.options import CerebrasOptions, compiler_micro_batch
from accel_kit.devices.types import TrainPointFields
from accel_kit.precision import spec

# The ClusterConfig settings taken from the options as given (None: cstorch's default).
CLUSTER_OPTIONS = ("mgmt_address", "mgmt_namespace", "credentials_path", "job_time_sec", "max_wgt_servers",
                   "max_act_per_csx", "num_workers_per_csx")


def current_backend():
    """The process's cstorch backend, or None (``cstorch.backend()`` raises when there is none)."""
    try:
        return cstorch.backend()
    except RuntimeError:
        return None


def open_backend(options: CerebrasOptions, point: TrainPointFields):
    """The cstorch backend of ``options`` for ``point``: the existing one when this process has one.

    Only one backend may exist per process (a notebook cell run twice, or two points in one
    worker): a second ``cstorch.backend(...)`` raises, so the existing one is returned when
    its type matches, and a mismatch is an error saying so.
    """
    existing = current_backend()
    if existing is not None:
        if existing.backend_type.name != options.backend:
            raise RuntimeError(f"this process already has a cstorch {existing.backend_type.name} backend; "
                               f"backend {options.backend} needs a fresh process")
        return existing
    artifact_dir = options.artifact_dir
    if artifact_dir is None:
        artifact_dir = tempfile.mkdtemp(prefix="accel-kit-cstorch-")
        # Removed at the process's end. Not by atexit: a rank forked by the point server ends through
        # multiprocessing's bootstrap and os._exit, which skip atexit but run multiprocessing's own
        # exit finalizers (registered with atexit in a plain interpreter too).
        mp_util.Finalize(None, shutil.rmtree, args=(artifact_dir,), kwargs={"ignore_errors": True},
                         exitpriority=0)
    if options.backend == "CPU":
        return cstorch.backend("CPU", artifact_dir=artifact_dir)
    return _open_csx(options, point, artifact_dir)


def _open_csx(options: CerebrasOptions, point: TrainPointFields, artifact_dir: str):
    # cstorch lowers the traced step with a tool installed next to this Python (torch-cirh-opt), which it
    # finds on PATH: a run started as .venv-cerebras/bin/accel-kit, without activating the venv, has it too.
    tools = str(Path(sys.executable).parent)
    if shutil.which("torch-cirh-opt") is None and (Path(tools) / "torch-cirh-opt").exists():
        os.environ["PATH"] = tools + os.pathsep + os.environ.get("PATH", "")
    from accel_kit.paths import project_root

    root = str(project_root())
    data = [str(Path(point.data_path).parent)] if getattr(point, "data_path", None) else []
    cluster = {name: getattr(options, name) for name in CLUSTER_OPTIONS if getattr(options, name) is not None}
    # The cluster's input workers run the point's input function: they import accel_kit from this
    # checkout and read the prepared data, so both are mounted unless the options say otherwise.
    cluster |= {"num_csx": getattr(point, "devices", 1), "mount_dirs": options.mount_dirs or [root, *data],
                "python_paths": options.python_paths or [root]}
    cstorch.backends.csx.performance.micro_batch_size = compiler_micro_batch(options, point)
    kwargs = {"artifact_dir": artifact_dir, "compile_only": options.compile_only,
              "validate_only": options.validate_only,
              "cluster_config": cstorch.distributed.ClusterConfig(**cluster)}
    if options.compile_dir:
        kwargs["compile_dir"] = options.compile_dir
    return cstorch.backend("CSX", **kwargs)


def set_precision(precision: str) -> None:
    """cstorch's mixed-precision state for ``precision``: fp32 off; bf16 / fp16 as its 16-bit type."""
    kind = spec(precision)
    if not kind.mixed:
        cstorch.amp.enable_mixed_precision(False)
        return
    cstorch.amp.set_half_dtype(kind.dtype)
    cstorch.amp.enable_mixed_precision(True)


def autocast(precision: str):
    """The traced step's autocast: on CPU torch.autocast in the half dtype (bf16 only there); on CSX a
    no-op (the compiler casts); none for fp32."""
    return cstorch.amp.autocast() if spec(precision).mixed else contextlib.nullcontext()
