"""Training step time and peak memory on the CPU with glibc's default malloc against the settings
the CPU adapter gives its workers (``accel_kit.devices.cpu.MALLOC_TUNABLES``), side by side.

Runs the GAS and sequence-length studies' quick profiles through the real worker path, in
rounds that alternate the two settings (``ACCEL_KIT_CPU_MALLOC=default`` for glibc's own), so a
slow spell of a shared machine falls on both. Prints each point's median step time and peak
memory under each setting and their ratio. About 2 minutes a round on 2 cores.

    python benchmarks/cpu_allocator.py             # 2 rounds
    python benchmarks/cpu_allocator.py --rounds 3
"""
from __future__ import annotations

import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from accel_kit import studies  # noqa: E402
from accel_kit.cli import OneLineParser, at_least, script_main  # noqa: E402
from accel_kit.devices.cpu import MALLOC_OPT_OUT, MALLOC_TUNABLES  # noqa: E402

STUDIES = ("gas", "seq_length")
SETTINGS = {"glibc default": "default", "adapter's": ""}


def main() -> int:
    ap = OneLineParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=at_least(1), default=2, help="rounds of both settings (default 2)")
    ap.add_argument("--steps", type=at_least(1), default=None,
                    help="timed steps per point (default: the quick profile's)")
    args = ap.parse_args()
    import torch

    print(f"CPU: {platform.processor() or platform.machine()}, torch capability "
          f"{torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} threads")
    print("adapter's settings: " + ":".join(f"{k}={v}" for k, v in MALLOC_TUNABLES.items()))
    out = Path(tempfile.mkdtemp(prefix="accel-kit-malloc-"))
    extra = {"steps": args.steps} if args.steps is not None else {}
    step_s: dict[tuple, dict[str, list[float]]] = {}
    mem_gib: dict[tuple, dict[str, list[float]]] = {}
    before = os.environ.get(MALLOC_OPT_OUT)
    try:
        for k in range(args.rounds):
            # Alternate which setting goes first, so neither always runs on a warmer or quieter machine.
            order = list(SETTINGS.items()) if k % 2 == 0 else list(reversed(SETTINGS.items()))
            for name, value in order:
                os.environ[MALLOC_OPT_OUT] = value
                for study in STUDIES:
                    run = studies.run_study(study, "cpu", "quick", output_dir=out / f"{name}-{k}".replace(" ", "-"),
                                            progress=False, **extra)
                    for rec in run.records:
                        if rec.status != "ok":
                            continue
                        p, m = rec.params, rec.metrics
                        point = (study, p["micro_batch_size"], p["gas"], p["seq_len"])
                        step_s.setdefault(point, {}).setdefault(name, []).append(m["step_time_s"])
                        mem_gib.setdefault(point, {}).setdefault(name, []).append(m["mem_peak_gib"])
                print(f"round {k + 1}: {name} done", flush=True)
    finally:
        if before is None:
            os.environ.pop(MALLOC_OPT_OUT, None)
        else:
            os.environ[MALLOC_OPT_OUT] = before

    default, tuned = SETTINGS
    print(f"\n{'study':11s} {'mb':>3s} {'gas':>3s} {'seq':>5s}  {'step ms: default':>16s} {'adapter':>8s} "
          f"{'speed-up':>8s}  {'peak GiB: default':>17s} {'adapter':>8s} {'ratio':>6s}")
    speedups, mem_ratios = [], []
    for point in sorted(step_s):
        s, m = step_s[point], mem_gib[point]
        if default not in s or tuned not in s:
            continue
        sd, st = statistics.median(s[default]), statistics.median(s[tuned])
        md, mt = statistics.median(m[default]), statistics.median(m[tuned])
        speedups.append(sd / st)
        mem_ratios.append(mt / md)
        print(f"{point[0]:11s} {point[1]:3d} {point[2]:3d} {point[3]:5d}  {1e3 * sd:16.1f} {1e3 * st:8.1f} "
              f"{sd / st:7.2f}x  {md:17.3f} {mt:8.3f} {mt / md:6.2f}")
    if not speedups:
        print("no point ran under both settings")
        return 1
    print(f"\nstep-time speed-up (default / adapter's): median {statistics.median(speedups):.2f}x, "
          f"range {min(speedups):.2f}-{max(speedups):.2f}x over {len(speedups)} points, medians of {args.rounds} rounds")
    print(f"peak memory (adapter's / default): median {statistics.median(mem_ratios):.2f}, "
          f"range {min(mem_ratios):.2f}-{max(mem_ratios):.2f}")
    return 0


if __name__ == "__main__":
    script_main(main, Path(__file__).name)
