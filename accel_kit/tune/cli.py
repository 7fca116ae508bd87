"""``accel-kit tune MODEL --system S --devices N ...``: the command line of ``accel_kit.tune``."""
from __future__ import annotations

import argparse


def _cmd_tune(args: argparse.Namespace) -> int:
    from accel_kit import tune

    overrides = dict(args.param or []) | {
        "preset": args.model, "devices": args.devices, "seq_len": args.seq_len, "global_batch": args.global_batch,
        "precision": args.precision, "top_k": args.top, "budget_s": args.budget_s}
    if args.records:
        overrides["records"] = args.records
    params = tune.resolve_params(args.profile, overrides)
    result = tune.tune(args.system, params, output_dir=args.output_dir, profile=args.profile,
                       progress=not args.quiet, rerun=args.rerun)
    print("\n".join(result.lines(args.show)))
    return 0


def add_tune_parser(sub, at_least) -> None:
    """The ``tune`` subcommand on ``sub``; ``at_least``: the CLI's bounded-number type (passed in, as this module
    sits below ``accel_kit.cli``)."""
    tune = sub.add_parser("tune", help="the fastest layout that fits a model on N devices: predicted, then "
                                       "measured where the system's device is here")
    tune.add_argument("model", help="model preset (e.g. llama3.1-8b, llama3-debug)")
    tune.add_argument("--system", required=True, help="system id from params/systems")
    tune.add_argument("--devices", type=at_least(1), required=True, help="devices (ranks) to lay the model out over")
    tune.add_argument("--seq-len", type=at_least(1), default=None, help="sequence length (default: the system's)")
    tune.add_argument("--global-batch", type=at_least(1), default=None,
                      help="samples per optimizer step (default: the system's micro-batch x devices)")
    tune.add_argument("--precision", default=None, help="fp32, bf16, fp16 or auto (default: the system's)")
    tune.add_argument("--top", type=at_least(1), default=None,
                      help="predicted-best layouts to measure, with the system's default (default: the profile's, 4)")
    tune.add_argument("--budget-s", type=at_least(0, float, above=True), default=None,
                      help="seconds for all the measuring (default: no limit)")
    tune.add_argument("--show", type=at_least(1), default=10, help="predicted layouts to print (default: 10)")
    tune.add_argument("--profile", default=None, help="params/tune/<profile>.yaml: the measured points' steps "
                                                      "(default: none, the parameters' defaults)")
    tune.add_argument("-p", "--param", nargs=2, action="append", metavar=("NAME", "VALUE"), type=str,
                      help="another tune parameter (steps, warmup_steps, memory_limit_gib, ...); VALUE is YAML")
    tune.add_argument("--records", nargs="+", default=None,
                      help="output folders, .jsonl files or archives to learn from (default: outputs/)")
    tune.add_argument("--output-dir", default=None, help="results root (default: <project>/outputs)")
    tune.add_argument("--rerun", action="store_true", help="measure again points recorded before")
    tune.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    tune.set_defaults(func=_cmd_tune)
