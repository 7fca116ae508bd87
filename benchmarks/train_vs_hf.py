"""Training throughput: our step against a plain transformers loop, and the sweep runner's overhead.

1. Our ``Trainer.step`` (the preset's model from accel_kit.models, any family: SDPA, fused
   AdamW; in bf16 the model is bf16 with fp32 master weights, see accel_kit.engine.step)
   against a plain loop over transformers' model of the family (``GPT2LMHeadModel``,
   ``LlamaForCausalLM``) + ``torch.optim.AdamW`` under autocast, with the same preset, weights,
   sequence, batch, clipping and batches; the two alternate in one process so drifting clocks
   hit both. Target: ours >= 1.2x.
2. The sweep runner's overhead: the median step time the runner records for a point (its
   worker subprocess, ``run_worker``) against a bare loop of the same step in a fresh
   subprocess of its own. Both sides are measured the same way, each in a new process that
   holds only its own model (timing the bare loop in this process, after part 1, would let
   part 1's models, allocator state and thread pool skew it), alternating bare / runner
   ``--pairs`` times so that drift and other load on the machine hit both; medians and their
   ratio are printed. Target: overhead <= 3 %.

    python benchmarks/train_vs_hf.py [--preset gpt2-small] [--seq-len 256] [--batch 4] [--precision bf16]
                                     [--part both|hf|runner] [--pairs 4]
    python benchmarks/train_vs_hf.py --preset llama3-small --part hf
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from accel_kit.cli import OneLineParser, at_least, script_main
from accel_kit.data import SyntheticBatches
from accel_kit.devices import PRECISIONS, dtype_of, get_adapter
from accel_kit.models import PRESETS, build_model, family_of, get_config
from accel_kit.engine import OptimConfig, Trainer
from accel_kit.engine.step import cast_for_precision, optim_for_point
from accel_kit.engine.point import TrainPoint
from accel_kit.engine.sweep import run_worker


def hf_stepper(model, batches, precision: str, optim: OptimConfig):
    """A plain training loop over transformers' model: what a user would write."""
    opt = torch.optim.AdamW(model.parameters(), lr=optim.lr, betas=(optim.beta1, optim.beta2),
                            weight_decay=optim.weight_decay)
    autocast = (torch.autocast("cpu", dtype=dtype_of(precision)) if precision != "fp32"
                else contextlib.nullcontext())

    def step() -> float:
        x, y = next(batches)
        with autocast:
            logits = model(input_ids=x).logits.float()
        loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), optim.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()
    return step


def timed(step, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        step()  # .item() inside synchronises
        out.append(time.perf_counter() - t)
    return out


def kernel_overrides(preset: str, precision: str, adapter) -> dict:
    """The kernel choices the worker takes from the adapter for the preset's family (GPT-2's bf16 output
    projections), so that every side runs the kernels a study point runs."""
    return family_of(preset).kernel_overrides(adapter, dtype_of(precision))


def bare_child(point_json: str) -> None:
    """Run in a fresh process: the point's steps in a bare loop; print the timed step times as JSON.

    Built as the worker builds a synthetic-data point (same seed, model, cast, batches, schedule,
    warm-up and step counts), without its probes, estimates, records or sparsity wrapper.
    """
    point = TrainPoint.model_validate_json(point_json)
    adapter = get_adapter("cpu")
    device = adapter.torch_device()
    torch.manual_seed(point.seed)
    # The kernel choices the worker takes from the adapter, so both sides run the same kernels.
    overrides = dict(seq_len=point.seq_len, pad_vocab_multiple=point.pad_vocab_multiple,
                     **kernel_overrides(point.preset, point.precision, adapter))
    model = cast_for_precision(build_model(point.preset, **overrides), point.precision)
    cfg = get_config(point.preset, **overrides)
    batches = SyntheticBatches(family_of(cfg).shape(cfg).vocab_size, point.seq_len, point.micro_batch_size,
                               seed=point.seed)
    trainer = Trainer(model, iter(batches), device, point.precision, point.gas, optim_for_point(point),
                      fused_optimizer=adapter.fused_optimizer())
    timed(trainer.step, point.warmup_steps)
    print(json.dumps({"times_s": timed(trainer.step, point.steps)}))


def bare_step_time(point: TrainPoint, timeout_s: float) -> float:
    """Median step time of the bare loop, run in a fresh subprocess (see ``bare_child``)."""
    proc = subprocess.run([sys.executable, __file__, "--bare-child", point.model_dump_json()],
                          capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        raise SystemExit(f"bare loop failed (status {proc.returncode}): {proc.stderr.strip()[-500:]}")
    return statistics.median(json.loads(proc.stdout.strip().splitlines()[-1])["times_s"])


def runner_step_time(point: TrainPoint, timeout_s: float) -> float:
    """Median step time the sweep runner records for the point (its worker subprocess)."""
    result = run_worker(point, timeout_s=timeout_s)
    if result["status"] != "ok":
        raise SystemExit(f"sweep point failed: {result.get('reason')}")
    return result["metrics"]["step_time_s"]


def compare_hf(args: argparse.Namespace) -> None:
    """Part 1: ours against transformers, alternating in this process."""
    torch.manual_seed(0)
    optim = OptimConfig(warmup_steps=1)
    device = torch.device("cpu")
    tokens = args.batch * args.seq_len

    adapter = get_adapter("cpu")
    overrides = dict(seq_len=args.seq_len, **kernel_overrides(args.preset, args.precision, adapter))
    cfg = get_config(args.preset, **overrides)
    family = family_of(cfg)
    ours_model = build_model(args.preset, **overrides)
    hf_model = family.to_hf(ours_model)  # identical weights (copied before ours is cast)
    hf_model.train()
    vocab = family.shape(cfg).vocab_size
    ours = Trainer(cast_for_precision(ours_model, args.precision), iter(SyntheticBatches(vocab, args.seq_len, args.batch, seed=1)), device,
                   args.precision, 1, optim, fused_optimizer=adapter.fused_optimizer())
    hf = hf_stepper(hf_model, iter(SyntheticBatches(vocab, args.seq_len, args.batch, seed=1)), args.precision, optim)
    timed(ours.step, 2), timed(hf, 2)  # warm-up
    t_ours, t_hf = [], []
    for _ in range(args.rounds):
        t_ours += timed(ours.step, args.steps)
        t_hf += timed(hf, args.steps)
    ours_tps, hf_tps = tokens / statistics.median(t_ours), tokens / statistics.median(t_hf)
    print(f"ours against transformers: median of {len(t_ours)} steps each, alternating in one process")
    print(f"  accel-kit Trainer             {ours_tps:9.0f} tokens/s")
    print(f"  transformers {family.hf_model_class:16s} {hf_tps:9.0f} tokens/s")
    print(f"  ours / HF                     {ours_tps / hf_tps:9.2f}x  (target >= 1.2)")


def runner_point(args: argparse.Namespace) -> TrainPoint:
    """Part 2's point; its fields checked as the studies check theirs (one line naming the field)."""
    from pydantic import ValidationError

    from accel_kit.errors import ParameterError
    from accel_kit.params import one_line

    values = dict(system="cpu", preset=args.preset, precision=args.precision, micro_batch_size=args.batch,
                  seq_len=args.seq_len, steps=args.steps * args.rounds, warmup_steps=2)
    try:
        return TrainPoint(**values)
    except ValidationError as exc:
        raise ParameterError(one_line(exc, values, fields=TrainPoint.model_fields)) from None


def compare_runner(args: argparse.Namespace) -> None:
    """Part 2: the sweep runner's worker against a bare loop, each in fresh processes, alternating."""
    point = runner_point(args)
    bare, runner = [], []
    print(f"sweep runner against a bare loop: {args.pairs} pairs of fresh processes, "
          f"median of {point.steps} steps each (after {point.warmup_steps} warm-up)")
    for pair in range(args.pairs):
        bare.append(bare_step_time(point, args.timeout_s))
        runner.append(runner_step_time(point, args.timeout_s))
        print(f"  pair {pair + 1}: bare {bare[-1]:.4f} s, runner {runner[-1]:.4f} s", flush=True)
    b, r = statistics.median(bare), statistics.median(runner)
    print(f"  bare loop, median step        {b:9.4f} s  (range {min(bare):.4f}-{max(bare):.4f})")
    print(f"  sweep runner, median step     {r:9.4f} s  (range {min(runner):.4f}-{max(runner):.4f})")
    print(f"  runner / bare                 {r / b:9.3f}   overhead {100 * (r / b - 1):+.1f} %  (target <= 3 %)")


def main() -> None:
    ap = OneLineParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="gpt2-small", choices=PRESETS, metavar="PRESET",
                    help="model preset (accel_kit.models.PRESETS; default gpt2-small)")
    ap.add_argument("--seq-len", type=at_least(1), default=256)
    ap.add_argument("--batch", type=at_least(1), default=4)
    ap.add_argument("--precision", default="bf16", choices=PRECISIONS)
    ap.add_argument("--steps", type=at_least(1), default=4,
                    help="timed steps per round (part 2: steps x rounds per run)")
    ap.add_argument("--rounds", type=at_least(1), default=3)
    ap.add_argument("--part", choices=["both", "hf", "runner"], default="both")
    ap.add_argument("--pairs", type=at_least(1), default=4, help="part 2: bare / runner process pairs")
    ap.add_argument("--timeout-s", type=at_least(0, float, above=True), default=1800,
                    help="part 2: limit per process")
    ap.add_argument("--bare-child", metavar="POINT_JSON", help=argparse.SUPPRESS)  # part 2's bare side
    args = ap.parse_args()
    if args.bare_child:
        bare_child(args.bare_child)
        return
    runner_point(args)  # a bad value of part 2 fails now, not after part 1 has run
    print(f"{args.preset}, seq {args.seq_len}, batch {args.batch}, {args.precision}, CPU "
          f"{torch.backends.cpu.get_cpu_capability()} ({torch.get_num_threads()} threads)")
    if args.part in ("both", "hf"):
        compare_hf(args)
        gc.collect()  # part 1's models are gone before part 2's processes start
    if args.part in ("both", "runner"):
        compare_runner(args)


if __name__ == "__main__":
    script_main(main, Path(__file__).name)
