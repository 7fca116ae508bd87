"""Expert-parallel training on two gloo processes against one process: tokens/s per device and the all-to-all's
share of the step, side by side.

One MoE training point (default ``moe-debug``, sequence 128, micro-batch 4, synthetic tokens) runs as one
process, then as two processes: DDP with every expert on both ranks (ep 1), and the experts sharded over
both (ep 2) under DDP and under FSDP2. Every point goes through the scaling study's own path
(``accel_kit.studies.run_study``: the sweep runner, ranks forked from its fork server, the worker, its
record), so what is printed is what ``accel-kit run scaling -p ep 2`` records: ``a2a_time_s`` (the counts'
all-gather and the dispatch and combine all-to-alls, forward and backward, per step), ``a2a_pct`` (its share
of the step) and ``expert_load_imbalance`` (the busiest expert's token copies over the mean).

On a CPU the two "devices" are processes sharing its cores, and the all-to-all is gloo over loopback: the
figures say what the exchange costs on this machine against a step of this size, not on a GPU's network.
Measured here (``--seq-len 256 --micro-batch 8``, a 2-core CPU shared with other work at a load of about
4, so the ratios move by tens of percent between runs; 25 s): tokens/s per device 11988 for one process,
9534 under DDP at ep 1 (80 %), 7238 at ep 2 under DDP (60 %; the all-to-alls 130 ms of a 283 ms step,
46 %) and 6332 under FSDP2 (53 %; 35 ms of 323 ms, 11 %), expert load imbalance 1.44. The all-to-all
time includes the wait for the other rank: under DDP the ranks drift apart between exchanges, while
FSDP's gathers before each block keep them in step.

    python benchmarks/moe_ep.py
    python benchmarks/moe_ep.py --seq-len 256 --micro-batch 8 --steps 5
"""
from __future__ import annotations

import platform
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from accel_kit import studies  # noqa: E402
from accel_kit.cli import OneLineParser, at_least, script_main  # noqa: E402

# Each two-process layout's fields (the scaling study's ``also`` entries).
LAYOUTS = {"ddp, ep 1": {"engine": "ddp", "ep": 1}, "ddp, ep 2": {"engine": "ddp", "ep": 2},
           "fsdp, ep 2": {"engine": "fsdp", "ep": 2}}


def _row(name: str, r, base: float | None) -> str:
    ok = r["status"] == "ok"
    if not ok:
        return f"{name:11s} {int(r['devices']):5d}  {r['status']}: {str(r.get('reason'))[:100]}"
    per = r["tokens_per_s_per_device"]
    eff = f"{100 * per / base:9.1f}%" if base else f"{'':>10s}"
    a2a = r.get("a2a_time_s")
    has_a2a = a2a is not None and a2a == a2a  # NaN where the layout has no exchange
    exchange = (f"{1000 * a2a:8.1f} {r['a2a_pct']:6.1f}% {r['expert_load_imbalance']:9.2f}" if has_a2a
                else f"{'-':>8s} {'-':>7s} {'-':>9s}")
    return (f"{name:11s} {int(r['devices']):5d} {str(r.get('mesh', '')):>28s} {1000 * r['step_time_s']:8.1f} "
            f"{r['tokens_per_s']:9.0f} {per:10.0f} {eff} {exchange}")


def main() -> int:
    ap = OneLineParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="moe-debug", help="MoE model preset (default moe-debug)")
    ap.add_argument("--seq-len", type=at_least(1), default=128)
    ap.add_argument("--micro-batch", type=at_least(1), default=4)
    ap.add_argument("--steps", type=at_least(1), default=5, help="timed optimizer steps per point (default 5)")
    ap.add_argument("--precision", default="fp32", help="fp32, bf16 or auto (default fp32)")
    args = ap.parse_args()
    import torch

    print(f"CPU: {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads; "
          f"{args.preset}, sequence {args.seq_len}, micro-batch {args.micro_batch}, {args.steps} steps, "
          f"{args.precision}")
    fixed = dict(preset=args.preset, seq_len=args.seq_len, micro_batch_size=args.micro_batch, steps=args.steps,
                 warmup_steps=1, precision=args.precision, data="synthetic", measure_peak=False, gas=1,
                 device_counts=[1], timeout_s=600)
    out = Path(tempfile.mkdtemp(prefix="accel-kit-moe-ep-"))
    run = studies.run_study("scaling", "cpu", "quick", output_dir=out, progress=True, rerun=True, **fixed,
                            also=[layout | {"devices": 2} for layout in LAYOUTS.values()])
    df = run.df()
    df = df.assign(ep=df["ep"].fillna(1) if "ep" in df.columns else 1)
    one = df[(df["devices"] == 1) & (df["status"] == "ok")]
    base = float(one["tokens_per_s_per_device"].iloc[0]) if not one.empty else None
    print(f"\n{'layout':11s} {'ranks':>5s} {'mesh':>28s} {'step ms':>8s} {'tokens/s':>9s} {'per device':>10s} "
          f"{'efficiency':>10s} {'a2a ms':>8s} {'a2a %':>7s} {'imbalance':>9s}")
    if not one.empty:
        print(_row("1 process", one.iloc[0], base))
    for name, layout in LAYOUTS.items():
        two = df[(df["devices"] == 2) & (df["engine"] == layout["engine"]) & (df["ep"] == layout["ep"])]
        for _, r in two.iterrows():
            print(_row(name, r, base))
    print(f"\nrecords: {run.records_path}; precision: {run.precision_line()}")
    return 0


if __name__ == "__main__":
    script_main(main, "moe_ep.py")
