"""What the training studies (scaling, sequence length, GAS, ...) share: parameters, points, running.

A training study is a grid of ``TrainPoint`` s built from its parameters (one list-valued
axis or two), run by the sweep runner (``accel_kit.train.sweep``), one process per point.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Literal

from pydantic import Field, PositiveInt

from accel_kit.errors import ParameterError
from accel_kit.models import PRESETS
from accel_kit.params import Precision, StudyParams
from accel_kit.systems import System
from accel_kit.train.point import TrainPoint
from accel_kit.train.sweep import run_sweep


class TrainingParams(StudyParams):
    """Parameters every training study takes. None means "the system's default" (params/systems)."""

    preset: str = "gpt2-xl"
    vocab_size: PositiveInt | None = None
    pad_vocab_multiple: PositiveInt = 1
    precision: Precision | None = None
    micro_batch_size: PositiveInt | None = None
    gas: PositiveInt = 1
    seq_len: PositiveInt | None = None
    devices: PositiveInt = 1
    engine: Literal["ddp", "deepspeed"] = "ddp"
    steps: PositiveInt = 5
    warmup_steps: int = Field(default=2, ge=0)
    data: str = "synthetic"  # synthetic | text (the embedded corpus) | a prepared data folder
    seed: int = 0
    activation_checkpointing: bool = False
    torch_compile: bool = False
    lr: float = Field(default=6e-4, gt=0)
    weight_decay: float = Field(default=0.1, ge=0)
    grad_clip: float = Field(default=1.0, ge=0)
    timeout_s: float = Field(default=1800, gt=0)  # per point; a hung point is killed and recorded
    memory_limit_gib: float | None = Field(default=None, gt=0)
    measure_peak: bool = True
    launcher: Literal["local", "mpiexec", "srun"] = "local"
    max_nodes: PositiveInt = 1  # nodes this run may use (set by job scripts)

    def check(self, system: System) -> None:
        if self.preset not in PRESETS:
            raise ParameterError(f"parameter 'preset': unknown model preset {self.preset!r}; "
                                 f"known: {', '.join(PRESETS)}")
        precision = self.precision or system.default_precision
        if precision not in system.precisions:
            raise ParameterError(f"precision {precision!r} is not supported by system {system.id!r} "
                                 f"(supports {', '.join(system.precisions)})")


def make_point(params: TrainingParams, system: System, **axis) -> TrainPoint:
    """A TrainPoint from the study parameters, the system's defaults and this point's axis values."""
    values = dict(
        system=system.id, preset=params.preset, vocab_size=params.vocab_size,
        pad_vocab_multiple=params.pad_vocab_multiple, precision=params.precision or system.default_precision,
        micro_batch_size=params.micro_batch_size or system.micro_batch_size, gas=params.gas,
        seq_len=params.seq_len or system.seq_len, devices=params.devices, devices_per_node=system.devices_per_node,
        engine=params.engine, steps=params.steps, warmup_steps=params.warmup_steps, data=params.data,
        seed=params.seed, activation_checkpointing=params.activation_checkpointing,
        torch_compile=params.torch_compile, lr=params.lr, weight_decay=params.weight_decay,
        grad_clip=params.grad_clip, memory_limit_gib=params.memory_limit_gib)
    values.update(axis)
    return TrainPoint(**values)


def resolve_data(data: str, data_root: Path, *, progress: bool) -> str:
    """'synthetic' stays; 'text' becomes the embedded corpus prepared (once) under data_root; a folder is checked."""
    if data == "synthetic":
        return data
    if data == "text":
        from accel_kit.data import prepare_default_text

        out = data_root / "pydoc-gpt2"
        prepare_default_text(out, progress=progress)
        return str(out.resolve())
    from accel_kit.data import read_meta

    read_meta(data)  # raises a one-line DataError for a folder that is not prepared
    return str(Path(data).resolve())


def measure_peak(system: System, precision: str, timeout_s: float = 600) -> float | None:
    """The device's square-GEMM peak, measured in a child process (nothing stays allocated here)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "peak.json"
        proc = subprocess.run([sys.executable, "-m", "accel_kit.train.worker", "--peak", system.id, precision,
                               "--out", str(out)], capture_output=True, text=True, timeout=timeout_s)
        if proc.returncode != 0 or not out.exists():
            return None
        return json.loads(out.read_text())["tflops"]


def run_points(study: str, params: TrainingParams, system: System, points: list[TrainPoint], *, records_path: Path,
               run_id: str, profile: str | None, progress: bool) -> list[dict]:
    """Resolve data and peaks, then run (or resume) the sweep."""
    params.check(system)
    system.adapter_instance()  # fail early, in one line, when the device is missing
    # Per point, each distinct value once: a study may give its points different prepared folders
    # (GenSLM prepares the genomes once per block size).
    data = {d: resolve_data(d, records_path.parent.parent / "data", progress=progress)
            for d in dict.fromkeys(p.data for p in points)}
    peaks: dict[str, float | None] = {}
    if params.measure_peak:
        for precision in sorted({p.precision for p in points}):
            peaks[precision] = measure_peak(system, precision)
    points = [p.model_copy(update={"data": data[p.data], "peak_tflops_measured": peaks.get(p.precision)})
              for p in points]
    cpu_threads = None
    if system.adapter == "cpu":
        # Data-parallel ranks on a CPU share its cores: give each an equal slice, not all of them.
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        cpu_threads = max(1, cores // max(p.devices for p in points)) if points else None
    extra = params.model_dump() | {"profile": profile, "data_source": params.data}
    return run_sweep(study, points, records_path=records_path, run_id=run_id, extra_params=extra,
                     timeout_s=params.timeout_s, launcher=params.launcher, max_nodes=params.max_nodes, progress=progress,
                     cpu_threads=cpu_threads)
