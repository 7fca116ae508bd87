"""A load's requests reduced to a serving point's metrics: throughput, latency percentiles, goodput.

The definitions are vLLM's benchmark's (``vllm bench serve``), so the figures read the same way:
TTFT from a request's send to its first streamed token; ITL each gap between successive tokens;
TPOT a request's time after its first token over its tokens after the first; end-to-end latency
from send to the last byte. Throughput is over the load's wall time (first send to last answer).
Goodput counts the requests that met both SLO limits (TTFT and TPOT, MLPerf Inference's server
limits for Llama 3.1 8B by default: 2000 ms and 100 ms), per second of the same wall time.
"""
from __future__ import annotations

import re
from typing import Sequence

import numpy as np

from accel_kit.errors import ParameterError
from accel_kit.json_types import JSONObject
from accel_kit.serving.load import RequestResult
from accel_kit.timing import PERCENTILES, percentiles  # noqa: F401 (PERCENTILES: read as stats.PERCENTILES)

#: MLPerf Inference v5.0, Llama 3.1 8B, server scenario: TTFT and TPOT limits at the 99th percentile
MLPERF_SLO_S = (2.0, 0.1)
LATENCIES = ("ttft", "tpot", "itl", "e2e")

_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(ms|s)?\s*$")


def parse_duration_s(value: object) -> float:
    """A duration in seconds from a number (seconds) or a text with its unit ("2000ms", "0.1 s")."""
    if isinstance(value, bool):
        raise ValueError(value)
    if isinstance(value, (int, float)):
        return float(value)
    match = _DURATION.match(str(value))
    if not match:
        raise ValueError(value)
    return float(match.group(1)) / (1000.0 if match.group(2) == "ms" else 1.0)


def parse_slo(value: str | Sequence[object]) -> tuple[float, float]:
    """(TTFT, TPOT) limits in seconds from a pair (numbers in seconds, or texts with units) or one text
    "2000ms,100ms"; a ParameterError unless it is two positive durations."""
    parts = value.replace("/", ",").split(",") if isinstance(value, str) else value
    try:
        ttft, tpot = (parse_duration_s(p) for p in parts)
    except (TypeError, ValueError):
        raise ParameterError(f"slo must be two positive durations (TTFT, TPOT), e.g. [2000ms, 100ms]; got {value!r}"
                             ) from None
    if not (ttft > 0 and tpot > 0 and np.isfinite(ttft) and np.isfinite(tpot)):
        raise ParameterError(f"slo must be two positive durations (TTFT, TPOT); got {value!r}")
    return ttft, tpot


def load_metrics(results: Sequence[RequestResult], duration_s: float,
                 slo_s: tuple[float, float]) -> JSONObject:
    """The serving metrics of one load (names declared by the serve kind, ``accel_kit.engine.serve_measure``)."""
    ok = [r for r in results if r.error is None]
    ttft_limit, tpot_limit = slo_s
    # a one-token answer has no TPOT: it meets that limit trivially, as vLLM's goodput counts it
    good = [r for r in ok if r.ttft_s <= ttft_limit and (r.tpot_s is None or r.tpot_s <= tpot_limit)]
    out_tokens = sum(r.output_tokens for r in ok)
    metrics: JSONObject = {
        "serve_requests_ok": len(ok), "serve_requests_failed": len(results) - len(ok),
        "serve_duration_s": duration_s,
        "serve_requests_per_s": len(ok) / duration_s if duration_s > 0 else None,
        "serve_output_tokens_per_s": out_tokens / duration_s if duration_s > 0 else None,
        "serve_output_tokens": out_tokens,
        "goodput_requests_per_s": len(good) / duration_s if duration_s > 0 else None,
        "goodput_pct": 100.0 * len(good) / len(results) if results else None,
        "slo_ttft_s": ttft_limit, "slo_tpot_s": tpot_limit,
    }
    metrics |= percentiles([r.ttft_s for r in ok], "serve_ttft")
    metrics |= percentiles([r.tpot_s for r in ok], "serve_tpot")
    metrics |= percentiles([gap for r in ok for gap in r.itl_s], "serve_itl")
    metrics |= percentiles([r.e2e_s for r in ok], "serve_e2e")
    return metrics
