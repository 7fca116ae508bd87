"""The Inference section: offline generation on every system (``accel_kit.studies.inference``), beside training.

One figure, the study's own decode throughput against batch over every system's records, and one pivot table:
per point (preset, batch, input and output length), TTFT, decode tokens/s, TPOT p50 and p99, the prefill's MFU
and the decode's MBU (each against the datasheet and the measured figure), and energy per output token.
"""
from __future__ import annotations

import accel_kit.report.render as R
from accel_kit.report.cells import MFU_DATASHEET, MFU_MEASURED, metric
from accel_kit.report.context import Context, Section, study_table
from accel_kit.report.figures import _figure
from accel_kit.report.pivot import pivot


def _ms(value: float) -> str:
    return R.fmt_num(value * 1e3)


def inference_section(ctx: Context) -> Section:
    s = Section("inference", "Inference: offline generation")
    s.text("<p>A batch of prompts prefilled, then decoded greedily through a static KV cache. TTFT is the prefill "
           "with the first new token; TPOT one decode step, its percentiles over every step of every trial. MFU is "
           "the prefill's; MBU the decode's bytes read (weights once per step, the KV cache at its length) over its "
           "time.</p>")
    _figure(ctx, s, "inference", "inference_decode_throughput", "inference-plot")
    t = study_table(ctx, "inference")
    if not t.empty and "kind" in t.columns:
        t = t[t["kind"] == "generate"]
    return s.table(pivot(ctx, "inference-data", t, study="inference",
                         base=["preset", "batch_size", "input_len", "output_len"], extra=[], quantities=[
                             ("TTFT (ms)", metric("ttft_s", _ms)),
                             ("decode tokens/s", metric("decode_tokens_per_s")),
                             ("TPOT p50 (ms)", metric("tpot_p50_s", _ms, default_reason="no decode step ran")),
                             ("TPOT p99 (ms)", metric("tpot_p99_s", _ms, default_reason="no decode step ran")),
                             MFU_DATASHEET, MFU_MEASURED,
                             ("MBU, datasheet bandwidth", metric("mbu_pct", R.fmt_pct, "mbu_reason")),
                             ("MBU, measured bandwidth", metric("mbu_measured_pct", R.fmt_pct, "mbu_measured_reason")),
                             ("energy per output token (J)", metric("energy_per_output_token_j",
                                                                     reason_key="energy_reason"))]))
