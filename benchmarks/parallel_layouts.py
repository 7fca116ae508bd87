"""Tokens/s per device and scaling efficiency of the parallel layouts on two gloo processes, side by side.

One small training point (default GPT-2 small, sequence 128, micro-batch 2, a few steps, synthetic
tokens) runs as one process, then as two processes in each layout asked for: DDP (dp 2), FSDP2 (dp
2), tensor parallel 2, pipeline parallel 2. Every point goes through the scaling study's own path
(``accel_kit.studies.run_study``: the sweep runner, a group of ranks forked from its fork server,
the worker, its record), so what is printed is what ``accel-kit run scaling`` records. A layout this
checkout refuses (its one-line reason) is printed as skipped, and the others run. Scaling efficiency
here is each layout's tokens/s per device over the one process's tokens/s: tensor and pipeline
parallelism split one replica over the two processes (dp 1), so their global batch is half of DDP's.

On a CPU the two "devices" are processes sharing its cores (each gets half of them): the
efficiency says what the layout's communication and split cost on this machine, not on GPUs.
Measured here with the defaults (2-core AMD EPYC with AVX512-BF16, nothing else running, bf16 by
``auto``; 1 min 34 s for the five points): tokens/s per device 152 (one process), 118 ddp (78 %),
86 fsdp (56 %), 77 tp 2 (51 %), 73 pp 2 (48 %). One process has both cores, each of two ranks one:
so even DDP's figure is mostly the halved cores, and the layouts' order, not their size, is what
this machine says. With the ranks forked from the fork server, two runs on the same machine gave
150 and 146 (one process), ddp 75 % and 76 %, fsdp 56 % and 49 %, tp 2 59 % and 48 %, pp 2 55 %
and 53 %: from run to run, fsdp, tp and pp moved by up to 11 points.

    python benchmarks/parallel_layouts.py
    python benchmarks/parallel_layouts.py --layouts ddp tp2 --steps 5 --preset llama3-small
"""
from __future__ import annotations

import platform
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from accel_kit import studies  # noqa: E402
from accel_kit.cli import OneLineParser, at_least, script_main  # noqa: E402
from accel_kit.errors import ParameterError  # noqa: E402

# Each layout's fields on two devices (the scaling study's ``also`` entries).
LAYOUTS = {"ddp": {"engine": "ddp"}, "fsdp": {"engine": "fsdp"}, "tp2": {"tp": 2}, "pp2": {"pp": 2}}


def main() -> int:
    ap = OneLineParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layouts", nargs="+", choices=list(LAYOUTS), default=list(LAYOUTS),
                    help="two-process layouts to run beside one process (default: all)")
    ap.add_argument("--preset", default="gpt2-small", help="model preset (default gpt2-small)")
    ap.add_argument("--seq-len", type=at_least(1), default=128)
    ap.add_argument("--micro-batch", type=at_least(1), default=2)
    ap.add_argument("--steps", type=at_least(1), default=3, help="timed optimizer steps per point (default 3)")
    ap.add_argument("--precision", default="auto", help="fp32, bf16 or auto (default: auto, as the quick profiles)")
    args = ap.parse_args()
    import torch

    print(f"CPU: {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads; "
          f"{args.preset}, sequence {args.seq_len}, micro-batch {args.micro_batch}, {args.steps} steps")
    fixed = dict(preset=args.preset, seq_len=args.seq_len, micro_batch_size=args.micro_batch, steps=args.steps,
                 warmup_steps=1, precision=args.precision, data="synthetic", measure_peak=False, gas=1,
                 device_counts=[1], timeout_s=600)
    runnable, skipped = [], {}
    for name in args.layouts:  # each checked alone, so one refused layout does not stop the others
        entry = LAYOUTS[name] | {"devices": 2}
        try:
            params = studies.resolve("scaling", "quick", **fixed, also=[entry])
            from accel_kit.studies.training import all_points, unresolved_precision
            from accel_kit.systems import load_system

            all_points(params, load_system("cpu"), unresolved_precision)
            runnable.append(name)
        except ParameterError as exc:
            skipped[name] = str(exc)
    for name, why in skipped.items():
        print(f"{name}: skipped: {why}")
    out = Path(tempfile.mkdtemp(prefix="accel-kit-layouts-"))
    run = studies.run_study("scaling", "cpu", "quick", output_dir=out, progress=True, rerun=True, **fixed,
                            also=[LAYOUTS[name] | {"devices": 2} for name in runnable])
    df = run.df()
    df = df.assign(**{k: df[k].fillna(v) if k in df.columns else v for k, v in (("tp", 1), ("pp", 1))})
    one = df[(df["devices"] == 1) & (df["status"] == "ok")]
    base = float(one["tokens_per_s"].iloc[0]) if not one.empty else None
    print(f"\n{'layout':10s} {'ranks':>5s} {'mesh':>20s} {'global batch':>12s} {'tokens/s':>9s} "
          f"{'per device':>10s} {'efficiency':>10s}  status")
    rows = [("1 process", one.iloc[0])] if not one.empty else []
    for name in runnable:
        want = LAYOUTS[name]
        two = df[(df["devices"] == 2) & (df["engine"] == want.get("engine", "ddp")) & (df["tp"] == want.get("tp", 1))
                 & (df["pp"] == want.get("pp", 1))]
        rows += [(name, r) for _, r in two.iterrows()]
    for name, r in rows:
        ok = r["status"] == "ok"
        per = r["tokens_per_s_per_device"] if ok else None
        eff = f"{100 * per / base:9.1f}%" if ok and base else f"{'':>10s}"
        print(f"{name:10s} {int(r['devices']):5d} {str(r.get('mesh', '')):>20s} "
              f"{'' if not ok else int(r['global_batch_size']):>12} "
              f"{'' if not ok else f'{r.tokens_per_s:9.0f}':>9s} {'' if not ok else f'{per:10.0f}':>10s} {eff}  "
              f"{r['status']}{'' if ok else ': ' + str(r.get('reason'))[:100]}")
    print(f"\nrecords: {run.records_path}; precision: {run.precision_line()}")
    return 0


if __name__ == "__main__":
    script_main(main, "parallel_layouts.py")
