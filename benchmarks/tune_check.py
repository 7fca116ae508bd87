"""Whether ``accel-kit tune`` chooses well: every configuration it predicts to fit is measured once, in one run, and
its choice (the fastest measured of its top K predicted and the system's default) is held against the best of all.

One tune run with ``top_k`` set to every configuration ranked: the model calibrated (where the output folder has
too few records of it), the plan made once, then each configuration measured in predicted order through the
sweep. From those rows it prints:
- the choice tune makes with ``--top K`` (the fastest measured among predicted ranks 1..K and the default) against
  the best measured of all (target: within 10 %);
- Kendall's tau between the predicted ranking and the measured tokens/s over every configuration measured
  (target: >= 0.6 over at least 6);
- the seconds the plan and the measuring took, the CPU's kernel capability and the load average before and after
  (a shared machine's other work moves the points' times, and with them the measured order).

    python benchmarks/tune_check.py                                  # llama3-debug and moe-debug, 4 gloo ranks
    python benchmarks/tune_check.py --preset moe-debug --top 4 --steps 5 --output-dir /tmp/tune-check

Records go to ``--output-dir`` (default: a fresh temporary folder), ``tune/cpu.jsonl``, like any tune run's.

Measured (2-core Intel Xeon with AMX, ``get_cpu_capability()`` AVX512, bf16, torch 2.13 CPU, quiet), ``--steps 4``:
llama3-debug, 40 configurations, choice 1.000 of the best, tau 0.887, 117 s; moe-debug, 42 configurations,
choice 0.973, tau 0.698, 177 s (docs/tune.md has every run's table and what the predictions miss).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

import torch  # noqa: E402

from accel_kit import tune  # noqa: E402
from accel_kit.tune.measure import measured_lines  # noqa: E402
from accel_kit.tune.rank import kendall_tau  # noqa: E402

CHOICE_WITHIN = 0.10  # the chosen layout's measured tokens/s at least 90 % of the best measured
TAU_TARGET, TAU_LAYOUTS = 0.6, 6
EVERY = 100_000  # top_k: every configuration ranked


def check(preset: str, devices: int, top: int, steps: int, output_dir: Path) -> None:
    base = {"preset": preset, "devices": devices, "steps": steps, "warmup_steps": 2, "timeout_s": 300}
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    tuned = tune.tune("cpu", tune.resolve_params(None, base | {"top_k": EVERY}),
                      output_dir=output_dir, progress=False)
    wall_s = time.perf_counter() - start
    rows = [r for r in tuned.rows if r.measured]
    print(f"== {preset} on {devices} gloo ranks: {len(tuned.rows)} configurations, {len(rows)} measured ok, "
          f"{wall_s:.0f} s (load average {load_before:.1f} -> {os.getloadavg()[0]:.1f})")
    print("\n".join(measured_lines(tuned)))
    if len(rows) < 2:
        print("fewer than 2 configurations measured: nothing to compare")
        return
    best = max(rows, key=lambda r: r.measured)
    pool = [r for r in rows if (r.predicted_rank is not None and r.predicted_rank <= top) or r.default]
    chosen = max(pool, key=lambda r: r.measured) if pool else None
    tau = kendall_tau([-(r.predicted_rank or len(tuned.plan.ranked) + 1) for r in rows], [r.measured for r in rows])
    if chosen is not None:
        ratio = chosen.measured / best.measured
        print(f"choice with --top {top}: {chosen.label}, {chosen.measured:.4g} tokens/s = {ratio:.3f} of the best "
              f"measured ({best.label}, {best.measured:.4g}): {'met' if ratio >= 1 - CHOICE_WITHIN else 'NOT met'} "
              f"(target >= {1 - CHOICE_WITHIN:.2f})")
    print(f"Kendall's tau over {len(rows)} configurations: {tau:.3f}: "
          f"{'met' if tau >= TAU_TARGET and len(rows) >= TAU_LAYOUTS else 'NOT met'} "
          f"(target >= {TAU_TARGET} over >= {TAU_LAYOUTS})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", nargs="+", default=["llama3-debug", "moe-debug"])
    ap.add_argument("--devices", type=int, default=4)
    ap.add_argument("--top", type=int, default=4, help="tune's --top: the choice checked against the best")
    ap.add_argument("--steps", type=int, default=5, help="timed steps a configuration")
    ap.add_argument("--output-dir", type=Path, default=None, help="records root (default: a temporary folder)")
    args = ap.parse_args()
    print(f"CPU kernel capability {torch.backends.cpu.get_cpu_capability()}, {os.cpu_count()} cores, "
          f"torch {torch.__version__}")
    for preset in args.preset:
        out = args.output_dir or Path(tempfile.mkdtemp(prefix=f"tune-check-{preset}-"))
        check(preset, args.devices, args.top, args.steps, out)


if __name__ == "__main__":
    main()
