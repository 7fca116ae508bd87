"""The Inference section: offline generation and serving on every system (``accel_kit.studies.inference``), beside
training.

Offline: the study's own decode throughput against batch and the decode's MBU over every system's records, and one
pivot table per point (preset, batch, input and output length): TTFT, decode tokens/s, TPOT p50 and p99, the
prefill's MFU and the decode's MBU (each against the datasheet and the measured figure), and energy per output token.
Serving: the throughput-latency curve (output tokens/s against TPOT p99, one line per system, engine and preset)
and one pivot per load (engine, preset, concurrency or request rate): output tokens/s and requests/s with their
spread over the point's runs, TTFT and TPOT p50 and p99, and goodput under the SLO.
"""
from __future__ import annotations

from accel_kit.report.context import Context, Section
from accel_kit.report.figures import figure
from accel_kit.report.pivot import declared_pivot


def inference_section(ctx: Context) -> Section:
    s = Section("inference", "Inference: offline generation and serving")
    s.text("<p>A batch of prompts prefilled, then decoded greedily through a static KV cache. TTFT is the prefill "
           "with the first new token; TPOT one decode step, its percentiles over every step of every trial. MFU is "
           "the prefill's; MBU the decode's bytes read (weights once per step, the KV cache at its length) over its "
           "time. Each point says its decode step (impl: eager, or compiled: one captured graph a step where the device has "
           "graphs). At each preset's first point, the token check: greedy tokens against transformers' in fp32, where "
           "equality is defined, and in the run's precision the share of positions whose top-1 token agrees and the "
           "largest logit difference (16-bit sums in another order flip near-ties, so whole sequences there are not "
           "compared).</p>")
    figure(ctx, s, "inference", "inference_decode_throughput", "inference-plot")
    figure(ctx, s, "inference", "inference_decode_mbu", "inference-mbu-plot")
    s.table(declared_pivot(ctx, "inference", "inference-data"))
    return serve_part(ctx, s)


def serve_part(ctx: Context, s: Section) -> Section:
    """Serving: the throughput-latency figure and the serve pivot (one row block per load)."""
    s.text("<p>Serving: a real OpenAI-compatible server on the loopback under a fixed concurrency or Poisson "
           "arrivals at a request rate; latency percentiles over the load's requests, goodput the requests per "
           "second meeting the SLO (p99 TTFT and TPOT limits). One load per run: a spread is the range of a "
           "point's runs.</p>")
    figure(ctx, s, "inference", "inference_serve_throughput_latency", "inference-serve-plot")
    return s.table(declared_pivot(ctx, "inference", "inference-serve-data"))
