"""Decode throughput: our static-KV-cache greedy loop against transformers' ``generate`` with a static cache.

Both sides hold the same weights (``Family.to_hf``), in the CPU's native precision (the adapter's
``auto``), and decode greedily from the same prompts; transformers runs ``generate(do_sample=False,
cache_implementation="static")``, eager as ``generate`` leaves it off CUDA. Llama 3.2 1B's shape
(width 2048, 32 heads, 8 KV heads, FFN 8192, vocabulary 128256, tied) with ``--layers`` of its 16
layers, so that a 2-core CPU runs it in minutes: the output projection, read whole every step, is then
a larger share of the bytes than in the full model. The sides alternate ``--repeats`` times; the best
of each is kept.

Printed per batch: tokens/s end to end (prefill included) and of the decode alone, each side's and
their ratio; each side's MBU of the decode against the measured bandwidth (``peaks.
measure_memory_bandwidth``), bytes per step from ``Family.decode_step_bytes`` (weights once, the KV
cache at its length). transformers' decode time is its generate of N tokens less its generate of 1
(the prefill and the first token). Target: ours >= 1.0x.

    python benchmarks/decode_vs_hf.py [--layers 2] [--batch 1 8] [--input 128] [--output 128] [--repeats 2]
"""
from __future__ import annotations

import argparse
import dataclasses
import time

import torch

from accel_kit import peaks
from accel_kit.cli import OneLineParser, at_least, script_main
from accel_kit.devices import dtype_of, get_adapter
from accel_kit.models import family_of, get_config
from accel_kit.models.generate import timed_greedy_generate


def hf_seconds(hf, prompt: torch.Tensor, new_tokens: int) -> tuple[float, torch.Tensor]:
    """Seconds of transformers' greedy generate with a static cache (the CPU: the clock after it returns)."""
    start = time.perf_counter()
    out = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                      do_sample=False, use_cache=True, cache_implementation="static", pad_token_id=0)
    return time.perf_counter() - start, out


def decode_bytes(family, cfg, batch: int, prompt_len: int, new_tokens: int, elem_bytes: int) -> int:
    """Bytes read by the decode steps after the prefill: step i attends over prompt_len + i + 1 positions."""
    return sum(family.decode_step_bytes(cfg, batch, prompt_len + i + 1, weight_bytes=elem_bytes, kv_bytes=elem_bytes)
               for i in range(new_tokens - 1))


def run_batch(family, cfg, model, hf, args, batch: int, elem_bytes: int, bandwidth: float) -> None:
    gen = torch.Generator().manual_seed(batch)
    prompt = torch.randint(0, cfg.vocab_size, (batch, args.input), generator=gen)
    sync = get_adapter("cpu").synchronize
    ours_total = ours_decode = hf_total = hf_decode = float("inf")
    same = True
    for _ in range(args.repeats):
        start = time.perf_counter()
        tokens, times = timed_greedy_generate(model, prompt, args.output, sync)
        ours_total = min(ours_total, time.perf_counter() - start)
        ours_decode = min(ours_decode, sum(times.decode_step_s))
        total, theirs = hf_seconds(hf, prompt, args.output)
        first, _ = hf_seconds(hf, prompt, 1)
        hf_total, hf_decode = min(hf_total, total), min(hf_decode, total - first)
        same = same and torch.equal(tokens, theirs)
    steps = batch * (args.output - 1)
    moved_gb = decode_bytes(family, cfg, batch, args.input, args.output, elem_bytes) / 1e9
    rows = [("ours", ours_total, ours_decode), ("transformers", hf_total, hf_decode)]
    print(f"batch {batch}, input {args.input}, output {args.output} (greedy tokens equal: {same})")
    for name, total, decode in rows:
        gbps = moved_gb / decode
        print(f"  {name:<13} {batch * args.output / total:8.1f} tokens/s end to end, {steps / decode:8.1f} decode "
              f"tokens/s, decode {gbps:6.1f} GB/s = MBU {100 * gbps / bandwidth:5.1f} % of measured")
    print(f"  ratio ours/transformers: {hf_total / ours_total:.2f}x end to end, {hf_decode / ours_decode:.2f}x decode")


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
    with torch.inference_mode():
        timed_greedy_generate(model, torch.zeros(1, 8, dtype=torch.long), 4, adapter.synchronize)  # warm-up
        hf_seconds(hf, torch.zeros(1, 8, dtype=torch.long), 4)
    for batch in args.batch:
        run_batch(family, cfg, model, hf, args, batch, dtype.itemsize, bandwidth.gbps)
    return 0


if __name__ == "__main__":
    script_main(main, "decode_vs_hf.py")
