"""Decode throughput: our static-KV-cache greedy loop against transformers' ``generate`` with a static cache.

Both sides hold the same weights (``Family.to_hf``), in the CPU's native precision (the adapter's
``auto``), and decode greedily from the same prompts; transformers runs ``generate(do_sample=False,
cache_implementation="static")``, eager as ``generate`` leaves it off CUDA. Llama 3.2 1B's shape
(width 2048, 32 heads, 8 KV heads, FFN 8192, vocabulary 128256, tied) with ``--layers`` of its 16
layers, so that a 2-core CPU runs it in minutes: the output projection, read whole every step, is then
a larger share of the bytes than in the full model. Each side first generates 2 tokens untimed at each
batch's shapes; then the sides alternate ``--repeats`` times, so that other load on the machine hits both.

Each side is timed the same way, by the time each new token is ready: ours by ``greedy_generate``'s
``on_step``, transformers' by a forward hook on its model (one forward per token). Printed per batch:
TTFT (the prefill and the first token, best run), TPOT (the median time between consecutive tokens,
over every run's steps: robust to a busy moment), decode tokens/s (batch / TPOT) and the ratio; each
side's MBU of the decode against the measured bandwidth (``peaks.measure_memory_bandwidth``), the bytes
of a step from ``Family.decode_step_bytes`` (weights once, the KV cache at its length) averaged over the
steps. Target: ours >= 1.0x decode tokens/s.

    python benchmarks/decode_vs_hf.py [--layers 2] [--batch 1 8] [--input 128] [--output 128] [--repeats 2]
"""
from __future__ import annotations

import dataclasses
import statistics
import time

import torch

from accel_kit import peaks
from accel_kit.cli import OneLineParser, at_least, script_main
from accel_kit.devices import dtype_of, get_adapter
from accel_kit.models import family_of, get_config
from accel_kit.models.generate import greedy_generate


def hf_generate(hf, prompt: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """transformers' greedy generate with a static cache, exactly ``new_tokens`` new tokens."""
    return hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new_tokens,
                       min_new_tokens=new_tokens, do_sample=False, use_cache=True, cache_implementation="static",
                       pad_token_id=0)


def hf_run(hf, prompt: torch.Tensor, new_tokens: int, stamp) -> torch.Tensor:
    """``hf_generate`` with ``stamp()`` called as each forward (the prefill, then one per token) returns."""
    handle = hf.register_forward_hook(lambda *_: stamp())
    try:
        return hf_generate(hf, prompt, new_tokens)
    finally:
        handle.remove()


def token_times(run) -> tuple[torch.Tensor, float, list[float]]:
    """(tokens, prefill seconds, seconds between consecutive new tokens) of ``run(stamp)``, which calls
    ``stamp()`` as each new token is ready. The CPU's clock: there is no device queue to drain."""
    stamps: list[float] = []
    start = time.perf_counter()
    tokens = run(lambda *_: stamps.append(time.perf_counter()))
    return tokens, stamps[0] - start, [b - a for a, b in zip(stamps, stamps[1:])]


def mean_step_bytes(family, cfg, batch: int, prompt_len: int, new_tokens: int, elem_bytes: int) -> float:
    """Bytes a decode step reads, averaged over the steps after the prefill (step i attends over
    prompt_len + i + 1 positions)."""
    return statistics.fmean(family.decode_step_bytes(cfg, batch, prompt_len + i + 1, weight_bytes=elem_bytes,
                                                     kv_bytes=elem_bytes) for i in range(new_tokens - 1))


def run_batch(family, cfg, model, hf, args, batch: int, elem_bytes: int, bandwidth: float) -> None:
    prompt = torch.randint(0, cfg.vocab_size, (batch, args.input), generator=torch.Generator().manual_seed(batch))
    sides = {"ours": lambda stamp: greedy_generate(model, prompt, args.output, on_step=stamp),
             "transformers": lambda stamp: hf_run(hf, prompt, args.output, stamp)}
    prefill: dict[str, list[float]] = {name: [] for name in sides}
    steps: dict[str, list[float]] = {name: [] for name in sides}
    outputs = {}
    with torch.inference_mode():  # warm-up at this batch's shapes (allocator growth, kernels' first calls), untimed
        greedy_generate(model, prompt, 2)
        hf_generate(hf, prompt, 2)
    for _ in range(args.repeats):  # alternating, so that load on the machine hits both
        for name, run in sides.items():
            outputs[name], first, gaps = token_times(run)
            prefill[name].append(first)
            steps[name] += gaps
    step_gb = mean_step_bytes(family, cfg, batch, args.input, args.output, elem_bytes) / 1e9
    print(f"batch {batch}, input {args.input}, output {args.output}, {args.repeats} runs each "
          f"(greedy tokens equal: {torch.equal(outputs['ours'], outputs['transformers'])})")
    tpot = {name: statistics.median(times) for name, times in steps.items()}
    for name in sides:
        gbps = step_gb / tpot[name]
        print(f"  {name:<13} TTFT {min(prefill[name]):6.2f} s, TPOT {1e3 * tpot[name]:7.1f} ms (median), "
              f"{batch / tpot[name]:7.1f} decode tokens/s, {gbps:5.1f} GB/s = MBU {100 * gbps / bandwidth:5.1f} % "
              "of measured")
    print(f"  ratio ours/transformers: {tpot['transformers'] / tpot['ours']:.2f}x decode tokens/s, "
          f"{min(prefill['transformers']) / min(prefill['ours']):.2f}x prefill")


def main() -> int:
    p = OneLineParser(prog="decode_vs_hf.py", description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="llama3.2-1b")
    p.add_argument("--layers", type=at_least(1), default=2, help="layers of the preset kept (CPU: fewer than 16)")
    p.add_argument("--batch", type=at_least(1), nargs="+", default=[1, 8])
    p.add_argument("--input", type=at_least(1), default=128)
    p.add_argument("--output", type=at_least(2), default=128)
    p.add_argument("--repeats", type=at_least(1), default=2)
    p.add_argument("--precision", default="auto")
    args = p.parse_args()
    adapter = get_adapter("cpu")
    choice = adapter.resolve_precision(args.precision)
    dtype = dtype_of(choice.precision)
    family = family_of(args.preset)
    cfg = dataclasses.replace(get_config(args.preset, seq_len=args.input + args.output), n_layers=args.layers)
    torch.manual_seed(0)
    model = family.build(cfg).eval()
    hf = family.to_hf(model).eval()
    model, hf = model.to(dtype), hf.to(dtype)
    bandwidth = peaks.measure_memory_bandwidth(adapter)
    print(f"{args.preset} with {args.layers} of its layers, {choice.precision} ({choice.reason or 'as asked'}), "
          f"{torch.get_num_threads()} threads; measured bandwidth {bandwidth.gbps:.1f} GB/s ({bandwidth.best_kernel})")
    print(f"  weights a decode step reads: {family.decode_weight_count(cfg, 1) / 1e6:.0f} M")
    for batch in args.batch:
        run_batch(family, cfg, model, hf, args, batch, dtype.itemsize, bandwidth.gbps)
    return 0


if __name__ == "__main__":
    script_main(main, "decode_vs_hf.py")
