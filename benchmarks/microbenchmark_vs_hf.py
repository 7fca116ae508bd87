"""Our GPT-2 XL block against transformers' GPT2Block (SDPA), and against the matmul peak.

Everything is measured side by side in one process through the microbenchmark study's own
harness: the square-GEMM peak per precision, then both blocks at GPT-2 XL dims, sequence
1024, batch 4, forward+backward, in bf16 and fp32. Prints achieved TFLOP/s and the ratios
ours/HF and ours/peak.

    python benchmarks/microbenchmark_vs_hf.py [--system cpu] [--batch 4] [--trials 5]

Targets on a 2-core AMX CPU: bf16 ours/HF >= 1.3 and ours/peak >= 0.60; fp32 ours/peak >= 0.90.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

from accel_kit import studies
from accel_kit.cli import OneLineParser, at_least, script_main


def main() -> None:
    ap = OneLineParser(description=__doc__.splitlines()[0])
    ap.add_argument("--system", default="cpu")
    ap.add_argument("--batch", type=at_least(1), default=4)
    ap.add_argument("--seq-len", type=at_least(1), default=1024)
    ap.add_argument("--trials", type=at_least(1), default=5)
    ap.add_argument("--warmup", type=at_least(0), default=2)
    ap.add_argument("--precisions", default="bf16,fp32")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as out:
        run = studies.run_study(
            "microbenchmark", args.system, None, output_dir=out, batch_sizes=[args.batch], seq_len=args.seq_len,
            precisions=args.precisions.split(","), directions=["forward_backward"], impls=["native", "hf"],
            warmup=args.warmup, trials=args.trials, measure_peak=True)
        df = run.df()
    bad = df[df.status != "ok"]
    if not bad.empty:
        raise SystemExit(f"failed points:\n{bad[['impl', 'precision', 'status', 'reason']]}")

    print(f"\nGPT-2 XL block, batch {args.batch}, seq {args.seq_len}, forward+backward on {args.system} "
          f"({df['env.device.model'].iloc[0]})")
    print(f"{'precision':9s} {'peak TF/s':>9s} {'ours TF/s':>9s} {'HF TF/s':>9s} {'ours/HF':>8s} {'ours/peak':>9s} "
          f"{'ours cv':>7s} {'HF cv':>6s}")
    for precision, g in df.groupby("precision", sort=False):
        ours, hf = (g[g.impl == impl].iloc[0] for impl in ("native", "hf"))
        peak = ours["peak_tflops_measured"]
        print(f"{precision:9s} {peak:9.3f} {ours.tflops:9.3f} {hf.tflops:9.3f} {ours.tflops / hf.tflops:8.2f} "
              f"{ours.tflops / peak:9.2f} {ours.time_cv:7.3f} {hf.time_cv:6.3f}")


if __name__ == "__main__":
    script_main(main, Path(__file__).name)  # an unknown system or precision: one line, status 2
