"""Study 1: one GPT-2 XL transformer block, forward and forward+backward TFLOPS (paper Figures 3, 4).

Each point (implementation x precision x batch size x direction) is measured in isolation:
an out-of-memory or any other failure is recorded with its status and the sweep goes on.
The module is cast to the precision (weights and activations), as the paper's
microbenchmark does; fp32 means true fp32 (TF32 off) unless ``tf32`` is set.
"""
from __future__ import annotations

import gc
from pathlib import Path
from typing import Literal

import pandas as pd
import torch
from pydantic import Field, PositiveInt, model_validator
from tqdm.auto import tqdm

from accel_kit import flops as F
from accel_kit import peaks, results
from accel_kit.devices import DeviceAdapter, dtype_of
from accel_kit.errors import ParameterError
from accel_kit.models.block import Block, BlockConfig
from accel_kit.params import Precision, StudyParams
from accel_kit.systems import System
from accel_kit.timing import measure

STUDY = "microbenchmark"
GiB = 2**30


class Params(StudyParams):
    """Parameters of the microbenchmark (defaults: the paper's GPT-2 XL block)."""

    hidden_size: PositiveInt = 1600
    n_heads: PositiveInt = 25
    mlp_ratio: PositiveInt = 4
    seq_len: PositiveInt = 1024
    batch_sizes: list[PositiveInt] = Field(default=[8, 16, 32, 64], min_length=1)
    precisions: list[Precision] | None = None  # None: every precision the system lists
    directions: list[Literal["forward", "forward_backward"]] = Field(
        default=["forward", "forward_backward"], min_length=1)
    impls: list[Literal["native", "hf"]] = Field(default=["native"], min_length=1)
    warmup: int = Field(default=2, ge=0)
    trials: PositiveInt = 5
    tf32: bool = False  # allow TF32 for fp32 matmuls (recorded either way)
    torch_compile: bool = False  # torch.compile the block; compile time lands in warm-up, reported apart
    measure_peak: bool = True  # measure the square-GEMM peak per precision for mfu_measured_pct
    noisy_cv: float = Field(default=0.05, gt=0)
    seed: int = 0

    @model_validator(mode="after")
    def _heads_divide_hidden(self) -> "Params":
        if self.hidden_size % self.n_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not a multiple of n_heads {self.n_heads}")
        return self


def build_block(impl: str, cfg: BlockConfig, seq_len: int) -> torch.nn.Module:
    """Our block, or transformers' GPT2Block (SDPA attention) of the same shape."""
    if impl == "native":
        return Block(cfg)
    from transformers import GPT2Config
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block

    hf_cfg = GPT2Config(n_embd=cfg.hidden_size, n_head=cfg.n_heads, n_inner=cfg.mlp_ratio * cfg.hidden_size,
                        n_positions=seq_len, layer_norm_epsilon=cfg.layer_norm_eps, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0)
    hf_cfg._attn_implementation = "sdpa"
    return GPT2Block(hf_cfg, layer_idx=0)


def _first(out):
    # transformers 4.x returns a tuple from GPT2Block, 5.x a tensor.
    return out[0] if isinstance(out, tuple) else out


def run(params: Params, system: System, *, records_path: Path, run_id: str, profile: str | None = None,
        progress: bool = True) -> list[dict]:
    """Measure every point; append one record per point to ``records_path``; return the records."""
    adapter = system.adapter_instance()
    precisions = params.precisions or list(system.precisions)
    missing = [p for p in precisions if p not in adapter.supported_precisions()]
    if missing:
        raise ParameterError(f"precision {missing[0]!r} is not supported by system {system.id!r} "
                             f"(supports {', '.join(adapter.supported_precisions())})")
    adapter.set_tf32(params.tf32)
    env = results.environment(adapter)
    device_model = env["device"]["model"]
    resolved = params.model_dump() | {"precisions": precisions, "profile": profile}

    measured_peaks: dict[str, peaks.MeasuredPeak] = {}
    if params.measure_peak:
        for precision in tqdm(precisions, desc="matmul peak", disable=not progress):
            measured_peaks[precision] = peaks.measure_matmul_peak(adapter, precision)

    points = [(i, p, b, d) for i in params.impls for p in precisions for b in params.batch_sizes
              for d in params.directions]
    records = []
    bar = tqdm(points, desc=f"{STUDY} on {system.id}", disable=not progress)
    for impl, precision, batch, direction in bar:
        bar.set_postfix_str(f"{impl} {precision} b={batch} {direction}")
        point = {"impl": impl, "precision": precision, "batch_size": batch, "direction": direction}
        record = _measure_point(params, adapter, point, device_model, measured_peaks.get(precision))
        record = results.make_record(
            study=STUDY, system=system.id, device=device_model, model=f"gpt2-block-h{params.hidden_size}",
            params=resolved | point, run_id=run_id, env=env, **record)
        results.append_record(records_path, record)
        records.append(record)
        if record["status"] == "ok":
            bar.set_postfix_str(f"{impl} {precision} b={batch} {direction}: {record['metrics']['tflops']:.2f} TFLOP/s")
    return records


def _measure_point(params: Params, adapter: DeviceAdapter, point: dict, device_model: str,
                   measured_peak: peaks.MeasuredPeak | None) -> dict:
    """Measure one point; returns the status-dependent parts of its record."""
    cfg = BlockConfig(params.hidden_size, params.n_heads, params.mlp_ratio)
    batch, precision, direction = point["batch_size"], point["precision"], point["direction"]
    device, dtype = adapter.torch_device(), dtype_of(precision)
    flops = F.block_flops(batch, params.seq_len, cfg.hidden_size, mlp_ratio=cfg.mlp_ratio, direction=direction)
    state: dict = {}
    try:
        torch.manual_seed(params.seed)
        module = build_block(point["impl"], cfg, params.seq_len).to(device=device, dtype=dtype)
        if params.torch_compile:
            module = torch.compile(module)
        x = torch.randn(batch, params.seq_len, cfg.hidden_size, device=device, dtype=dtype,
                        requires_grad=direction == "forward_backward")
        state.update(module=module, x=x)
        if direction == "forward":
            def step():
                with torch.no_grad():
                    _first(module(x))
        else:
            grad_out = torch.randn_like(x)
            state["grad_out"] = grad_out

            def step():
                module.zero_grad(set_to_none=True)
                x.grad = None
                _first(module(x)).backward(grad_out)

        adapter.reset_peak_memory()
        timing = measure(step, adapter.synchronize, warmup=params.warmup, trials=params.trials,
                         noisy_cv=params.noisy_cv)
        mem = adapter.peak_memory_bytes()
        metrics = _metrics(flops, timing.median_s, batch * params.seq_len, precision, params.tf32,
                           device_model, measured_peak)
        metrics.update(timing.summary())
        metrics["mem_peak_gib"] = mem / GiB if mem is not None else None
        return {"status": "ok", "metrics": metrics, "times_s": timing.times_s,
                "warmup_times_s": timing.warmup_times_s}
    except torch.OutOfMemoryError as exc:
        return {"status": "oom", "reason": _first_line(exc), "metrics": {"flops": flops}}
    except Exception as exc:  # any failure of one point is recorded; the sweep goes on
        return {"status": "error", "reason": f"{type(exc).__name__}: {_first_line(exc)}", "metrics": {"flops": flops}}
    finally:
        state.clear()
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()


def _metrics(flops: int, time_s: float, tokens: int, precision: str, tf32: bool, device_model: str,
             measured_peak: peaks.MeasuredPeak | None) -> dict:
    achieved = F.tflops(flops, time_s)
    peak, source = peaks.datasheet_peak_tflops(device_model, precision, tf32=tf32)
    metrics = {
        "flops": flops,  # FLOPs of one timed iteration: tflops == flops / time_median_s / 1e12
        "tflops": achieved,
        "tokens_per_s": tokens / time_s,
        "peak_tflops_datasheet": peak,
        "mfu_pct": peaks.mfu_pct(achieved, peak),
        "peak_tflops_measured": measured_peak.tflops if measured_peak else None,
        "mfu_measured_pct": peaks.mfu_pct(achieved, measured_peak.tflops) if measured_peak else None,
    }
    metrics["datasheet_source" if peak is not None else "mfu_reason"] = source
    if measured_peak is None:
        metrics["mfu_measured_reason"] = "matmul peak not measured (measure_peak is false)"
    return metrics


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# ---- presentation -------------------------------------------------------------------------------

TABLE_KEYS = ["system", "impl", "precision", "batch_size", "direction"]


def table(df: pd.DataFrame) -> pd.DataFrame:
    """One row per point: status, TFLOPS, MFU both ways, memory, spread."""
    if df.empty:
        return df
    df = results.latest(df, TABLE_KEYS)
    cols = TABLE_KEYS + ["status", "tflops", "mfu_pct", "mfu_measured_pct", "time_median_s", "time_cv",
                         "noisy", "mem_peak_gib", "reason"]
    cols = [c for c in cols if c in df.columns]
    return df[cols].sort_values(TABLE_KEYS).reset_index(drop=True)


def figures(df: pd.DataFrame) -> dict:
    """Paper Figures 3 (forward) and 4 (backward): TFLOPS by batch size, one panel per precision."""
    from accel_kit import plots

    if df.empty or "tflops" not in df.columns:
        return {}
    ok = results.latest(df, TABLE_KEYS)
    ok = ok[ok["status"] == "ok"].copy()
    titles = {"forward": "Forward pass", "forward_backward": "Forward + backward pass"}
    figs = {}
    for direction, title in titles.items():
        sub = ok[ok["direction"] == direction]
        if sub.empty:
            continue
        figs[f"microbenchmark_{direction}"] = plots.grouped_bars(
            sub, x="batch_size", y="tflops", facet="precision", group=["system", "impl"],
            title=f"{title} throughput of one GPT-2 XL block (seq {int(sub['seq_len'].iloc[0])})",
            x_title="batch size", y_title="TFLOP/s", facet_order=["fp32", "fp16", "bf16"],
            hover=["mfu_pct", "mfu_measured_pct", "time_median_s", "mem_peak_gib"])
    return figs
