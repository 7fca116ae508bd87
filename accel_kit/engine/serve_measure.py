"""The serve kind: a model preset behind a real OpenAI-compatible server, measured under one load.

A point is one engine (``transformers serve`` or vLLM) serving one preset in one precision, and one load
on it (a fixed concurrency, or Poisson arrivals at a request rate), its metrics those of
``accel_kit.serving.stats``: request and output-token throughput, TTFT, TPOT, ITL and end-to-end latency
at p50/p90/p99, and goodput under the point's SLO.

The server starts once for the points that share it (``server_key``: the same engine, preset, precision
and port): ``measure_points`` runs such a group against one server, started, health-checked, warmed up
with ``warmup_requests`` requests and stopped after the last, a failure included. A server that dies is
an ``error`` result with its log tail for the point it died under, and a new server is started for the
group's next point. The registry's ``measure`` (one point per worker process, the sweep's way) is the
same call for a group of one: each such point pays its server's start, which its record keeps apart
(``serve_server_start_s``, ``serve_warmup_s``).
"""
from __future__ import annotations

import itertools
import re
import tempfile
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Literal, Sequence

from pydantic import Field, PositiveInt, model_validator

from accel_kit.engine.kinds import adapter_check, register_kind
from accel_kit.engine.point import NOT_IN_KEY, Point, _hash, key_fields
from accel_kit.engine.result import Result, failed
from accel_kit.errors import AccelKitError
from accel_kit.metrics import Metric
from accel_kit.serving import load as L
from accel_kit.serving import server as S
from accel_kit.serving import stats

if TYPE_CHECKING:
    from accel_kit.devices.base import BaseAdapter
    from accel_kit.engine.measurement import Context

KIND = "serve"
#: the head widths vLLM's CPU attention kernel is built for (vllm/v1/attention/backends/cpu_attn.py, 0.32.0)
VLLM_CPU_HEAD_DIMS = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


class ServePoint(Point):
    """One load on one server: ``engine`` serving ``preset``, at ``concurrency`` or ``request_rate``."""

    kind: Literal["serve"] = KIND
    engine: Literal["transformers", "vllm"] = "transformers"
    preset: str
    concurrency: PositiveInt | None = None
    request_rate: float | None = None  # requests per second, Poisson arrivals
    n_requests: PositiveInt = 16
    prompt_tokens: PositiveInt = 128
    output_tokens: PositiveInt = 128
    seed: int = 0
    slo_ttft_s: float = Field(default=stats.MLPERF_SLO_S[0], gt=0)
    slo_tpot_s: float = Field(default=stats.MLPERF_SLO_S[1], gt=0)
    warmup_requests: int = Field(default=1, ge=0)
    port: int | None = Field(default=None, ge=1, le=65535)  # None: the kernel picks a free one
    start_timeout_s: float = Field(default=300, gt=0)
    request_timeout_s: float = Field(default=300, gt=0)

    @model_validator(mode="after")
    def _one_load(self) -> "ServePoint":
        L.check_load(self.concurrency, self.request_rate)
        return self

    def label(self) -> str:
        load = f"concurrency {self.concurrency}" if self.concurrency else f"{self.request_rate:g} req/s"
        return f"{self.engine} {self.preset} {self.precision}, {load}"

    def key(self) -> str:
        # the port is where the server listens, not what is measured
        return _hash(key_fields(self.model_dump(exclude=NOT_IN_KEY | {"port", "start_timeout_s"})))

    def server_key(self) -> tuple:
        """Points with the same server key share one server."""
        return (self.system, self.engine, self.preset, self.precision, self.port)

    def load(self, deadline_s: float) -> L.Load:
        return L.Load(n_requests=self.n_requests, prompt_tokens=self.prompt_tokens, output_tokens=self.output_tokens,
                      concurrency=self.concurrency, request_rate=self.request_rate, seed=self.seed,
                      request_timeout_s=self.request_timeout_s, deadline_s=deadline_s)


def unsupported_serve(adapter: "BaseAdapter", point: ServePoint) -> str | None:
    """The adapter's answer, then the model's vocabulary (a byte-level BPE needs 257 ids), then the engine's: vLLM's
    CPU build on this CPU and this model's head width."""
    from accel_kit.models import family_of, get_config
    from accel_kit.serving.model_dir import MIN_VOCAB

    reason = adapter_check(adapter, point)
    cfg = get_config(point.preset)
    shape = family_of(cfg).shape(cfg)
    if reason is None and shape.vocab_size < MIN_VOCAB:
        reason = (f"{point.preset}'s vocabulary of {shape.vocab_size} ids cannot hold the byte-level BPE a server's "
                  f"tokenizer files are written from ({MIN_VOCAB} ids)")
    if reason or point.engine != "vllm" or adapter.torch_device().type != "cpu":
        return reason
    head_dim = shape.head_dim
    if head_dim not in VLLM_CPU_HEAD_DIMS:
        return (f"vLLM's CPU attention has no kernel for head_dim {head_dim} ({point.preset}); it has "
                f"{', '.join(map(str, VLLM_CPU_HEAD_DIMS))}")
    return S.vllm_cpu_reason()


def _file_name(preset: str) -> str:
    """A preset as one file name (an ``hf:`` preset is a path)."""
    return re.sub(r"[^\w.-]+", "_", preset).strip("_")[-100:]


def _server(point: ServePoint, model_dir: Path, log_dir: Path, device: str) -> S.Server:
    from accel_kit.models import get_config

    return S.Server(point.engine, model_dir, log_dir / f"{point.engine}-{_file_name(point.preset)}.log",
                    dtype=_DTYPES.get(point.precision, "float32"), max_model_len=get_config(point.preset).seq_len,
                    port=point.port, start_timeout_s=point.start_timeout_s, device=device)


def _warm_up(point: ServePoint, server: S.Server) -> float:
    """``warmup_requests`` short requests, one at a time, before the timed load; their wall time."""
    if not point.warmup_requests:
        return 0.0
    warm = L.Load(n_requests=point.warmup_requests, prompt_tokens=point.prompt_tokens, output_tokens=2,
                  concurrency=1, seed=point.seed + 10**6, request_timeout_s=point.request_timeout_s,
                  deadline_s=point.start_timeout_s)
    t0 = time.perf_counter()
    L.run_load(warm, server.base_url, server.model_name, server.model_dir, point.engine)
    return time.perf_counter() - t0


def _measure_one(point: ServePoint, server: S.Server, overhead: dict[str, float], deadline_s: float) -> Result:
    requests, duration_s = L.run_load(point.load(deadline_s), server.base_url, server.model_name, server.model_dir,
                                      point.engine)
    # a server that died under the load: its log tail, not a row of failed requests
    server.check_alive(wait_s=2.0 if any(r.error for r in requests) else 0.0)
    metrics = stats.load_metrics(requests, duration_s, (point.slo_ttft_s, point.slo_tpot_s)) | overhead
    if not metrics["serve_requests_ok"]:
        errors = sorted({r.error for r in requests if r.error})
        return failed("error", f"no request succeeded: {'; '.join(errors)[:500]}", metrics=metrics, model=point.preset)
    tokens_s = metrics["serve_output_tokens_per_s"]
    return Result(status="ok", metrics=metrics, model=point.preset, times_s=[duration_s],
                  summary=f"{tokens_s:.1f} out tok/s, p99 TPOT {1e3 * (metrics['serve_tpot_p99_s'] or 0):.0f} ms")


def _serve_group(points: Sequence[ServePoint], workdir: Path, device: str, deadline_s: float) -> Iterator[Result]:
    """The group's points against one server (restarted after a death), each point's result in order."""
    from accel_kit.serving.model_dir import write_model_dir

    first = points[0]
    model_dir = write_model_dir(first.preset, workdir / "models" / _file_name(first.preset),
                                weights=first.engine != "vllm", seed=first.seed)
    server: S.Server | None = None
    overhead: dict[str, float] = {}
    try:
        for point in points:
            try:
                if server is None:
                    server = _server(point, model_dir, workdir, device).__enter__()
                    overhead = {"serve_server_start_s": server.start_s, "serve_warmup_s": _warm_up(point, server)}
                yield _measure_one(point, server, overhead, deadline_s)
                overhead = {"serve_server_start_s": 0.0, "serve_warmup_s": 0.0}  # paid once, by the first point
            except S.ServerDied as e:
                if server is not None:
                    server.stop()
                server = None
                lines = [line for line in str(e).splitlines() if line.strip()]
                yield failed("error", f"the {lines[0].removesuffix('; log tail:')}: {lines[-1].strip()}",
                             traceback=str(e), model=point.preset)
            except AccelKitError:
                raise  # bad input (a port taken, an engine missing): one line, for every point alike
            except Exception as e:  # noqa: BLE001 - one point's failure; the group's next points still run
                yield failed("error", f"{type(e).__name__}: {e}", traceback=traceback.format_exc(), model=point.preset)
    finally:
        if server is not None:
            server.stop()


def iter_results(points: Sequence[ServePoint], workdir: Path | None = None, *, device: str = "cpu",
                 deadline_s: float = 600.0) -> Iterator[Result]:
    """Each point's result, in order, as it is measured; consecutive points with one ``server_key`` share a server.
    ``workdir`` holds the model folders and the servers' logs (a temporary folder when None)."""
    with tempfile.TemporaryDirectory(prefix="accel-kit-serve-") as scratch:
        root = Path(workdir) if workdir is not None else Path(scratch)
        for _, group in itertools.groupby(points, key=ServePoint.server_key):
            yield from _serve_group(list(group), root, device, deadline_s)


def measure_points(points: Sequence[ServePoint], workdir: Path | None = None, *, device: str = "cpu",
                   deadline_s: float = 600.0) -> list[Result]:
    """``iter_results`` as a list."""
    return list(iter_results(points, workdir, device=device, deadline_s=deadline_s))


def measure_serve(point: ServePoint, ctx: "Context") -> Result:
    from accel_kit import results

    S.check_engine(point.engine)
    (result,) = measure_points([point], device=ctx.device.type)
    return result.model_copy(update={"env": results.environment(ctx.adapter)})


_S = "s"
register_kind(KIND, ServePoint, measure_serve, unsupported=unsupported_serve, metrics=(
    Metric("serve_requests_ok", "1", "requests of the load that completed"),
    Metric("serve_requests_failed", "1", "requests of the load that failed or did not finish by its deadline"),
    Metric("serve_duration_s", _S, "the load's wall time, first request sent to last answer"),
    Metric("serve_requests_per_s", "requests/s", "completed requests over the load's wall time"),
    Metric("serve_output_tokens", "tokens", "output tokens the completed requests streamed"),
    Metric("serve_output_tokens_per_s", "tokens/s", "output tokens of the completed requests over the load's wall time"),
    Metric("goodput_requests_per_s", "requests/s", "requests meeting both SLO limits (TTFT, TPOT) per second"),
    Metric("goodput_pct", "%", "share of the load's requests meeting both SLO limits"),
    Metric("slo_ttft_s", _S, "the SLO's TTFT limit goodput counts against"),
    Metric("slo_tpot_s", _S, "the SLO's TPOT limit goodput counts against"),
    Metric("serve_server_start_s", _S, "the server's start to a healthy /health (0: started for an earlier point)"),
    Metric("serve_warmup_s", _S, "the warm-up requests before the timed load (0: warmed for an earlier point)"),
    *(Metric(f"serve_{name}_p{q}_s", _S, f"{what}, p{q} over the load's {over}")
      for name, what, over in (("ttft", "time to first token", "requests"),
                               ("tpot", "time per output token after the first", "requests"),
                               ("itl", "gap between successive streamed tokens", "tokens"),
                               ("e2e", "request latency, send to last token", "requests"))
      for q in stats.PERCENTILES),
))


def run_serve_points(study: str, points: Sequence[ServePoint], adapter: "BaseAdapter", *, records_path: Path,
                     run_id: str, extra_params: dict, rerun: bool = False, deadline_s: float = 600.0) -> list[dict]:
    """A study's serve points in this process, one server per group (``measure_points``), one record each, resumed
    as the sweep resumes (a point recorded with a final status is not run again unless ``rerun``); a point the
    adapter or the engine cannot run is its ``unsupported`` record. The sweep runner's alternative for serve
    points: the client is light, and the servers are processes of their own either way."""
    from accel_kit import results
    from accel_kit.engine.sweep import record_of, recorded

    done = recorded(records_path) if not rerun else {}
    todo = [p for p in points if p.key() not in done]
    reasons = {p.key(): unsupported_serve(adapter, p) for p in todo}
    for engine in sorted({p.engine for p in todo if not reasons[p.key()]}):
        S.check_engine(engine)  # bad input before any server starts: one line naming the make target
    runnable = [p for p in todo if not reasons[p.key()]]
    measured = iter_results(runnable, records_path.parent / "serve", device=adapter.torch_device().type,
                            deadline_s=deadline_s)
    env = results.environment(adapter)
    records = []
    try:
        for point in points:
            key = point.key()
            if key in done:
                records.append(done[key])
                continue
            # in the runnable points' order, so each record is written as its point ends
            result = failed("unsupported", reasons[key], model=point.preset) if reasons[key] else next(measured)
            record = record_of(study, point, result.model_copy(update={"env": env}), run_id=run_id,
                               params=extra_params | {"point_key": key})
            results.append_record(records_path, record, make_folder=True)
            records.append(record)
    finally:
        measured.close()  # the last group's server stopped, whatever ended the loop
    return records
