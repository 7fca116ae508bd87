"""The serve kind: a model preset behind a real OpenAI-compatible server, measured under one load.

A point is one engine (``transformers serve`` or vLLM) serving one preset in one precision, and one load
on it (a fixed concurrency, or Poisson arrivals at a request rate), its metrics those of
``accel_kit.serving.stats``: request and output-token throughput, TTFT, TPOT, ITL and end-to-end latency
at p50/p90/p99, and goodput under the point's SLO.

The server starts once for the consecutive points that share it (``server_key``: the same engine, preset,
precision and port): ``ServeGroups`` runs such a group against one server, started, health-checked, warmed up
with ``warmup_requests`` requests and stopped after the last, a failure included. A server that dies is
an ``error`` result with its log tail for the point it died under, and a new server is started for the
group's next point. The sweep runner measures a study's serve points through the kind's runner,
``SweepServe`` (in its own process, with the resume, the record and its writer it has for every kind); the
registry's ``measure`` (one point in a worker process) is the same call for a group of one. The first point
of a group pays its server's start, which its record keeps apart (``serve_server_start_s``,
``serve_warmup_s``).
"""
from __future__ import annotations

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
    if reason or point.engine != "vllm" or not adapter.is_host_cpu():
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


class ServeGroups:
    """Serve points measured one after another, consecutive points with one ``server_key`` against one server:
    started (with its model folder) at a group's first point, health-checked, warmed up with ``warmup_requests``
    requests, and stopped at the next group's first point or at ``close``; a server that dies is restarted for the
    group's next point. ``workdir`` holds the model folders and the servers' logs; ``device``: the server's."""

    def __init__(self, workdir: Path, device: str, deadline_s: float):
        self.workdir, self.device, self.deadline_s = Path(workdir), device, deadline_s
        self._key: tuple | None = None
        self._model_dir: Path | None = None
        self._server: S.Server | None = None
        self._overhead: dict[str, float] = {}

    def measure(self, point: ServePoint) -> Result:
        """``point``'s result against its group's server (a failure of the point's own is its ``error`` result;
        bad input, an ``AccelKitError``, is raised: it fails every point alike)."""
        if point.server_key() != self._key:
            self.close()
            self._key, self._model_dir = point.server_key(), self._write_model(point)
        try:
            if self._server is None:
                self._server = _server(point, self._model_dir, self.workdir, self.device).__enter__()
                self._overhead = {"serve_server_start_s": self._server.start_s,
                                  "serve_warmup_s": _warm_up(point, self._server)}
            result = _measure_one(point, self._server, self._overhead, self.deadline_s)
            self._overhead = {"serve_server_start_s": 0.0, "serve_warmup_s": 0.0}  # paid once, by the first point
            return result
        except S.ServerDied as e:
            self._stop()
            lines = [line for line in str(e).splitlines() if line.strip()]
            return failed("error", f"the {lines[0].removesuffix('; log tail:')}: {lines[-1].strip()}",
                          traceback=str(e), model=point.preset)
        except AccelKitError:
            raise  # bad input (a port taken, an engine missing): one line, for every point alike
        except Exception as e:  # noqa: BLE001 - one point's failure; the group's next points still run
            return failed("error", f"{type(e).__name__}: {e}", traceback=traceback.format_exc(), model=point.preset)

    def _write_model(self, point: ServePoint) -> Path:
        from accel_kit.serving.model_dir import write_model_dir

        S.check_engine(point.engine)  # bad input before its server starts: one line naming the make target
        return write_model_dir(point.preset, self.workdir / "models" / _file_name(point.preset),
                               weights=point.engine != "vllm", seed=point.seed)

    def _stop(self) -> None:
        if self._server is not None:
            self._server.stop()
        self._server = None

    def close(self) -> None:
        """Stop the current group's server (the sweep's last point done, or interrupted)."""
        self._stop()
        self._key = None

    def __enter__(self) -> "ServeGroups":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SweepServe:
    """The serve kind's runner in the sweep (``kinds.PointRunner``): its points in the sweep runner's process, one
    server per group (``ServeGroups``), each first asked whether the system can serve it (``unsupported_serve``:
    an ``unsupported`` result, no server started). The client is light, and the servers are processes of their
    own either way."""

    def __init__(self, workdir: Path, timeout_s: float):
        self.workdir, self.timeout_s = workdir, timeout_s
        self._groups: ServeGroups | None = None
        self._env: dict[str, dict[str, object]] = {}  # system -> its provenance (results.environment)

    def measure(self, point: ServePoint) -> Result:
        from accel_kit import results
        from accel_kit.systems import load_system

        adapter = load_system(point.system).device_adapter()
        if point.system not in self._env:
            self._env[point.system] = results.environment(adapter)
        env = self._env[point.system]
        reason = unsupported_serve(adapter, point)
        if reason:
            return failed("unsupported", reason, model=point.preset, env=env)
        if self._groups is None:
            self._groups = ServeGroups(self.workdir, adapter.torch_device().type, self.timeout_s)
        return self._groups.measure(point).model_copy(update={"env": env})

    def close(self) -> None:
        if self._groups is not None:
            self._groups.close()


def iter_results(points: Sequence[ServePoint], workdir: Path | None = None, *, device: str = "cpu",
                 deadline_s: float = 600.0) -> Iterator[Result]:
    """Each point's result, in order, as it is measured; consecutive points with one ``server_key`` share a server
    (``ServeGroups``). ``workdir`` holds the model folders and the servers' logs (a temporary folder when None)."""
    with tempfile.TemporaryDirectory(prefix="accel-kit-serve-") as scratch:
        with ServeGroups(Path(workdir) if workdir is not None else Path(scratch), device, deadline_s) as groups:
            for point in points:
                yield groups.measure(point)


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
register_kind(KIND, ServePoint, measure_serve, unsupported=unsupported_serve, runner=SweepServe, metrics=(
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
