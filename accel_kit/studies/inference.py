"""Inference: offline generation (prefill and decode) of model presets, swept over batch, input and output length.

Each point is a ``generate`` point (``accel_kit.engine.generate_measure``): a batch of random prompts
prefilled, then decoded greedily through a static KV cache, the prefill (TTFT) and each decode step
(TPOT) timed by the one clock; prefill MFU against the datasheet and measured matmul peaks, decode MBU
against the datasheet and the measured memory bandwidth (measured once per run, before the points),
energy per output token where the device has a counter. The first point of each preset also times
transformers' ``generate`` from the same weights (``hf_reference``).

Serving is the study's second kind of point, ``serve`` (``accel_kit.engine.serve_measure``): each serve preset
behind a real OpenAI-compatible server (``transformers serve`` or vLLM) on the loopback, under a fixed concurrency
or Poisson arrivals at a request rate, seeded; request and output-token throughput, TTFT, TPOT, ITL and end-to-end
latency at p50/p90/p99, and goodput under an SLO. They run after the offline points, through the same sweep (its
resume and its records), one server per preset (the serve kind's runner, ``serve_measure.SweepServe``); no
concurrency and no request rate: no serving points.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Literal, Sequence

import pandas as pd

from pydantic import Field, PositiveInt, ValidationInfo, field_validator

from accel_kit import energy, identity, noise, results
from accel_kit.engine.point import Point
from accel_kit.params import PrecisionRequest, StudyParams
from accel_kit.results import Record
from accel_kit.serving.load import check_load
from accel_kit.serving.stats import MLPERF_SLO_S, parse_slo
from accel_kit.studies.study import ReportTable, Row, Study
from accel_kit.systems import System

NAME = "inference"


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
    # the decode step's implementations, one point each (accel_kit.models.generate); None: the device's default
    # (compiled where CUDA graphs replay it, else eager)
    impls: list[Literal["eager", "compiled"]] | None = None
    measure_peak: bool = True  # the matmul peak per precision, for the prefill's measured MFU
    measure_bandwidth: bool = True  # the memory bandwidth, for the decode's measured MBU
    # arrays the bandwidth's copy and triad run over, each past every last-level cache (an H200's L2: 60 MB)
    bandwidth_mib: list[PositiveInt] = Field(default=[512], min_length=1)
    time_budget_s: float | None = Field(default=None, gt=0)
    timeout_s: float = Field(default=1800, gt=0)
    memory_limit_gib: float | None = Field(default=None, gt=0)
    # ---- serving (the serve kind): every serve preset x input x output, under each concurrency and each rate
    engine: Literal["transformers", "vllm"] = "transformers"  # transformers serve runs everywhere; vLLM: make vllm
    serve_presets: list[str] | None = None  # None: the offline presets
    concurrencies: list[PositiveInt] = [1, 4, 16, 64]  # requests in flight at once, one point each
    request_rates: list[float] = []  # requests per second, Poisson arrivals seeded by `seed`, one point each
    n_requests: PositiveInt = 64  # requests of one point's load
    serve_input_lens: list[PositiveInt] = Field(default=[128], min_length=1)  # prompt tokens of each request
    serve_output_lens: list[PositiveInt] = Field(default=[128], min_length=1)  # max_tokens of each request
    # (TTFT, TPOT) limits goodput counts against: MLPerf Inference's Llama 3.1 8B server scenario by default
    slo: tuple[float, float] = MLPERF_SLO_S
    port: int | None = Field(default=None, ge=1, le=65535)  # the server's; None: the kernel picks a free one

    @field_validator("presets", "serve_presets")
    @classmethod
    def _known_presets(cls, value: list[str] | None) -> list[str] | None:
        """Presets that generate: one line naming a preset that is none, or whose model does not generate (an
        encoder's config would be served and measured as a generator: ok records, tokens/s, TPOT)."""
        from accel_kit.errors import ParameterError
        from accel_kit.models import family_of, get_config

        for preset in value or []:
            cfg = get_config(preset)  # one line naming the preset where it is none
            why = family_of(cfg).why_not_generating(cfg)
            if why:
                raise ParameterError(f"model preset {preset} does not generate: {why}")
        return value

    @field_validator("output_lens")
    @classmethod
    def _fits_positions(cls, value: list[int], info: ValidationInfo) -> list[int]:
        """An output longer than the model's positions is bad input, said before any point runs."""
        _check_positions(info.data.get("presets") or [], info.data.get("input_lens") or [], value)
        return value

    @field_validator("request_rates")
    @classmethod
    def _positive_rates(cls, value: list[float]) -> list[float]:
        for rate in value:
            check_load(None, rate)  # a rate of zero: one line
        return value

    @field_validator("serve_output_lens")
    @classmethod
    def _serve_fits_positions(cls, value: list[int], info: ValidationInfo) -> list[int]:
        presets = info.data.get("serve_presets") or info.data.get("presets") or []
        _check_positions(presets, info.data.get("serve_input_lens") or [], value)  # a server rejects it mid-load
        return value

    @field_validator("slo", mode="before")
    @classmethod
    def _slo_pair(cls, value: str | Sequence[object]) -> tuple[float, float]:
        return parse_slo(value)  # two positive durations, in seconds or with units ("2000ms,100ms")

    def serves(self) -> bool:
        return bool(self.concurrencies or self.request_rates)


def _check_positions(presets: list[str], inputs: list[int], outputs: list[int]) -> None:
    """An input plus output longer than a preset's positions: one line naming both."""
    from accel_kit.models import family_of, get_config

    for preset in presets:
        cfg = get_config(preset)
        try:
            positions = family_of(cfg).context_length(cfg)
        except NotImplementedError:  # a family that cannot generate: its points say so (unsupported)
            continue
        if inputs and outputs and max(inputs) + max(outputs) > positions:
            raise ValueError(f"input {max(inputs)} + output {max(outputs)} tokens exceed the {positions} positions "
                             f"of {preset}")


def check_serving(params: Params) -> None:
    """What only this machine can answer, before any point: the engine installed (naming its make target) and the
    port free; one line each (``accel_kit.serving.server``)."""
    from accel_kit.serving.server import check_engine, pick_port

    if params.serves():
        check_engine(params.engine)
        pick_port(params.port)


def offline_points(params: Params, system: System, bandwidth: dict | None = None) -> list[Point]:
    """Every preset x batch x output x input, shortest input first (a memory frontier is found before the
    longer ones); the first point of each preset carries the transformers reference."""
    from accel_kit.engine.generate_measure import GeneratePoint

    adapter = system.adapter_instance()
    choice = adapter.resolve_precision(params.precision)
    impls = list(dict.fromkeys(params.impls)) if params.impls else [adapter.decode_impl()]
    fixed = params.model_dump(include={"warmup", "trials", "seed", "time_budget_s", "memory_limit_gib"})
    points = []
    for preset in params.presets:
        for i, (b, n, t, impl) in enumerate((b, n, t, impl) for b in sorted(set(params.batch_sizes))
                                            for n in sorted(set(params.output_lens))
                                            for t in sorted(set(params.input_lens)) for impl in impls):
            points.append(GeneratePoint(system=system.id, precision=choice.precision, precision_reason=choice.reason,
                                        preset=preset, batch_size=b, input_len=t, output_len=n, impl=impl,
                                        hf_reference=params.hf_reference and i == 0, bandwidth=bandwidth, **fixed))
    return points


def serve_points(params: Params, system: System) -> list[Point]:
    """Every serve preset x input x output under each concurrency, then each request rate; one preset's points in a
    row, so they share one server (``ServePoint.server_key``)."""
    from accel_kit.engine.serve_measure import ServePoint

    choice = system.adapter_instance().resolve_precision(params.precision)
    loads = [{"concurrency": c} for c in sorted(set(params.concurrencies))] + \
        [{"request_rate": r} for r in sorted(set(params.request_rates))]
    fixed = dict(system=system.id, precision=choice.precision, precision_reason=choice.reason, engine=params.engine,
                 n_requests=params.n_requests, seed=params.seed, slo_ttft_s=params.slo[0], slo_tpot_s=params.slo[1],
                 port=params.port)
    return [ServePoint(preset=preset, prompt_tokens=t, output_tokens=n, **load, **fixed)
            for preset in params.serve_presets or params.presets
            for t in sorted(set(params.serve_input_lens)) for n in sorted(set(params.serve_output_lens))
            for load in loads]


def points(params: Params, system: System) -> list[Point]:
    return offline_points(params, system) + serve_points(params, system)


def run(params: Params, system: System, *, records_path: Path, run_id: str, profile: str | None = None,
        progress: bool = True, rerun: bool = False) -> list[Record]:
    """The measured bandwidth first (once, a point of its own), then every offline point through the sweep runner,
    with the matmul peak of the prefill's shapes measured before the first; then, in the same sweep, the serve
    points, one server per preset (in the runner's process: the serve kind's runner). The engine and the port are
    checked before anything runs."""
    from accel_kit.engine.sweep import BandwidthReference, PeakReference, run_sweep
    from accel_kit.models import family_of, get_config

    check_serving(params)
    served = serve_points(params, system)
    measured = BandwidthReference(system.id, sizes_mib=tuple(params.bandwidth_mib),
                                  enabled=params.measure_bandwidth).get()
    offline = offline_points(params, system, measured.to_dict() if measured else None)
    cfg = get_config(params.presets[0])
    shapes = family_of(cfg).gemm_shapes(cfg, max(params.batch_sizes) * min(params.input_lens))
    peak = PeakReference(system.id, shapes, enabled=params.measure_peak)
    in_points = set().union(*(type(p).model_fields for p in offline + served))
    extra = params.model_dump(exclude=in_points) | {"profile": profile}
    records = run_sweep(NAME, offline + served, records_path=records_path, run_id=run_id, extra_params=extra,
                        timeout_s=params.timeout_s, progress=progress, peak=peak, rerun=rerun)
    if served and progress:
        print(serve_progress(records), flush=True)
    return records


def serve_progress(records: list[Record]) -> str:
    """One line per serve record: its load, status and output tokens/s with p99 TPOT, or its reason."""
    lines = []
    for rec in records:
        if rec.kind != "serve":
            continue
        p, m = rec.params, rec.metrics
        load = f"concurrency {p['concurrency']}" if p.get("concurrency") else f"{p['request_rate']:g} req/s"
        tpot = f"{1e3 * m['serve_tpot_p99_s']:.0f} ms" if m.get("serve_tpot_p99_s") is not None else "none"
        said = (f"{m['serve_output_tokens_per_s']:.1f} output tokens/s, p99 TPOT {tpot}, "
                f"goodput {m['goodput_requests_per_s']:.2f} req/s" if rec.status == "ok" else rec.reason)
        lines.append(f"  {p['preset']} in {p['prompt_tokens']} out {p['output_tokens']}, {load}: {rec.status}: "
                     f"{said}")
    return "\n".join(lines)


# ---- presentation -------------------------------------------------------------------------------

TABLE_KEYS = ["system", "preset", "precision", "impl", "batch_size", "input_len", "output_len"]
TABLE_METRICS = ["ttft_s", "prefill_tokens_per_s", "mfu_pct", "mfu_measured_pct", "decode_tokens_per_s",
                 "tpot_p50_s", "tpot_p90_s", "tpot_p99_s", "mbu_pct", "mbu_measured_pct", "output_tokens_per_s",
                 "hf_decode_tokens_per_s", "tokens_equal_fp32", "top1_agreement", "max_logit_diff",
                 "energy_per_output_token_j", "mem_peak_gib",
                 "kv_cache_gib"]


def table(df: pd.DataFrame) -> pd.DataFrame:
    """One row per point (its latest record): TTFT and prefill rate, decode rate and TPOT percentiles, MFU and
    MBU both ways, the transformers reference where timed, energy and memory."""
    if not df.empty and "kind" in df.columns:
        df = df[df["kind"] != "serve"]  # serve_table's
    if df.empty:
        return df
    df = results.latest(identity.with_point_key(df))
    keys = [k for k in identity.with_varying(TABLE_KEYS, df) if k in df.columns]
    cols = keys + ["kind", "status", *TABLE_METRICS, *energy.table_columns(df), "reason", "record_id"]
    cols = [c for c in dict.fromkeys(cols) if c in df.columns]
    order = [k for k in TABLE_KEYS if k in keys] + [k for k in keys if k not in TABLE_KEYS]  # batch before the rest
    return df[cols].sort_values(order, kind="stable").reset_index(drop=True)


SERVE_KEYS = ["system", "engine", "preset", "precision", "prompt_tokens", "output_tokens", "concurrency",
              "request_rate"]
SERVE_METRICS = ["serve_requests_per_s", "serve_output_tokens_per_s",
                 *(f"serve_{name}_p{q}_s" for name in ("ttft", "tpot", "itl", "e2e") for q in (50, 90, 99)),
                 "goodput_requests_per_s", "goodput_pct", "slo_ttft_s", "slo_tpot_s", "serve_requests_failed",
                 "serve_server_start_s"]


# The serve rates a table spreads (``noise.with_spread``): one load per run, no trials, so a point's spread is the
# range of its runs, blank for a point run once.
SERVE_RATES = ("serve_output_tokens_per_s", "serve_requests_per_s", "goodput_requests_per_s")


def serve_table(df: pd.DataFrame) -> pd.DataFrame:
    """One row per serve point (its latest record): request and output-token throughput, TTFT, TPOT, ITL and
    end-to-end latency at p50/p90/p99 (seconds), goodput under the SLO beside the SLO, the server's start."""
    if df.empty or "kind" not in df.columns or not (df["kind"] == "serve").any():
        return df.iloc[0:0]
    df = results.latest(identity.with_point_key(df[df["kind"] == "serve"]))
    keys = [k for k in identity.with_varying(SERVE_KEYS, df) if k in df.columns]
    cols = [c for c in dict.fromkeys(keys + ["status", *SERVE_METRICS, "reason", "record_id"]) if c in df.columns]
    # concurrency points first (a rate point has none), each axis ascending
    order = [k for k in keys if k not in ("concurrency", "request_rate")] + \
        [k for k in ("concurrency", "request_rate") if k in keys]
    return df[cols].sort_values(order, kind="stable", na_position="last").reset_index(drop=True)


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
        return serve_figures(df)
    group = ["system", "preset"] + [f for f in ("input_len", "output_len") if f in ok.columns]
    ok = ok.assign(**{f"{name}_ms": ok[f"{name}_s"] * 1e3 if f"{name}_s" in ok else float("nan")
                      for name in ("ttft", "tpot_p50")})  # a record from before a metric existed lacks it
    hover = ["tpot_p90_s", "tpot_p99_s", "mbu_pct", "mbu_measured_pct", "mfu_pct", "record_id"]
    specs = {"inference_decode_throughput": ("decode_tokens_per_s", "Decode throughput against batch", "tokens/s"),
             "inference_prefill_throughput": ("prefill_tokens_per_s", "Prefill throughput against batch", "tokens/s"),
             "inference_ttft": ("ttft_ms", "Time to first token against batch", "TTFT (ms)"),
             "inference_tpot": ("tpot_p50_ms", "Time per output token (p50) against batch", "TPOT p50 (ms)")}
    return {name: plots.line(ok, x="batch_size", y=y, group=group, title=title, x_title="batch size (sequences)",
                             y_title=y_title, log_x=True, hover=hover)
            for name, (y, title, y_title) in specs.items() if y in ok and ok[y].notna().any()} \
        | mbu_figure(ok, group) | serve_figures(df)


def mbu_figure(ok: pd.DataFrame, group: list[str]) -> dict:
    """The decode's MBU against batch, one panel per bandwidth it is read against (the datasheet's, the measured
    one) where any record has it, one colour per system, preset, input and output: how close a decode step comes to
    the memory bandwidth on each system."""
    from accel_kit import plots

    refs = {"datasheet bandwidth": "mbu_pct", "measured bandwidth": "mbu_measured_pct"}
    parts = [ok.assign(bandwidth=label, mbu=ok[col]) for label, col in refs.items()
             if col in ok.columns and ok[col].notna().any()]
    if not parts:
        return {}
    long = pd.concat(parts, ignore_index=True).dropna(subset=["mbu"])
    return {"inference_decode_mbu": plots.grouped_bars(
        long, x="batch_size", y="mbu", facet="bandwidth", group=group, title="Decode memory-bandwidth utilisation",
        x_title="batch size (sequences)", y_title="MBU (% of the bandwidth)", facet_order=list(refs),
        hover=["decode_gbps", "tpot_p50_s", "record_id"],
        note="the bytes a decode step reads (weights once, the KV cache at its length) over the median trial's "
             "step time")}


def serve_figures(df: pd.DataFrame) -> dict:
    """TPOT p99 and goodput against concurrency (log axis), and against the request rate where rates ran: one line
    per system, engine, preset, input and output length."""
    from accel_kit import plots

    t = serve_table(df)
    t = t[t["status"] == "ok"] if not t.empty else t
    if t.empty:
        return {}
    t = t.assign(tpot_p99_ms=t["serve_tpot_p99_s"] * 1e3)
    group = ["system", "engine", "preset", "prompt_tokens", "output_tokens"]
    hover = ["serve_output_tokens_per_s", "serve_ttft_p99_s", "goodput_pct", "slo_ttft_s", "slo_tpot_s", "record_id"]
    out = {}
    curve = t[t["tpot_p99_ms"].notna() & t["serve_output_tokens_per_s"].notna()]
    if not curve.empty:  # every load of a line, concurrency and rate alike: the latency each throughput costs
        out["inference_serve_throughput_latency"] = plots.line(
            curve, x="tpot_p99_ms", y="serve_output_tokens_per_s", group=group,
            title="Serving: output throughput against TPOT p99", x_title="TPOT p99 (ms)",
            y_title="output tokens/s", hover=[c for c in ("concurrency", "request_rate") if c in curve] + hover)
    for x, x_title, log_x in (("concurrency", "concurrency (requests in flight)", True),
                              ("request_rate", "request rate (requests/s, Poisson)", False)):
        part = t[t[x].notna()] if x in t.columns else t.iloc[0:0]
        if part.empty:
            continue
        on = "concurrency" if x == "concurrency" else "request rate"
        for name, y, title, y_title in (("tpot", "tpot_p99_ms", f"Time per output token (p99) against {on}",
                                         "TPOT p99 (ms)"),
                                        ("goodput", "goodput_requests_per_s", f"Goodput against {on}",
                                         "goodput (requests/s meeting the SLO)")):
            if part[y].notna().any():
                out[f"inference_serve_{name}_{x}"] = plots.line(part, x=x, y=y, group=group, title=title,
                                                                x_title=x_title, y_title=y_title, log_x=log_x,
                                                                hover=hover)
    return out


def _measured(row: pd.Series, rate: str) -> noise.Measured:
    samples = row.get(f"{rate}_trials")
    samples = tuple(samples) if isinstance(samples, (list, tuple)) else ()
    return noise.Measured(float(row[rate]), samples=samples)


def findings(df: pd.DataFrame) -> list[dict]:
    """Per system, preset, input and output: the largest batch's decode tokens/s against batch 1's, and ours
    against transformers' where timed; each with the interval of the ratio of medians (``noise.ratio_text``)."""
    ok = _ok(df)
    out: list[dict] = serve_findings(df)
    if ok.empty:
        return out
    ok = ok.assign(impl=ok["impl"].fillna("eager") if "impl" in ok.columns else "eager")  # older records: eager
    for (system, preset, t, n, impl), g in ok.groupby(["system", "preset", "input_len", "output_len", "impl"],
                                                      sort=True):
        g = g[g["decode_tokens_per_s"].notna()].sort_values("batch_size")
        where = f"{system} ({preset}, in {int(t)}, out {int(n)}, {impl} decode)"
        if g["batch_size"].nunique() > 1:
            lo, hi = g.iloc[0], g.iloc[-1]
            verdict = noise.ratio_text(_measured(hi, "decode_tokens_per_s"), _measured(lo, "decode_tokens_per_s"))
            out.append({"text": f"{where}: decode at batch {int(hi['batch_size'])} gives {verdict} the tokens/s of "
                                f"batch {int(lo['batch_size'])}", "record_ids": [lo["record_id"], hi["record_id"]]})
        timed = g[g["hf_decode_tokens_per_s"].notna()] if "hf_decode_tokens_per_s" in g.columns else g.iloc[0:0]
        for _, row in timed.iterrows():
            verdict = noise.ratio_text(_measured(row, "decode_tokens_per_s"), _measured(row, "hf_decode_tokens_per_s"))
            out.append({"text": f"{where}, batch {int(row['batch_size'])}: our decode gives {verdict} "
                                f"transformers' generate tokens/s ({token_check_text(row)})",
                        "record_ids": [row["record_id"]]})
    return out


def token_check_text(row: pd.Series) -> str:
    """The token check in words (``generate_measure.token_check``; docs/inference.md states the rule): fp32 greedy
    tokens equal or where they first differ, then the run precision's top-1 agreement and largest logit gap."""
    equal = row.get("tokens_equal_fp32")
    if equal is None or (isinstance(equal, float) and math.isnan(equal)):
        return "no token check in this record"
    first = row.get("first_difference")
    fp32 = ("fp32 greedy tokens equal" if bool(equal) else
            f"fp32 greedy tokens differ from new token {int(first)}" if first is not None and not (
                isinstance(first, float) and math.isnan(first)) else "fp32 greedy tokens differ")
    return (f"{fp32}; {row.get('precision')} top-1 agreement {100 * float(row['top1_agreement']):.1f} %, "
            f"largest logit difference {float(row['max_logit_diff']):.3g}")


def serve_findings(df: pd.DataFrame) -> list[dict]:
    """Per system, engine, preset, input and output over its concurrency points: the largest concurrency whose
    p99 TTFT and p99 TPOT both meet the SLO (MLPerf Inference's rule), and the output tokens/s there against the
    smallest concurrency's. One load per point: no interval, so the figures are stated, not compared as a gain."""
    t = serve_table(df)
    if t.empty or "concurrency" not in t.columns:
        return []
    t = t[(t["status"] == "ok") & t["concurrency"].notna()]
    out = []
    keys = [k for k in ("system", "engine", "preset", "prompt_tokens", "output_tokens") if k in t.columns]
    for values, g in t.groupby(keys, sort=True):
        g = g.sort_values("concurrency")
        row = dict(zip(keys, values))
        ttft, tpot = g.iloc[0]["slo_ttft_s"], g.iloc[0]["slo_tpot_s"]
        meets = g[(g["serve_ttft_p99_s"] <= ttft) & (g["serve_tpot_p99_s"].fillna(0) <= tpot)]
        slo = f"p99 TTFT <= {1e3 * ttft:g} ms and TPOT <= {1e3 * tpot:g} ms"
        where = (f"{row.get('system')} ({row.get('engine')} serving {row.get('preset')}, in {row.get('prompt_tokens')}"
                 f", out {row.get('output_tokens')})")
        said = (f"the SLO ({slo}) holds up to concurrency {int(meets['concurrency'].max())}" if not meets.empty
                else f"no concurrency meets the SLO ({slo})")
        lo, hi = g.iloc[0], g.iloc[-1]
        if len(g) > 1:
            said += (f"; output tokens/s {lo['serve_output_tokens_per_s']:.1f} at concurrency {int(lo['concurrency'])}"
                     f", {hi['serve_output_tokens_per_s']:.1f} at {int(hi['concurrency'])} (one load each)")
        out.append({"text": f"{where}: {said}", "record_ids": list(g["record_id"])})
    return out


NO_CHECK = "the token check runs at each preset's first point (with transformers' generate beside ours)"
NO_DECODE = "no request streamed more than one token"


def generate_rows(t: pd.DataFrame, df: pd.DataFrame) -> pd.DataFrame:
    """The offline-generation rows of the study's table (the serve points have their own)."""
    return t[t["kind"] == "generate"] if not t.empty and "kind" in t.columns else t


STUDY = Study(
    NAME, Params, table, figures, points=points, run=run, keys=tuple(TABLE_KEYS), findings=findings,
    work="inference", tables={"serve_table": serve_table},
    report=(
        ReportTable("inference-data", ("preset", "batch_size", "input_len", "output_len"), extra=("impl",),
                    select=generate_rows, rows=(
            Row("ttft_s", "TTFT (ms)", "ms"), Row("decode_tokens_per_s", "decode tokens/s"),
            Row("tpot_p50_s", "TPOT p50 (ms)", "ms", reason="no decode step ran"),
            Row("tpot_p99_s", "TPOT p99 (ms)", "ms", reason="no decode step ran"),
            Row("mfu_pct"), Row("mfu_measured_pct"),
            Row("mbu_pct", "MBU, datasheet bandwidth"), Row("mbu_measured_pct", "MBU, measured bandwidth"),
            Row("energy_per_output_token_j", "energy per output token (J)", reason_key="energy_reason"),
            # the token check (docs/inference.md): equality in fp32, agreement in the run's precision
            Row("tokens_equal_fp32", "fp32 greedy tokens equal transformers'", "yes_no", reason=NO_CHECK),
            Row("top1_agreement", "top-1 agreement with transformers", "share_pct", reason=NO_CHECK),
            Row("max_logit_diff", "largest logit difference", reason=NO_CHECK))),
        # one load per run: a spread is the range of a point's runs
        ReportTable("inference-serve-data", ("preset", "engine", "concurrency", "request_rate"),
                    extra=("prompt_tokens", "output_tokens"), table="serve_table", rates=SERVE_RATES,
                    no_spread="one run of this load: noise not measured", rows=(
            Row("serve_output_tokens_per_s"), Row("serve_requests_per_s"),
            Row("serve_ttft_p50_s", "TTFT p50 (ms)", "ms"), Row("serve_ttft_p99_s", "TTFT p99 (ms)", "ms"),
            Row("serve_tpot_p50_s", "TPOT p50 (ms)", "ms", reason=NO_DECODE),
            Row("serve_tpot_p99_s", "TPOT p99 (ms)", "ms", reason=NO_DECODE),
            Row("goodput_requests_per_s", spread=False), Row("goodput_pct")))))
