"""Training throughput: our step against a plain transformers loop, and the sweep runner's overhead.

1. Our ``Trainer.step`` (GPT from accel_kit.models, SDPA, fused AdamW; in bf16 the model is
   bf16 with fp32 master weights, see accel_kit.train.step) against a plain loop over
   transformers' ``GPT2LMHeadModel`` + ``torch.optim.AdamW`` under autocast, with the same
   preset, sequence, batch, clipping and batches; the two alternate in one process so
   drifting clocks hit both. Target: ours >= 1.2x.
2. The sweep runner's recorded median step time (worker subprocess) against a bare
   in-process loop of the same step. Target: overhead <= 3 %.

    python benchmarks/train_vs_hf.py [--preset gpt2-small] [--seq-len 256] [--batch 4] [--precision bf16]
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import torch

from accel_kit.data import SyntheticBatches
from accel_kit.devices import dtype_of
from accel_kit.models import build_model
from accel_kit.models.hf import to_hf
from accel_kit.train import OptimConfig, Trainer
from accel_kit.train.step import cast_for_precision
from accel_kit.train.point import TrainPoint
from accel_kit.train.sweep import run_worker


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="gpt2-small")
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--precision", default="bf16")
    ap.add_argument("--steps", type=int, default=4, help="timed steps per round")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    torch.manual_seed(0)
    optim = OptimConfig(warmup_steps=1)
    device = torch.device("cpu")
    tokens = args.batch * args.seq_len

    ours_model = build_model(args.preset, seq_len=args.seq_len)
    hf_model = to_hf(ours_model)  # identical weights (copied before ours is cast)
    hf_model.train()
    vocab = ours_model.cfg.vocab_size
    ours = Trainer(cast_for_precision(ours_model, args.precision), iter(SyntheticBatches(vocab, args.seq_len, args.batch, seed=1)), device,
                   args.precision, 1, optim)
    hf = hf_stepper(hf_model, iter(SyntheticBatches(vocab, args.seq_len, args.batch, seed=1)), args.precision, optim)
    timed(ours.step, 2), timed(hf, 2)  # warm-up
    t_ours, t_hf = [], []
    for _ in range(args.rounds):
        t_ours += timed(ours.step, args.steps)
        t_hf += timed(hf, args.steps)
    ours_tps, hf_tps = tokens / statistics.median(t_ours), tokens / statistics.median(t_hf)
    print(f"{args.preset}, seq {args.seq_len}, batch {args.batch}, {args.precision}, CPU "
          f"({torch.get_num_threads()} threads), median of {len(t_ours)} steps each, alternating")
    print(f"  accel-kit Trainer             {ours_tps:9.0f} tokens/s")
    print(f"  transformers GPT2LMHeadModel  {hf_tps:9.0f} tokens/s")
    print(f"  ours / HF                     {ours_tps / hf_tps:9.2f}x  (target >= 1.2)")

    # Sweep runner overhead: the same point in a worker subprocess vs the in-process loop above.
    point = TrainPoint(system="cpu", preset=args.preset, precision=args.precision, micro_batch_size=args.batch,
                       seq_len=args.seq_len, steps=args.steps * args.rounds, warmup_steps=2)
    result = run_worker(point, timeout_s=1800)
    if result["status"] != "ok":
        raise SystemExit(f"sweep point failed: {result.get('reason')}")
    bare = statistics.median(t_ours)
    runner = result["metrics"]["step_time_s"]
    print(f"  bare in-process step          {bare:9.4f} s")
    print(f"  sweep runner recorded step    {runner:9.4f} s")
    print(f"  runner overhead               {100 * (runner / bare - 1):9.1f} %  (target <= 3 %)")


if __name__ == "__main__":
    main()
