"""One transformer layer, forward and forward+backward TFLOPS (paper Figures 3, 4).

The layer is one of a model preset (``preset``, any family's; default the paper's GPT-2 XL).

Each point (implementation x precision x batch size x direction) runs in its own process
through the sweep runner, like every training point: an out-of-memory, a crash, a hang or a
time budget that cannot be met is recorded with its status and the sweep goes on; a re-run
resumes; a SIGKILL loses nothing recorded. The module is cast to the precision (weights and
activations), as the paper's microbenchmark does; fp32 means true fp32 (TF32 off) unless
``tf32`` is set. ``precisions: auto`` runs fp32 and each lower precision the device executes
natively at speed; an explicit list runs as asked, and emulated precisions say so.
"""
from __future__ import annotations

from pathlib import Path
from typing import Literal

import pandas as pd
from pydantic import Field, PositiveInt, field_validator

from accel_kit import energy
from accel_kit import noise, results
from accel_kit.engine.point import BlockPoint, Direction, Impl
from accel_kit.engine.sweep import PeakReference, run_sweep
from accel_kit.params import Precision, StudyParams
from accel_kit.precision import PRECISIONS
from accel_kit import identity
from accel_kit.studies.study import Headline, ReportTable, Row, Study
from accel_kit.systems import System

NAME = "microbenchmark"


class Params(StudyParams):
    """Parameters of the microbenchmark (defaults: the paper's GPT-2 XL layer)."""

    preset: str = "gpt2-xl"  # the model whose layer is timed, e.g. llama3.1-8b
    seq_len: PositiveInt = 1024
    batch_sizes: list[PositiveInt] = Field(default=[8, 16, 32, 64], min_length=1)
    # None: the system's list; auto: fp32 and each lower precision the device runs natively at speed.
    precisions: list[Precision] | Literal["auto"] | None = None
    directions: list[Direction] = Field(default=["forward", "forward_backward"], min_length=1)
    impls: list[Impl] = Field(default=["native"], min_length=1)
    warmup: int = Field(default=2, ge=0)
    trials: PositiveInt = 5
    tf32: bool = False  # allow TF32 for fp32 matmuls (recorded either way)
    torch_compile: bool = False  # torch.compile the block; compile time lands in warm-up, reported apart
    measure_peak: bool = True  # measure the matmul peak per precision for mfu_measured_pct
    noisy_cv: float = Field(default=0.05, gt=0)
    seed: int = 0
    time_budget_s: float | None = Field(default=None, gt=0)  # per point; an estimate above it is skipped
    timeout_s: float = Field(default=900, gt=0)  # per point; a hung point is killed and recorded
    memory_limit_gib: float | None = Field(default=None, gt=0)  # cap on each point's process

    @field_validator("preset")
    @classmethod
    def _known_preset(cls, value: str) -> str:
        from accel_kit.models import PRESETS

        if value not in PRESETS:
            raise ValueError(f"unknown model preset {value!r}; known: {', '.join(PRESETS)}")
        return value


def resolve_precisions(params: Params, system: System) -> list:
    """The precisions to sweep, each resolved by the adapter (with the reason recorded)."""
    adapter = system.adapter_instance()
    if params.precisions == "auto":
        # fp32 always (the reference), plus each lower precision the device runs natively at speed.
        choices = [adapter.resolve_precision("fp32")]
        for low in PRECISIONS[1:]:
            support = adapter.precision_support(low) if low in adapter.supported_precisions() else None
            if support and support.native:
                choices.append(adapter.resolve_precision(low))
        return choices
    return [adapter.resolve_precision(p) for p in (params.precisions or list(system.precisions))]


def run(params: Params, system: System, *, records_path: Path, run_id: str, profile: str | None = None,
        progress: bool = True, rerun: bool = False) -> list[results.Record]:
    """Measure (or resume) every point, each in its own process; one record per point."""
    choices = resolve_precisions(params, system)
    fixed = params.model_dump(include={"preset", "seq_len", "warmup", "trials", "tf32",
                                       "torch_compile", "noisy_cv", "seed", "time_budget_s", "memory_limit_gib"})
    points = [BlockPoint(system=system.id, impl=i, precision=c.precision, precision_reason=c.reason, batch_size=b,
                         direction=d, **fixed)
              for i in params.impls for c in choices for b in params.batch_sizes for d in params.directions]
    from accel_kit.models import family_of, get_config

    cfg = get_config(params.preset)
    shapes = tuple(shape for b in dict.fromkeys((min(params.batch_sizes), max(params.batch_sizes)))
                   for shape in family_of(cfg).gemm_shapes(cfg, b * params.seq_len))
    peak = PeakReference(system.id, shapes, enabled=params.measure_peak)
    extra = params.model_dump(exclude=set(BlockPoint.model_fields)) | {
        "profile": profile, "precisions": [c.precision for c in choices],
        "precisions_requested": params.precisions}
    return run_sweep(NAME, points, records_path=records_path, run_id=run_id, extra_params=extra,
                     timeout_s=params.timeout_s, progress=progress, peak=peak, rerun=rerun)


# ---- presentation -------------------------------------------------------------------------------

# The columns a table names first (with them, every key field that varies among its rows: the preset, the
# sequence length; ``identity.with_varying``).
TABLE_KEYS = ["system", "impl", "precision", "batch_size", "direction"]


def table(df: pd.DataFrame) -> pd.DataFrame:
    """One row per point (its latest record): status, TFLOPS, MFU both ways, memory, spread."""
    if df.empty:
        return df
    df = results.latest(identity.with_point_key(df))
    keys = [k for k in identity.with_varying(TABLE_KEYS, df) if k in df.columns]
    cols = keys + ["status", "tflops", *energy.table_columns(df, "flops"), "mfu_pct", "mfu_measured_pct",
                   "time_median_s", "time_cv", "noisy", "mem_peak_gib", "reason", "record_id"]
    cols = [c for c in dict.fromkeys(cols) if c in df.columns]
    return df[cols].sort_values(keys, kind="stable").reset_index(drop=True)


def figures(df: pd.DataFrame) -> dict:
    """Paper Figures 3 (forward) and 4 (backward): TFLOPS by batch size, one panel per precision."""
    from accel_kit import plots

    if df.empty or "tflops" not in df.columns:
        return {}
    ok = noise.with_spread(identity.with_point_key(df))  # latest per point, with its spread
    ok = ok[ok["status"] == "ok"].copy()
    # One colour per configuration: a second preset or sequence length is a group of its own.
    group = ["system", "impl"] + [f for f in identity.varying(ok) if f not in
                                  ("system", "impl", "batch_size", "precision", "direction")]
    titles = {"forward": "Forward pass", "forward_backward": "Forward + backward pass"}
    figs = {}
    for direction, title in titles.items():
        sub = ok[ok["direction"] == direction]
        if sub.empty:
            continue
        figs[f"microbenchmark_{direction}"] = plots.grouped_bars(
            sub, x="batch_size", y="tflops", facet="precision", group=group,
            title=f"{title} throughput of one {_layer_name(sub)} layer{_seq(sub)}",
            x_title="batch size", y_title="TFLOP/s", facet_order=["fp32", "fp16", "bf16"],
            hover=["mfu_pct", "mfu_measured_pct", "time_median_s", "mem_peak_gib"])
        if plots.has_values(sub, "flops_per_j"):  # beside it, where the device reads its energy
            measured = sub[sub["flops_per_j"].notna()]
            figs[f"microbenchmark_{direction}_energy"] = plots.grouped_bars(
                measured.assign(gflops_per_j=measured["flops_per_j"] / 1e9), x="batch_size", y="gflops_per_j",
                facet="precision", group=group, title=f"{title} energy efficiency of one {_layer_name(sub)} layer",
                x_title="batch size", y_title="GFLOP / J", facet_order=["fp32", "fp16", "bf16"],
                hover=["tflops", "power_avg_w", "energy_j"])
    return figs


def _seq(df: pd.DataFrame) -> str:
    """`` (seq 1024)`` where the rows share one sequence length (else each group names its own)."""
    lengths = df["seq_len"].dropna().unique() if "seq_len" in df.columns else []
    return f" (seq {int(lengths[0])})" if len(lengths) == 1 else ""


def _layer_name(df: pd.DataFrame) -> str:
    """The preset(s) whose layer the rows timed (records from before ``preset`` existed: GPT-2 XL's shape)."""
    names = sorted(df["preset"].dropna().unique()) if "preset" in df.columns else []
    return " / ".join(names) or "GPT-2 XL"


def direction_rows(direction: str):
    """The rows of the study's table in ``direction`` (``forward``, ``forward_backward``): a report table's."""
    def select(t: pd.DataFrame, df: pd.DataFrame) -> pd.DataFrame:
        return t[t["direction"] == direction]
    return select


# Figures 3 (forward) and 4 (forward and backward): the same quantities, one table each.
ROWS = (Row("tflops"), Row("mfu_pct"), Row("mfu_measured_pct"), Row("flops_per_j"))
STUDY = Study(
    NAME, Params, table, figures, run=run, keys=tuple(TABLE_KEYS),
    headline=Headline("tflops", "TFLOP/s", ("model", "impl", "seq_len", "batch_size", "direction")),
    report=tuple(ReportTable(f"figure-{n}-data", ("precision", "batch_size"), ROWS, extra=("impl",),
                             split_precision=False, select=direction_rows(direction))
                 for n, direction in ((3, "forward"), (4, "forward_backward"))))
