"""Decode throughput: our static-KV-cache greedy loop (eager and compiled) against transformers' ``generate``.

Both sides hold the same weights (``Family.to_hf``), built on the system's device in its native precision (the
adapter's ``auto``, or ``--precision``), and decode greedily from the same prompts; transformers runs
``generate(do_sample=False, cache_implementation="static")`` as it leaves it by default (on CUDA it compiles
its static-cache decode step itself). On a CPU, Llama 3.2 1B's shape with ``--layers`` of its 16 layers, so that
2 cores run it in minutes (the output projection, read whole every step, is then a larger share of the bytes
than in the full model); on a GPU the whole preset (``--layers 0``), e.g. Llama 3.1 8B.

Per batch, each side first generates untimed once at the batch's shapes (our compiled step compiles and, on
CUDA, is captured there; transformers compiles its own): the seconds are printed as the side's warm-up. Then
the sides alternate ``--repeats`` times, so that other load on the machine hits each. Each side is timed the
same way, as the inference study's points are: the decode time of one generation is N tokens' time less the
first token's (ours read from the decode loop's ``Timeline``: device events, one synchronisation per
generation; transformers' as ``generate(N)`` less ``generate(1)``, synchronised), the median over repeats.
Printed per batch: TTFT, TPOT, decode tokens/s, GB/s and MBU against the bandwidth measured in the same run
(``peaks.measure_memory_bandwidth``; the bytes of a step from ``Family.decode_step_bytes``: weights once, the
KV cache at its length), the ratio to transformers, and at the first batch the token check of the inference
study (``generate_measure.token_check``: fp32 greedy tokens equal; top-1 agreement and largest logit
difference in the run's precision).

Targets. CPU: the better of ours >= 1.2x transformers' decode tokens/s at batch 1 and 8, tokens equal in fp32.
H200, Llama 3.1 8B bf16, input 512, output 128: batch 1 MBU >= 60 % of the measured bandwidth and >= 1.5x
transformers'; batch 32 >= 1.0x; the model built in under 30 s.

    python benchmarks/decode_vs_hf.py [--layers 2] [--batch 1 8] [--input 128] [--output 128] [--repeats 3]
    python benchmarks/decode_vs_hf.py --system h200 --preset llama3.1-8b --layers 0 --batch 1 32 --input 512
"""
from __future__ import annotations

import dataclasses
import statistics
import time

import torch

from accel_kit import peaks
from accel_kit.cli import OneLineParser, at_least, script_main
from accel_kit.devices import dtype_of
from accel_kit.engine.generate_measure import hf_greedy, hf_seconds, token_check
from accel_kit.models import building_on, family_of, get_config, materialize
from accel_kit.models.generate import IMPLS, Decoder
from accel_kit.systems import load_system
from accel_kit.timing import Timeline


def mean_step_bytes(family, cfg, batch: int, prompt_len: int, new_tokens: int, elem_bytes: int) -> float:
    """Bytes a decode step reads, averaged over the steps after the prefill (step i attends over
    prompt_len + i + 1 positions)."""
    return statistics.fmean(family.decode_step_bytes(cfg, batch, prompt_len + i + 1, weight_bytes=elem_bytes,
                                                     kv_bytes=elem_bytes) for i in range(new_tokens - 1))


class Side:
    """One side's runs at one batch: (TTFT, decode seconds) of each timed generation."""

    def __init__(self, name: str, run, warm):
        self.name, self.run, self.warm = name, run, warm
        self.ttft_s: list[float] = []
        self.decode_s: list[float] = []
        self.warmup_s = 0.0


def ours(decoder: Decoder, prompt: torch.Tensor, new_tokens: int, adapter) -> Side:
    def run() -> tuple[float, float]:
        timeline = Timeline.of(adapter)
        decoder.generate(prompt, new_tokens, timeline=timeline)
        intervals = timeline.intervals_s()
        return intervals[0], sum(intervals[1:])

    def warm() -> None:
        decoder.generate(prompt, new_tokens)
        decoder.freeze()  # a compile in the timed runs is an error, not a time

    return Side(f"ours {decoder.impl}", run, warm)


def transformers_side(hf, prompt: torch.Tensor, new_tokens: int, adapter) -> Side:
    def run() -> tuple[float, float]:  # as the study's reference times it (generate_measure.hf_reference)
        first = hf_seconds(hf, prompt, 1, adapter.synchronize)
        return first, hf_seconds(hf, prompt, new_tokens, adapter.synchronize) - first

    return Side("transformers", run, lambda: hf_greedy(hf, prompt, new_tokens))


def run_batch(family, cfg, model, hf, args, batch: int, device, adapter, elem_bytes: int, bandwidth: float,
              check: bool) -> None:
    prompt = torch.randint(0, cfg.vocab_size, (batch, args.input), generator=torch.Generator().manual_seed(batch))
    prompt = prompt.to(device)
    kernels = adapter.few_rows_linears(next(model.parameters()).dtype)  # the adapter's candidates, timed per shape
    decoders = [Decoder(model, batch, args.input + args.output, impl, compile_mode=adapter.decode_compile_mode(),
                        few_rows_linears=kernels) for impl in args.impls]
    sides = [ours(decoder, prompt, args.output, adapter) for decoder in decoders]
    sides.append(transformers_side(hf, prompt, args.output, adapter))
    with torch.inference_mode():
        for side in sides:  # compile, capture, allocator growth, first calls: untimed, reported
            start = time.perf_counter()
            side.warm()
            adapter.synchronize()
            side.warmup_s = time.perf_counter() - start
        for _ in range(args.repeats):  # alternating, so that load on the machine hits each side
            for side in sides:
                ttft, decode = side.run()
                side.ttft_s.append(ttft)
                side.decode_s.append(decode)
    step_gb = mean_step_bytes(family, cfg, batch, args.input, args.output, elem_bytes) / 1e9
    steps = args.output - 1
    print(f"batch {batch}, input {args.input}, output {args.output}, {args.repeats} runs each "
          f"(each step reads {step_gb:.2f} GB on average)")
    rate = {side.name: batch * steps / statistics.median(side.decode_s) for side in sides}
    for side in sides:
        tpot = statistics.median(side.decode_s) / steps
        gbps = step_gb / tpot
        print(f"  {side.name:<15} warm-up {side.warmup_s:6.1f} s, TTFT {1e3 * statistics.median(side.ttft_s):8.1f} ms, "
              f"TPOT {1e3 * tpot:8.2f} ms, {rate[side.name]:9.1f} decode tokens/s, {gbps:7.1f} GB/s = MBU "
              f"{100 * gbps / bandwidth:5.1f} % of measured")
    for decoder in decoders:
        if decoder.impl == "eager":
            print(f"  ours eager's linears ran through: {decoder.linear_kernel} (timed on its step and chosen)")
    best = max((s for s in sides if s.name != "transformers"), key=lambda s: rate[s.name])
    print(f"  ratio, decode tokens/s: " + ", ".join(f"{s.name} {rate[s.name] / rate['transformers']:.2f}x"
                                                    for s in sides if s.name != "transformers")
          + f" transformers'; best ({best.name}) {rate[best.name] / rate['transformers']:.2f}x")
    if check:
        with torch.inference_mode():
            tokens = Decoder(model, 1, args.input + args.output).generate(prompt[:1], args.output)  # one row's
            said = token_check(family, model, hf, tokens, args.input)
        print(f"  token check: fp32 greedy tokens equal: {said['tokens_equal_fp32']} (first difference "
              f"{said['first_difference']}); {args.precision_used} top-1 agreement "
              f"{100 * said['top1_agreement']:.1f} %, largest logit difference {said['max_logit_diff']:.3g}")


def main() -> int:
    p = OneLineParser(prog="decode_vs_hf.py", description=__doc__.split("\n")[0])
    p.add_argument("--system", default="cpu", help="a system id (params/systems/): its device runs both sides")
    p.add_argument("--preset", default="llama3.2-1b")
    p.add_argument("--layers", type=at_least(0), default=2, help="layers of the preset kept (0: all of them)")
    p.add_argument("--batch", type=at_least(1), nargs="+", default=[1, 8])
    p.add_argument("--input", type=at_least(1), default=128)
    p.add_argument("--output", type=at_least(2), default=128)
    p.add_argument("--repeats", type=at_least(1), default=3)
    p.add_argument("--precision", default="auto")
    p.add_argument("--impls", nargs="+", choices=IMPLS, default=list(IMPLS))
    args = p.parse_args()
    adapter = load_system(args.system).adapter_instance()
    device = adapter.prepare(0)
    choice = adapter.resolve_precision(args.precision)
    args.precision_used = choice.precision
    dtype = dtype_of(choice.precision)
    family = family_of(args.preset)
    cfg = get_config(args.preset, seq_len=args.input + args.output)
    if args.layers:
        cfg = dataclasses.replace(cfg, n_layers=args.layers)
    torch.manual_seed(0)
    start = time.perf_counter()
    model = materialize(cfg, device=device, dtype=dtype).eval()
    adapter.synchronize()
    build_s = time.perf_counter() - start
    with building_on(device, dtype):
        hf = family.to_hf(model).eval()
    bandwidth = peaks.measure_memory_bandwidth(adapter)
    print(f"{args.preset} with {cfg.n_layers} layers on {args.system} ({adapter.describe().device_model}), "
          f"{choice.precision} ({choice.reason or 'as asked'}), {torch.get_num_threads()} host threads; built on "
          f"the device in {build_s:.1f} s; measured bandwidth {bandwidth.gbps:.1f} GB/s ({bandwidth.best_kernel})")
    print(f"  weights a decode step reads: {family.decode_weight_count(cfg, 1) / 1e9:.2f} G")
    for i, batch in enumerate(args.batch):
        run_batch(family, cfg, model, hf, args, batch, device, adapter, dtype.itemsize, bandwidth.gbps, check=i == 0)
    return 0


if __name__ == "__main__":
    script_main(main, "decode_vs_hf.py")
