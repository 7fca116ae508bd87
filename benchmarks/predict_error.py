"""Held-out error of the what-if predictor on this machine's own quick-profile records.

Runs the quick profiles of the sequence-length, GAS and scaling studies (``--run``,
3 times by default (``--repeats``), each run into its own folder; about 1.5 minutes a run on 2 cores),
or reads existing output folders, then predicts each dense training point from a fit on the
others (leave-one-out) and prints the relative error of step time and peak memory, per study
and overall, against the targets: step time mean <= 10 %, max <= 25 %; peak memory mean <= 15 %.

A point run more than once is measured by the median of its runs, and the runs' own spread is
printed beside the error: on a shared machine a point's step time drifts 10-20 % from one run
to the next, which no prediction can beat from one run alone.

    python benchmarks/predict_error.py --run                 # measure 3 times, then predict
    python benchmarks/predict_error.py --records outputs     # or several: --records a b
"""
from __future__ import annotations

import platform
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

import pandas as pd  # noqa: E402

from accel_kit import studies  # noqa: E402
from accel_kit.cli import OneLineParser, at_least, script_main  # noqa: E402
from accel_kit.predict import error_summary, held_out, load_records  # noqa: E402

STUDIES = ("seq_length", "gas", "scaling")
TARGETS = {"step_mean_abs_error": 0.10, "step_max_abs_error": 0.25, "mem_mean_abs_error": 0.15}


def main() -> int:
    ap = OneLineParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", nargs="+", default=None,
                    help="output folders with records (or --run to make them)")
    ap.add_argument("--run", action="store_true", help="run the quick profiles first, into --out or a temp folder")
    ap.add_argument("--repeats", type=at_least(1), default=3, help="runs of each study for --run (default 3), "
                    "one after the other, each into <out>/run-K")
    ap.add_argument("--out", default=None, help="where --run writes (default: a temporary folder)")
    ap.add_argument("--system", default="cpu")
    ap.add_argument("--steps", type=at_least(1), default=None,
                    help="timed steps per point for --run (default: the quick profile's 3-4); more steps, less noise")
    args = ap.parse_args()
    if not args.run and not args.records:
        ap.error("give --records DIR or --run")
    from accel_kit.systems import load_system

    load_system(args.system)  # an unknown system: a one-line error before anything runs
    if args.run and args.out:
        from accel_kit.paths import writable_dir

        writable_dir(args.out, "--out")  # before the first run, not after it
    import torch

    print(f"CPU: {platform.processor() or platform.machine()}, torch capability "
          f"{torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} threads")
    folders = args.records or []
    if args.run:
        out = Path(args.out or tempfile.mkdtemp(prefix="accel-kit-predict-"))
        # One folder per run: a sweep resumes the points its folder already holds, so a second run
        # into the same folder would measure nothing.
        folders = [str(out / f"run-{k + 1}") for k in range(args.repeats)]
        extra = {"steps": args.steps} if args.steps is not None else {}
        for folder in folders:
            for study in STUDIES:
                run = studies.run_study(study, system=args.system, profile="quick", output_dir=folder,
                                        progress=True, **extra)
                print(f"{study}: {len(run.records)} records -> {run.records_path}")
    df = held_out(load_records(folders), [args.system], link_root=folders[0])
    if df.empty:
        print(f"no dense training records of {args.system} under {', '.join(folders)}")
        return 1
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        cols = ["study", "devices", "tp", "pp", "engine", "seq_len", "micro_batch_size", "gas", "runs",
                "measured_step_s", "run_spread",
                "predicted_step_s", "step_error", "measured_mem_gib", "predicted_mem_gib", "mem_error"]
        print(df[cols].to_string(index=False, float_format=lambda v: f"{v:.3g}"))
        for _, r in df[df["predicted_step_s"].isna()].iterrows():
            print(f"not predicted: {r['study']} {r['devices']} device(s): {r['why_not']}")
        summary = error_summary(df)
        print(summary.to_string(index=False, float_format=lambda v: f"{100 * v:.1f} %" if v < 10 else f"{v:.0f}"))
    # The targets are for the dense training studies of the quick profiles (other studies' records,
    # e.g. from `make run`, are fitted on and shown above, but not counted here).
    targeted = error_summary(df[df["study"].isin(STUDIES)])
    if targeted.empty:
        print(f"no records of {', '.join(STUDIES)} to check the targets on")
        return 1
    overall = targeted[targeted["study"] == "all"].iloc[0]
    print(f"targets, over {', '.join(STUDIES)} ({int(overall['predicted'])} of {int(overall['points'])} points "
          "predicted):")
    for name, limit in TARGETS.items():
        value = overall[name]
        print(f"  {name}: {100 * value:.1f} % (target <= {100 * limit:.0f} %): {'met' if value <= limit else 'NOT met'}")
    if pd.notna(overall["run_spread_mean"]):
        print(f"  for scale, the runs' own spread (each point's farthest run from its median, averaged): "
              f"{100 * overall['run_spread_mean']:.1f} %")
    return 0


if __name__ == "__main__":
    # an unknown system, a missing records folder: one line and status 2, not a traceback
    script_main(main, Path(__file__).name)
