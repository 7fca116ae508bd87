"""The offline-generation kind (``generate``): a batch of prompts prefilled, then decoded greedily, each step timed.

One iteration of the shared measurement path (``accel_kit.engine.measurement``) is one whole greedy generation
(``accel_kit.models.generate.Decoder``, a static KV cache allocated once for input plus output), its decode step
``eager`` or ``compiled`` (the point's ``impl``, recorded): a ``Timeline`` (``accel_kit.timing``) marks the prefill
(the first new token included: TTFT) and every decode step (TPOT) with the device's events and synchronises once
at the end of the generation, so the steps queue back to back as they would in a server. From the trials:

- prefill tokens/s (batch x input over TTFT) and its TFLOP/s (``Family.prefill_flops``), whose MFU the
  shared path reads against the datasheet and the measured matmul peak, as a training step's;
- decode tokens/s (batch x decode steps over their time) and TPOT's p50/p90/p99 over every decode step
  of every trial; the bytes the steps read (``Family.decode_step_bytes``: weights once per step, the KV
  cache at each step's length) over their time is the decode's GB/s, whose MBU is read against the
  datasheet bandwidth and the run's measured one (``accel_kit.peaks.mbu_metrics``);
- the peak memory of the window (weights, KV cache, activations), and energy per output token where the
  device has a counter (the meter spans the trials).

Where the point asks (``hf_reference``), after the window, outside the energy meter and the peak memory read:
transformers' ``generate`` (static cache, greedy) from the same weights, timed (its decode tokens/s beside
ours), and the token check (``token_check``): whether greedy tokens equal in fp32, where equality is defined,
and in the run's precision the share of positions where our top-1 token equals theirs on the same prefix and
the largest logit difference (16-bit products in other orders break near-ties, so equal tokens are not
expected there).
"""
from __future__ import annotations

import hashlib
import json
import statistics
import time
from typing import ClassVar, Literal

import torch
from pydantic import PositiveInt, model_validator

from accel_kit import flops as F
from accel_kit import peaks
from accel_kit.engine import measurement
from accel_kit.engine.kinds import adapter_check, register_kind
from accel_kit.engine.measurement import Context, GiB, KindMeasurement, Window
from accel_kit.engine.point import NOT_IN_KEY, Frontier, Point
from accel_kit.engine.result import Result
from accel_kit.json_types import JSONObject
from accel_kit.metrics import Metric
from accel_kit.timing import PERCENTILES, Timeline, Timing, percentiles

KIND = "generate"


class GeneratePoint(Point):
    """One offline-generation point: ``batch_size`` prompts of ``input_len`` tokens, ``output_len`` generated."""

    kind: Literal["generate"] = KIND
    ENERGY_WORK: ClassVar[str | None] = "tokens"  # tokens_per_j counts output tokens
    RATE_METRIC: ClassVar[str | None] = "prefill_tflops_per_device"  # the MFU's numerator: the prefill's
    preset: str
    batch_size: PositiveInt
    input_len: PositiveInt
    output_len: PositiveInt
    warmup: int = 1
    trials: PositiveInt = 3
    seed: int = 0
    hf_reference: bool = False  # time transformers' generate from the same weights after the window
    impl: Literal["eager", "compiled"] = "eager"  # the decode step (accel_kit.models.generate.IMPLS)
    bandwidth: JSONObject | None = None  # the run's measured memory bandwidth (peaks.MeasuredBandwidth)

    @model_validator(mode="after")
    def _compiled_warms_up(self) -> "GeneratePoint":
        if self.impl == "compiled" and self.warmup < 1:
            raise ValueError("impl compiled needs warmup >= 1: the first generation compiles (and captures) the step")
        return self

    def label(self) -> str:
        return (f"{self.preset} {self.precision} {self.impl}, batch {self.batch_size}, in {self.input_len}, "
                f"out {self.output_len}")

    def frontier(self) -> Frontier:
        """Longer prompts of the same configuration are skipped once one runs out of memory."""
        fields = self.model_dump(exclude=NOT_IN_KEY | {"input_len"})
        return Frontier(hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16], "input_len",
                        self.input_len)

    def preload_modules(self) -> tuple[str, ...]:
        return ("transformers",) if self.hf_reference else ()

    def record_params(self) -> JSONObject:
        return self.model_dump(exclude={"peak", "bandwidth", "system"})  # the measured figures go to the metrics


def generation_work(family, cfg, batch: int, input_len: int, output_len: int, dtype_bytes: int) -> tuple[int, int, int]:
    """(prefill FLOPs, FLOPs of every decode step, bytes every decode step reads) of one greedy generation of
    ``batch`` prompts of ``input_len`` tokens to ``output_len`` new ones: what a ``generate`` record keeps, and what
    the inference predictor (``accel_kit.predict.inference``) counts for a generation not run."""
    prefill = family.prefill_flops(cfg, batch, input_len)
    # decode step i (1 .. n-1) feeds token t + i - 1 and attends over t + i positions
    lengths = range(input_len + 1, input_len + output_len)
    flops = sum(family.decode_step_flops(cfg, batch, c) for c in lengths)
    read = sum(family.decode_step_bytes(cfg, batch, c, weight_bytes=dtype_bytes, kv_bytes=dtype_bytes)
               for c in lengths)
    return prefill, flops, read


class GenerateMeasurement(KindMeasurement):
    """Timed greedy generations of one batch; the prefill and each decode step read from each trial's Stopwatch."""

    work = "tokens"

    def __init__(self, point: GeneratePoint, ctx: Context):
        from accel_kit.models import family_of, get_config
        from accel_kit.precision import dtype_of

        super().__init__(point, ctx)
        self.dtype = dtype_of(point.precision)
        self.total_len = point.input_len + point.output_len
        self.cfg = get_config(point.preset, seq_len=self.total_len)  # position tables for input plus output
        self.family = family_of(self.cfg)
        b, e = point.batch_size, self.dtype.itemsize
        self.prefill_flops, self.decode_flops, self.decode_bytes = generation_work(
            self.family, self.cfg, b, point.input_len, point.output_len, e)
        self.kv_cache_bytes = self.family.kv_cache_bytes(self.cfg, b, self.total_len, e)
        shape = self.family.shape(self.cfg).record()
        self.base = {"prefill_flops": self.prefill_flops, "decode_flops": self.decode_flops,
                     "decode_bytes": self.decode_bytes, "kv_cache_gib": self.kv_cache_bytes / GiB,
                     **{k: shape[k] for k in ("family", "n_layers", "hidden_size", "n_heads", "n_kv_heads")}}
        self.out["model"] = point.preset
        self.intervals: list[list[float]] = []  # each generation's (TTFT, step, step, ...): warm-up's first
        self.hf: JSONObject = {}

    def fit(self) -> Result | None:
        """The weights a step reads and the KV cache must fit the device (a lower bound: no activations)."""
        need = self.family.decode_weight_count(self.cfg, 1) * self.dtype.itemsize + self.kv_cache_bytes
        device_bytes = self.ctx.adapter.total_memory_bytes()
        if device_bytes is not None and need > 0.9 * device_bytes:
            return self.result("unsupported", f"does not fit: weights and KV cache need at least {need / GiB:.1f} GiB, "
                                              f"device has {device_bytes / GiB:.1f} GiB", mem_estimate_gib=need / GiB)
        return None

    def total_flops(self) -> float:
        return (self.prefill_flops + self.decode_flops) * (self.point.warmup + self.point.trials)

    def setup(self) -> Window:
        from accel_kit.models import materialize
        from accel_kit.models.generate import Decoder

        p, device, adapter = self.point, self.ctx.device, self.ctx.adapter
        torch.manual_seed(p.seed)
        # built on the device in the point's dtype: no host copy, no fp32 copy (Llama 3.1 8B built on the host in
        # fp32 and moved did not finish in 80 s on an H200's host; built on the GPU, 0.4 s)
        self.model = materialize(self.cfg, device=device, dtype=self.dtype).eval()
        gen = torch.Generator().manual_seed(p.seed)
        vocab = self.family.shape(self.cfg).vocab_size
        self.prompts = torch.randint(0, vocab, (p.batch_size, p.input_len), generator=gen).to(device)
        self.decoder = Decoder(self.model, p.batch_size, self.total_len, p.impl,
                               compile_mode=adapter.decode_compile_mode(),
                               few_rows_linears=adapter.few_rows_linears(self.dtype))

        def generate() -> None:
            if len(self.intervals) == p.warmup:
                self.decoder.freeze()  # the trials begin: a compile now is an error, not a time
            timeline = Timeline.of(adapter)
            self.tokens = self.decoder.generate(self.prompts, p.output_len, timeline=timeline)
            self.intervals.append(timeline.intervals_s())  # the one synchronisation of this generation

        return Window(generate, warmup=p.warmup, trials=p.trials)

    def after_window(self, timing: Timing) -> None:
        self.window_mem = self.ctx.adapter.peak_memory_bytes()  # before the reference allocates anything
        self.base["decode_compiles"] = self.decoder.compiles  # the impl itself is a parameter (record_params)
        self.base["decode_linear_kernel"] = self.decoder.linear_kernel
        if self.point.hf_reference:
            self.hf = hf_reference(self.family, self.model, self.prompts, self.tokens, self.point, self.ctx)

    def metrics(self, timing: Timing, mem_bytes: int | None) -> tuple[dict, float, float]:
        p = self.point
        trials = self.intervals[-p.trials:]
        ttft = [t[0] for t in trials]
        decode_s = [sum(t[1:]) for t in trials]
        steps = [s for t in trials for s in t[1:]]
        ttft_s = statistics.median(ttft)
        prefill_tflops = F.tflops(self.prefill_flops, ttft_s)
        out: JSONObject = {"ttft_s": ttft_s, "prefill_tokens_per_s": p.batch_size * p.input_len / ttft_s,
                           "prefill_tflops_per_device": prefill_tflops, **percentiles(ttft, "ttft")}
        out |= _decode_metrics(p, decode_s, steps, self.decode_bytes, self.device_model)
        tokens = p.batch_size * p.output_len
        out["output_tokens_per_s"] = tokens / timing.median_s
        out["mem_peak_gib"] = self.window_mem / GiB if self.window_mem is not None else None
        energy = timing.energy.energy_j if timing.energy is not None else None
        out["energy_per_output_token_j"] = energy / (tokens * p.trials) if energy else None
        return out | self.hf, prefill_tflops, tokens * p.trials

    def summary(self, metrics: dict) -> str:
        tpot = metrics.get("tpot_p50_s")
        return (f"TTFT {metrics['ttft_s'] * 1e3:.1f} ms, "
                + (f"TPOT p50 {tpot * 1e3:.2f} ms, " if tpot is not None else "")
                + f"{metrics['output_tokens_per_s']:.0f} output tok/s")


def _decode_metrics(p: GeneratePoint, decode_s: list[float], steps: list[float], decode_bytes: int,
                    device_model: str | None) -> dict:
    """Decode tokens/s, TPOT percentiles and MBU both ways; nulls with a reason where one token leaves no decode."""
    if p.output_len < 2:
        reason = "output_len 1: the prefill gives the only token, no decode step ran"
        return {"decode_tokens_per_s": None, "decode_tokens_per_s_trials": None, "tpot_s": None,
                **percentiles([], "tpot"), "decode_gbps": None, "mbu_reason": reason, "mbu_measured_reason": reason}
    rates = [p.batch_size * (p.output_len - 1) / s for s in decode_s]
    median_s = statistics.median(decode_s)
    gbps = decode_bytes / median_s / 1e9
    return {"decode_tokens_per_s": p.batch_size * (p.output_len - 1) / median_s, "decode_tokens_per_s_trials": rates,
            "tpot_s": median_s / (p.output_len - 1), **percentiles(steps, "tpot"), "decode_gbps": gbps,
            **peaks.mbu_metrics(gbps, device_model or "", p.bandwidth)}


# Tokens of the fp32 greedy check: enough for a near-tie to break somewhere if the models differ, few enough
# that an 8B model's fp32 copies (ours and transformers') generate them in seconds.
FP32_CHECK_TOKENS = 16


def hf_greedy(hf, prompt: torch.Tensor, new_tokens: int, *, mask: torch.Tensor | None = None,
              cache_implementation: str | None = "static") -> torch.Tensor:
    """transformers' greedy ``generate`` of exactly ``new_tokens`` after ``prompt`` (B, T), every position attended
    (``mask``: ones, made here unless given), with a static cache unless ``cache_implementation`` says otherwise."""
    return hf.generate(prompt, attention_mask=torch.ones_like(prompt) if mask is None else mask,
                       max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, use_cache=True,
                       cache_implementation=cache_implementation, pad_token_id=0)


def hf_seconds(hf, prompt: torch.Tensor, new_tokens: int, synchronize) -> float:
    """Seconds of one ``hf_greedy`` with the device synchronised on both sides (its mask made before the clock)."""
    mask = torch.ones_like(prompt)
    synchronize()
    start = time.perf_counter()
    hf_greedy(hf, prompt, new_tokens, mask=mask)
    synchronize()
    return time.perf_counter() - start


def hf_reference(family, model, prompts: torch.Tensor, ours: torch.Tensor, p: GeneratePoint, ctx: Context) -> dict:
    """transformers' greedy ``generate`` (static cache) from the same weights, ``trials`` times: its decode
    tokens/s (N tokens' time less 1 token's: the prefill and the first token) and TTFT; then ``token_check``."""
    from accel_kit.models import building_on

    # transformers' model made on the device in our weights' dtype, then our weights copied in (no host copy);
    # its fp32 RoPE frequencies stay fp32, as ours do (``building_on``)
    with building_on(ctx.device, next(model.parameters()).dtype):
        hf = family.to_hf(model).eval()

    def seconds(n: int) -> float:
        return hf_seconds(hf, prompts, n, ctx.adapter.synchronize)

    with torch.inference_mode():
        seconds(p.output_len)  # warm-up (its static cache allocated)
        runs = [(seconds(p.output_len), seconds(1)) for _ in range(p.trials)]
    total = [r[0] for r in runs]
    decode = [t - first for t, first in runs]
    rates = [p.batch_size * (p.output_len - 1) / s for s in decode if s > 0] if p.output_len > 1 else []
    out = {"hf_ttft_s": statistics.median(r[1] for r in runs),
           "hf_output_tokens_per_s": p.batch_size * p.output_len / statistics.median(total),
           "hf_decode_tokens_per_s": statistics.median(rates) if rates else None,
           "hf_decode_tokens_per_s_trials": rates or None}
    return out | token_check(family, model, hf, ours[:1], p.input_len)


@torch.inference_mode()
def token_check(family, model, hf, sequence: torch.Tensor, input_len: int) -> dict:
    """Our model against transformers' (``hf``, the same weights in the same dtype) on one generated ``sequence``
    (1, T + N) whose first ``input_len`` tokens are the prompt:

    - ``tokens_equal_fp32``, ``first_difference``: both models upcast to fp32 generate ``FP32_CHECK_TOKENS``
      greedily from the prompt; equal or not, and the index of the first new token that differs (None if none).
      Where products run in fp32 two correct implementations pick the same argmax except at exact ties.
    - ``top1_agreement``, ``max_logit_diff``: teacher-forced in the run's precision over the positions that
      predict the new tokens (the same prefix for both), the share where our top-1 equals theirs and the
      largest absolute logit difference. In 16 bits another order of the same sums moves logits by a few
      units of the last place and flips near-ties, after which greedy sequences diverge: equality there says
      nothing, agreement close to 1 and a small difference do.
    """
    import copy

    from accel_kit.models import building_on
    from accel_kit.models.generate import greedy_generate

    vocab = family.shape(model.cfg).vocab_size
    positions = slice(input_len - 1, sequence.shape[1] - 1)  # the logits that chose each new token
    ours_logits = model(sequence)[0][:, positions, :vocab].float()
    theirs_logits = hf(input_ids=sequence).logits[:, positions, :vocab].float()
    agreement = (ours_logits.argmax(-1) == theirs_logits.argmax(-1)).float().mean().item()
    max_diff = (ours_logits - theirs_logits).abs().max().item()
    del ours_logits, theirs_logits
    prompt = sequence[:, :input_len]
    n = min(FP32_CHECK_TOKENS, family.context_length(model.cfg) - input_len)
    ours32 = copy.deepcopy(model).float()
    with building_on(prompt.device, torch.float32):  # made on the device, not on the host
        theirs32 = family.to_hf(ours32).eval()
    ours_tokens = greedy_generate(ours32, prompt, n)[0, input_len:]
    theirs_tokens = hf_greedy(theirs32, prompt, n, cache_implementation=None)[0, input_len:]
    del ours32, theirs32
    differ = (ours_tokens != theirs_tokens).nonzero()
    return {"tokens_equal_fp32": bool(differ.numel() == 0),
            "first_difference": int(differ[0, 0]) if differ.numel() else None,
            "top1_agreement": agreement, "max_logit_diff": max_diff}


def unsupported_generate(adapter, point: GeneratePoint) -> str | None:
    """The adapter's answer (``unsupported_generate`` where it has one), then the family's: a KV-cache forward."""
    from accel_kit.models import family_of

    family = family_of(point.preset)
    if not family.supports_kv_cache:
        return (f"the {family.name} family has no static-KV-cache forward (forward_cached); accel-kit generates "
                "with its own families' models only (gpt2, llama, moe)")
    if point.impl == "compiled":
        why = family.unsupported_compiled_decode(point.precision)
        if why is not None:
            return why
    return adapter_check(adapter, point)


def measure_generate(point: GeneratePoint, ctx: Context) -> Result:
    return measurement.run(GenerateMeasurement(point, ctx))


_S = "s"
register_kind(KIND, GeneratePoint, measure_generate, unsupported=unsupported_generate, metrics=(
    Metric("prefill_flops", "FLOP", "forward FLOPs of the prefill (the batch's prompts, the last position's logits)"),
    Metric("decode_flops", "FLOP", "forward FLOPs of every decode step of one generation"),
    Metric("decode_bytes", "B", "bytes every decode step of one generation reads (weights once per step, KV cache)"),
    Metric("kv_cache_gib", "GiB", "the static KV cache, allocated for input plus output positions"),
    Metric("ttft_s", _S, "time to first token: the prefill and the first new token (median over trials)"),
    *(Metric(f"ttft_p{q}_s", _S, f"time to first token, p{q} over the trials") for q in PERCENTILES),
    Metric("prefill_tokens_per_s", "tokens/s", "prompt tokens over the prefill's time"),
    Metric("prefill_tflops_per_device", "TFLOP/s", "the prefill's FLOPs over its time (the MFU's numerator)"),
    Metric("decode_tokens_per_s", "tokens/s", "tokens of the decode steps over their time (median trial)"),
    Metric("decode_tokens_per_s_trials", "tokens/s", "decode tokens/s of each trial (the noise rule's samples)"),
    Metric("tpot_s", _S, "time per output token: the decode steps' time over their count (median trial)"),
    *(Metric(f"tpot_p{q}_s", _S, f"one decode step's time, p{q} over every step of every trial") for q in PERCENTILES),
    Metric("decode_gbps", "GB/s", "bytes the decode steps read over their time (MBU's numerator)"),
    Metric("output_tokens_per_s", "tokens/s", "output tokens over one whole generation's time, prefill included"),
    Metric("energy_per_output_token_j", "J", "the window's energy over the output tokens it generated"),
    Metric("hf_ttft_s", _S, "transformers' generate of one token from the same weights (median)"),
    Metric("hf_output_tokens_per_s", "tokens/s", "transformers' generate: output tokens over its whole time"),
    Metric("hf_decode_tokens_per_s", "tokens/s", "transformers' generate: decode tokens over (N tokens' time - 1's)"),
    Metric("hf_decode_tokens_per_s_trials", "tokens/s", "transformers' decode tokens/s of each trial"),
    Metric("tokens_equal_fp32", "bool", "greedy tokens equal transformers' in fp32 from the same weights "
                                        "(16 new tokens from the first prompt; token_check)"),
    Metric("first_difference", "1", "the first of those new tokens that differs (null: none)"),
    Metric("top1_agreement", "1", "teacher-forced in the run's precision: positions where our top-1 token "
                                         "equals transformers'"),
    Metric("max_logit_diff", "logit", "teacher-forced in the run's precision: the largest |our logit - theirs|"),
    Metric("decode_linear_kernel", "text", "the kernel the eager decode step's linears ran through, timed on the "
                                           "step and chosen by the decoder (models.generate; torch: F.linear)"),
    Metric("decode_compiles", "1", "graphs the compiled decode step compiled (its warm-up; 0 for eager)"),
))
