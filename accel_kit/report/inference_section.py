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

import accel_kit.report.render as R
from accel_kit.report.cells import MFU_DATASHEET, MFU_MEASURED, metric, rate
from accel_kit.report.context import Context, Section, study_table
from accel_kit.report.figures import _figure
from accel_kit.report.pivot import pivot


NO_CHECK = "the token check runs at each preset's first point (with transformers' generate beside ours)"


def _ms(value: float) -> str:
    return R.fmt_num(value * 1e3)


def _yes_no(value: bool) -> str:
    return "yes" if value else "no"


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
    _figure(ctx, s, "inference", "inference_decode_throughput", "inference-plot")
    _figure(ctx, s, "inference", "inference_decode_mbu", "inference-mbu-plot")
    t = study_table(ctx, "inference")
    if not t.empty and "kind" in t.columns:
        t = t[t["kind"] == "generate"]
    s.table(pivot(ctx, "inference-data", t, study="inference",
                  base=["preset", "batch_size", "input_len", "output_len"], extra=["impl"], quantities=[
                      ("TTFT (ms)", metric("ttft_s", _ms)),
                      ("decode tokens/s", metric("decode_tokens_per_s")),
                      ("TPOT p50 (ms)", metric("tpot_p50_s", _ms, default_reason="no decode step ran")),
                      ("TPOT p99 (ms)", metric("tpot_p99_s", _ms, default_reason="no decode step ran")),
                      MFU_DATASHEET, MFU_MEASURED,
                      ("MBU, datasheet bandwidth", metric("mbu_pct", R.fmt_pct, "mbu_reason")),
                      ("MBU, measured bandwidth", metric("mbu_measured_pct", R.fmt_pct, "mbu_measured_reason")),
                      ("energy per output token (J)", metric("energy_per_output_token_j",
                                                              reason_key="energy_reason")),
                      # the token check (docs/inference.md): equality in fp32, agreement in the run's precision
                      ("fp32 greedy tokens equal transformers'", metric("tokens_equal_fp32", _yes_no,
                                                                        default_reason=NO_CHECK)),
                      ("top-1 agreement with transformers", metric("top1_agreement", lambda v: R.fmt_pct(100 * v),
                                                                   default_reason=NO_CHECK)),
                      ("largest logit difference", metric("max_logit_diff", default_reason=NO_CHECK))]))
    return serve_part(ctx, s)


def serve_part(ctx: Context, s: Section) -> Section:
    """Serving: the throughput-latency figure and the serve pivot (one row block per load)."""
    from accel_kit.studies import inference

    s.text("<p>Serving: a real OpenAI-compatible server on the loopback under a fixed concurrency or Poisson "
           "arrivals at a request rate; latency percentiles over the load's requests, goodput the requests per "
           "second meeting the SLO (p99 TTFT and TPOT limits). One load per run: a spread is the range of a "
           "point's runs.</p>")
    _figure(ctx, s, "inference", "inference_serve_throughput_latency", "inference-serve-plot")
    df = ctx.study("inference")
    t = inference.serve_table(df) if not df.empty else df

    def served(label: str, name: str) -> list:
        return rate("inference", label, name, rates=inference.SERVE_RATES,
                    no_spread="one run of this load: noise not measured")

    return s.table(pivot(ctx, "inference-serve-data", t, study="inference",
                         base=["preset", "engine", "concurrency", "request_rate"],
                         extra=["prompt_tokens", "output_tokens"], quantities=[
                             *served("output tokens/s", "serve_output_tokens_per_s"),
                             *served("requests/s", "serve_requests_per_s"),
                             ("TTFT p50 (ms)", metric("serve_ttft_p50_s", _ms)),
                             ("TTFT p99 (ms)", metric("serve_ttft_p99_s", _ms)),
                             ("TPOT p50 (ms)", metric("serve_tpot_p50_s", _ms, default_reason="no request streamed "
                                                      "more than one token")),
                             ("TPOT p99 (ms)", metric("serve_tpot_p99_s", _ms, default_reason="no request streamed "
                                                      "more than one token")),
                             ("goodput (requests/s)", metric("goodput_requests_per_s")),
                             ("goodput (% of requests)", metric("goodput_pct", R.fmt_pct))]))
