"""Inference: offline generation (prefill and decode) of model presets, swept over batch, input and output length.

Each point is a ``generate`` point (``accel_kit.engine.generate_measure``): a batch of random prompts
prefilled, then decoded greedily through a static KV cache, the prefill (TTFT) and each decode step
(TPOT) timed by the one clock; prefill MFU against the datasheet and measured matmul peaks, decode MBU
against the datasheet and the measured memory bandwidth (measured once per run, before the points),
energy per output token where the device has a counter. The first point of each preset also times
transformers' ``generate`` from the same weights (``hf_reference``).

Serving (an OpenAI-compatible server under load) is the study's second kind of point: ``serve_points``
is where its points join the offline ones; until that kind lands, the study runs offline points only.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
from pydantic import Field, PositiveInt, ValidationInfo, field_validator

from accel_kit import energy, identity, noise, results
from accel_kit.engine.point import Point
from accel_kit.params import PrecisionRequest, StudyParams
from accel_kit.systems import System

STUDY = "inference"


class Params(StudyParams):
    """Parameters of the inference study (defaults: LLM-Inference-Bench's sweep, one preset)."""

    presets: list[str] = Field(default=["llama3.1-8b"], min_length=1)
    precision: PrecisionRequest = "auto"  # auto: the device's fastest native precision
    batch_sizes: list[PositiveInt] = Field(default=[1, 8, 64], min_length=1)
    input_lens: list[PositiveInt] = Field(default=[128, 2048], min_length=1)
    output_lens: list[PositiveInt] = Field(default=[128, 2048], min_length=1)
    warmup: int = Field(default=1, ge=0)
    trials: PositiveInt = 3
    seed: int = 0
    hf_reference: bool = True  # transformers' generate timed beside ours, at each preset's first point
    measure_peak: bool = True  # the matmul peak per precision, for the prefill's measured MFU
    measure_bandwidth: bool = True  # the memory bandwidth, for the decode's measured MBU
    # arrays the bandwidth's copy and triad run over, each past every last-level cache (an H200's L2: 60 MB)
    bandwidth_mib: list[PositiveInt] = Field(default=[512], min_length=1)
    time_budget_s: float | None = Field(default=None, gt=0)
    timeout_s: float = Field(default=1800, gt=0)
    memory_limit_gib: float | None = Field(default=None, gt=0)

    @field_validator("presets")
    @classmethod
    def _known_presets(cls, value: list[str]) -> list[str]:
        from accel_kit.models import get_config

        for preset in value:
            get_config(preset)  # one line naming the preset where it is none
        return value

    @field_validator("output_lens")
    @classmethod
    def _fits_positions(cls, value: list[int], info: ValidationInfo) -> list[int]:
        """An output longer than the model's positions is bad input, said before any point runs."""
        from accel_kit.models import family_of, get_config

        inputs = info.data.get("input_lens") or []
        for preset in info.data.get("presets") or []:
            cfg = get_config(preset)
            try:
                positions = family_of(cfg).context_length(cfg)
            except NotImplementedError:  # a family that cannot generate: its points say so (unsupported)
                continue
            if inputs and max(inputs) + max(value) > positions:
                raise ValueError(f"input {max(inputs)} + output {max(value)} tokens exceed the {positions} positions "
                                 f"of {preset}")
        return value


def offline_points(params: Params, system: System, bandwidth: dict | None = None) -> list[Point]:
    """Every preset x batch x output x input, shortest input first (a memory frontier is found before the
    longer ones); the first point of each preset carries the transformers reference."""
    from accel_kit.engine.generate_measure import GeneratePoint

    choice = system.adapter_instance().resolve_precision(params.precision)
    fixed = params.model_dump(include={"warmup", "trials", "seed", "time_budget_s", "memory_limit_gib"})
    points = []
    for preset in params.presets:
        for i, (b, n, t) in enumerate((b, n, t) for b in sorted(set(params.batch_sizes))
                                      for n in sorted(set(params.output_lens)) for t in sorted(set(params.input_lens))):
            points.append(GeneratePoint(system=system.id, precision=choice.precision, precision_reason=choice.reason,
                                        preset=preset, batch_size=b, input_len=t, output_len=n,
                                        hf_reference=params.hf_reference and i == 0, bandwidth=bandwidth, **fixed))
    return points


def serve_points(params: Params, system: System) -> list[Point]:
    """The serving kind's points (a server under load), declared beside the offline ones; none until it lands."""
    return []


def points(params: Params, system: System) -> list[Point]:
    return offline_points(params, system) + serve_points(params, system)


def run(params: Params, system: System, *, records_path: Path, run_id: str, profile: str | None = None,
        progress: bool = True, rerun: bool = False) -> list[dict]:
    """The measured bandwidth first (once, a point of its own), then every point through the sweep runner, with the
    matmul peak of the prefill's shapes measured before the first."""
    from accel_kit.engine.sweep import BandwidthReference, PeakReference, run_sweep
    from accel_kit.models import family_of, get_config

    measured = BandwidthReference(system.id, sizes_mib=tuple(params.bandwidth_mib),
                                  enabled=params.measure_bandwidth).get()
    todo = offline_points(params, system, measured.to_dict() if measured else None) + serve_points(params, system)
    cfg = get_config(params.presets[0])
    shapes = family_of(cfg).gemm_shapes(cfg, max(params.batch_sizes) * min(params.input_lens))
    peak = PeakReference(system.id, shapes, enabled=params.measure_peak)
    in_points = set().union(*(type(p).model_fields for p in todo)) if todo else set()
    extra = params.model_dump(exclude=in_points) | {"profile": profile}
    return run_sweep(STUDY, todo, records_path=records_path, run_id=run_id, extra_params=extra,
                     timeout_s=params.timeout_s, progress=progress, peak=peak, rerun=rerun)


# ---- presentation -------------------------------------------------------------------------------

TABLE_KEYS = ["system", "preset", "precision", "batch_size", "input_len", "output_len"]
TABLE_METRICS = ["ttft_s", "prefill_tokens_per_s", "mfu_pct", "mfu_measured_pct", "decode_tokens_per_s",
                 "tpot_p50_s", "tpot_p90_s", "tpot_p99_s", "mbu_pct", "mbu_measured_pct", "output_tokens_per_s",
                 "hf_decode_tokens_per_s", "hf_tokens_equal", "energy_per_output_token_j", "mem_peak_gib",
                 "kv_cache_gib"]


def table(df: pd.DataFrame) -> pd.DataFrame:
    """One row per point (its latest record): TTFT and prefill rate, decode rate and TPOT percentiles, MFU and
    MBU both ways, the transformers reference where timed, energy and memory."""
    if df.empty:
        return df
    df = results.latest(identity.with_point_key(df))
    keys = [k for k in identity.with_varying(TABLE_KEYS, df) if k in df.columns]
    cols = keys + ["kind", "status", *TABLE_METRICS, *energy.table_columns(df), "reason", "record_id"]
    cols = [c for c in dict.fromkeys(cols) if c in df.columns]
    order = [k for k in TABLE_KEYS if k in keys] + [k for k in keys if k not in TABLE_KEYS]  # batch before the rest
    return df[cols].sort_values(order, kind="stable").reset_index(drop=True)


def _ok(df: pd.DataFrame) -> pd.DataFrame:
    if df.empty or "decode_tokens_per_s" not in df.columns:
        return df.iloc[0:0]
    df = results.latest(identity.with_point_key(df))
    return df[(df["status"] == "ok") & (df.get("kind") == "generate")].copy()


def figures(df: pd.DataFrame) -> dict:
    """Throughput against batch (decode and prefill tokens/s), and TTFT and TPOT p50 against batch: one line
    per system, preset, input and output length."""
    from accel_kit import plots

    ok = _ok(df)
    if ok.empty:
        return {}
    group = ["system", "preset"] + [f for f in ("input_len", "output_len") if f in ok.columns]
    ok = ok.assign(ttft_ms=ok["ttft_s"] * 1e3, tpot_p50_ms=ok["tpot_p50_s"] * 1e3)
    hover = ["tpot_p90_s", "tpot_p99_s", "mbu_pct", "mbu_measured_pct", "mfu_pct", "record_id"]
    specs = {"inference_decode_throughput": ("decode_tokens_per_s", "Decode throughput against batch", "tokens/s"),
             "inference_prefill_throughput": ("prefill_tokens_per_s", "Prefill throughput against batch", "tokens/s"),
             "inference_ttft": ("ttft_ms", "Time to first token against batch", "TTFT (ms)"),
             "inference_tpot": ("tpot_p50_ms", "Time per output token (p50) against batch", "TPOT p50 (ms)")}
    return {name: plots.line(ok, x="batch_size", y=y, group=group, title=title, x_title="batch size (sequences)",
                             y_title=y_title, log_x=True, hover=hover)
            for name, (y, title, y_title) in specs.items() if ok[y].notna().any()}


def _measured(row: Any, rate: str) -> noise.Measured:
    samples = row.get(f"{rate}_trials")
    samples = tuple(samples) if isinstance(samples, (list, tuple)) else ()
    return noise.Measured(float(row[rate]), samples=samples)


def findings(df: pd.DataFrame) -> list[dict]:
    """Per system, preset, input and output: the largest batch's decode tokens/s against batch 1's, and ours
    against transformers' where timed; each with the interval of the ratio of medians (``noise.ratio_text``)."""
    ok = _ok(df)
    out: list[dict] = []
    if ok.empty:
        return out
    for (system, preset, t, n), g in ok.groupby(["system", "preset", "input_len", "output_len"], sort=True):
        g = g[g["decode_tokens_per_s"].notna()].sort_values("batch_size")
        where = f"{system} ({preset}, in {int(t)}, out {int(n)})"
        if g["batch_size"].nunique() > 1:
            lo, hi = g.iloc[0], g.iloc[-1]
            verdict = noise.ratio_text(_measured(hi, "decode_tokens_per_s"), _measured(lo, "decode_tokens_per_s"))
            out.append({"text": f"{where}: decode at batch {int(hi['batch_size'])} gives {verdict} the tokens/s of "
                                f"batch {int(lo['batch_size'])}", "record_ids": [lo["record_id"], hi["record_id"]]})
        timed = g[g["hf_decode_tokens_per_s"].notna()] if "hf_decode_tokens_per_s" in g.columns else g.iloc[0:0]
        for _, row in timed.iterrows():
            verdict = noise.ratio_text(_measured(row, "decode_tokens_per_s"), _measured(row, "hf_decode_tokens_per_s"))
            same = "equal" if row.get("hf_tokens_equal") is True else "NOT equal"
            out.append({"text": f"{where}, batch {int(row['batch_size'])}: our decode gives {verdict} transformers' "
                                f"generate tokens/s (greedy tokens {same})", "record_ids": [row["record_id"]]})
    return out

