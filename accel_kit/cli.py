"""Command line: ``accel-kit run STUDY --system S --profile P -p NAME VALUE ...`` and friends.

User errors (bad parameters, unknown systems, unavailable devices, broken inputs) print one
line, ``accel-kit: error: ...``, and exit with status 2; no traceback.
"""
from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from accel_kit.errors import AccelKitError

if TYPE_CHECKING:
    from accel_kit.params import StudyParams
    from accel_kit.systems import System


def _cmd_run(args: argparse.Namespace) -> int:
    from accel_kit import studies

    overrides = dict(args.param or [])
    run = studies.run_study(args.study, system=args.system, profile=args.profile, output_dir=args.output_dir,
                            progress=not args.quiet, rerun=args.rerun, **overrides)
    statuses: dict[str, int] = {}
    for rec in run.records:
        statuses[rec.status] = statuses.get(rec.status, 0) + 1
    table = run.summary()  # the notebook's table: units in the headers, a spread beside each throughput
    if not args.quiet and len(table):
        print(table)
    reused = f", {run.reused} from earlier runs" if run.reused else ""
    summary = (f"{len(run.records)} records ({', '.join(f'{n} {s}' for s, n in sorted(statuses.items()))}{reused}) "
               f"-> {run.records_path}")
    if not args.no_figures:
        figs = run.figures(save=True)
        summary += f"; {len(figs)} figures -> {run.study_dir / 'figures'}"
    print(summary)
    if not args.quiet and run.reuse_line():
        print(run.reuse_line())
    return 0


def _cmd_systems(args: argparse.Namespace) -> int:
    from accel_kit.devices import get_adapter
    from accel_kit.systems import load_system, system_ids

    ids = system_ids()
    width = max(map(len, ids), default=0)  # the columns line up whatever the longest id
    for sid in ids:
        system = load_system(sid)
        status = get_adapter(system.adapter, system.options).availability()
        print(f"{sid:{width}s} {system.adapter:11s} {'available' if status else 'unavailable: ' + status.reason}"
              f"  | {system.description}")
    return 0


def _cmd_jobscript(args: argparse.Namespace) -> int:
    from pathlib import Path

    from accel_kit import studies
    from accel_kit.atomic import atomic_path
    from accel_kit.devices import get_adapter
    from accel_kit.paths import writable_file
    from accel_kit.systems import load_system
    from accel_kit.engine.launch import SCHEDULER_LAUNCHER, SUBMIT, check_job, job_log, render_jobscript
    from accel_kit.paths import output_dir

    declared = studies.get_study(args.study)  # a one-line error for an unknown study
    if "launcher" not in declared.params.model_fields:  # the script passes -p launcher
        multi = [s for s in studies.STUDIES if "launcher" in studies.get_study(s).params.model_fields]
        raise AccelKitError(f"study {args.study!r} runs in one process on one device; job scripts are for "
                            f"{', '.join(multi)}")
    system = load_system(args.system)
    scheduler = args.scheduler or system.schedulers[0]
    if scheduler not in system.schedulers:
        raise AccelKitError(f"system {system.id!r} runs job scripts with --scheduler {' or '.join(system.schedulers)}, "
                            f"not {scheduler!r}")
    # The system's own launch (a vendor launcher, its SDK's environment), else the scheduler's.
    adapter = get_adapter(system.adapter, system.options)
    launch = adapter.job_launch(scheduler)
    # The node's devices: given, else the adapter's count of this node's (a CPU's cores), else the system's figure.
    # (0 or less given: check_job's one line)
    per_node = (launch.devices_per_node or system.devices_per_node) if args.devices_per_node is None \
        else args.devices_per_node
    check_job(scheduler, system=system.id, nodes=args.nodes, devices_per_node=per_node,
              walltime=args.walltime)  # before the parameters, which take the node count too
    if args.launcher and launch.launcher:
        raise AccelKitError(f"system {system.id!r} starts its points with its own launcher ({launch.launcher}); "
                            "--launcher does not apply")
    launcher = args.launcher or launch.launcher or SCHEDULER_LAUNCHER[scheduler]
    overrides = [*launch.params, *((n, v) for n, v in args.param or [])]
    # Resolve the parameters the job will run with (the script's own -p first, the user's after
    # them win), so an unknown profile or parameter fails here, not after the job has queued.
    # The script's `-p launcher L -p max_nodes N` come before the overrides, which win as they do in the job.
    script_params = {"launcher": launcher, "max_nodes": 1 if launcher == "local" else args.nodes,
                     "devices_per_node": per_node}
    params = studies.resolve(args.study, args.profile, **(script_params | dict(overrides)))
    per_node = getattr(params, "devices_per_node", None) or per_node  # a -p devices_per_node of the user's wins
    layout, walltime = _job_points(args, params, system, scheduler, per_node)

    path = Path(args.out or f"accel-kit-{args.study}-{args.system}-{args.nodes}n.{scheduler}.sh")
    log = job_log(scheduler, str(path))
    outputs = output_dir().resolve()
    tasks_per_node = 1 if params.launcher == "torchrun" else adapter.placement(per_node).processes
    text = render_jobscript(scheduler, study=args.study, system=system.id, nodes=args.nodes,
                            devices_per_node=per_node, profile=args.profile, walltime=walltime,
                            path=str(path), overrides=overrides, launcher=params.launcher,
                            setup=launch.setup + tuple(args.setup or environment_setup()),
                            directives=launch.directives, template=launch.template,
                            tasks_per_node=tasks_per_node,
                            layout=tuple(layout), probe_link=args.link_probe, gpus_per_node=system.gpus_per_node,
                            log=log, outputs=str(outputs))
    writable_file(path, "job script")
    with atomic_path(path) as tmp:  # never a half-written script for a scheduler to pick up
        tmp.write_text(text)
        tmp.chmod(0o755)
    gpus = f", {system.gpus_per_node} GPUs a node asked" if system.gpus_per_node and scheduler != "appliance" else ""
    # (an appliance's script is the adapter's own: it names neither a log nor the records' folder)
    where = "" if scheduler == "appliance" else f"; records under {outputs}, its log {log}"
    print(f"wrote {path}: {args.nodes} node(s) x {per_node} devices of {system.id}{gpus}, wall time {walltime}"
          f"{where}; {SUBMIT[scheduler]} {path}")
    return 0


def _job_points(args: argparse.Namespace, params: StudyParams, system: System, scheduler: str,
                per_node: int) -> tuple[list[str], str]:
    """The lines a job script says of its points (the layouts it runs, those left out, how its wall time was
    derived) and that wall time."""
    from accel_kit.engine.launch import job_walltime
    from accel_kit.engine.sweep import PEAK_TIMEOUT_S, TERM_GRACE_S
    # Its points' layouts checked here too (a tp that does not divide the heads is one line here, not a job that
    # fails on its nodes), and said in it.
    from accel_kit.studies.training import (AxesParams, all_points, layout_lines, left_out_lines,
                                             unresolved_precision)

    layout: list[str] = []
    walltime = args.walltime or DEFAULT_WALLTIME
    if not isinstance(params, AxesParams):  # (GenSLM and sparsity make their points their own way)
        return layout, walltime
    params.check(system)
    points = all_points(params, system, unresolved_precision)
    # The job lists only the points its nodes hold (the others would be recorded as unsupported), and asks
    # the time they may take.
    nodes = 1 if params.launcher == "local" else args.nodes
    runnable = [p for p in points if p.nodes <= nodes]
    left_out = [p for p in points if p.nodes > nodes]
    if not runnable:
        least = min(p.nodes for p in points)
        raise AccelKitError(f"no point of {args.study} fits the job's {nodes * per_node} devices "
                            f"({nodes} node(s) x {per_node}): the least needs {least} node(s); "
                            f"ask --nodes {least}")
    layout = layout_lines(runnable) + (left_out_lines(left_out, nodes, per_node) if left_out else [])
    if scheduler != "appliance":  # (an appliance's walltime is each of its jobs' limit, not the run's)
        precisions = {p.precision for p in runnable}
        walltime, why = job_walltime(len(runnable), params.timeout_s, grace_s=TERM_GRACE_S,
                                     peaks=len(precisions) if params.measure_peak else 0,
                                     peak_timeout_s=PEAK_TIMEOUT_S, given=args.walltime)
        layout[0:0] = why
    return layout, walltime


# The wall time of a job whose points the CLI does not count (GenSLM's, sparsity's) and each appliance job's limit.
DEFAULT_WALLTIME = "01:00:00"


def environment_setup() -> tuple[str, ...]:
    """The job script's line that activates the venv this command runs from (its ``accel-kit`` is the one the
    job should run); none outside a venv (a system Python or conda: say it with --setup)."""
    import shlex

    if sys.prefix == sys.base_prefix:
        return ()
    return (f". {shlex.quote(sys.prefix + '/bin/activate')}",)


def _cmd_predict(args: argparse.Namespace) -> int:
    from accel_kit import predict

    if args.probe_link:
        _probe_link(args.system, ranks=args.probe_ranks, nodes=1, launcher=None, root=(args.records or [None])[0])
    overrides = dict(args.param or []) | ({"preset": args.preset} if args.preset else {})
    if args.records:
        overrides["records"] = args.records
    run = predict.what_if(args.system, predict.resolve_params(args.profile, overrides))
    import pandas as pd

    with pd.option_context("display.width", 200, "display.max_columns", 30):
        print(run.table().to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    print(run.explain())
    print(run.held_out_summary())
    inference = run.inference()  # (empty where the system has no offline-generation records: the summary says so)
    if not inference.empty:
        print(f"greedy generation, input {run.params.inference_input_len} / output {run.params.inference_output_len} "
              f"tokens:")
        with pd.option_context("display.width", 200, "display.max_columns", 30):
            print(inference.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    print(run.inference_summary())
    if not run.predictions and ("ttft_s" not in inference or inference["ttft_s"].isna().all()):
        raise AccelKitError(f"nothing predicted for {args.system}: " + "; ".join(run.notes))
    return 0


def _probe_link(system: str, *, ranks: int, nodes: int, launcher: str | None, root: str | None) -> None:
    from accel_kit.paths import writable_file
    from accel_kit.predict.links import link_cache_path, probe_link

    # The probe keeps what it measured beside the records; that folder must take it before the probe runs.
    kept = writable_file(link_cache_path(system, root, inter_node=nodes > 1), "measured link")
    link = probe_link(system, ranks=ranks, nodes=nodes, launcher=launcher, root=root)
    print(f"{'inter-node ' if nodes > 1 else ''}link of {system}: {link.bandwidth_GBps:.3g} GB/s per rank, "
          f"{link.latency_us:.3g} us per step ({link.source}); kept in {kept}")


def _cmd_link(args: argparse.Namespace) -> int:
    ranks = args.ranks or (2 if args.nodes == 1 else args.nodes)
    _probe_link(args.system, ranks=ranks, nodes=args.nodes, launcher=args.launcher, root=args.output_dir)
    return 0


def at_least(minimum: float, kind: type = int, *, above: bool = False):
    """An argparse type: a ``kind`` (int or float) >= ``minimum`` (> with ``above``); anything else
    is argparse's one-line usage error naming the flag (the benchmarks' scripts use it too)."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {'an integer' if kind is int else 'a number'}, "
                                             f"got {text!r}") from None
        if kind is float and value in (float("inf"), float("-inf")):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
        if not (value > minimum if above else value >= minimum):  # also refuses a float NaN
            raise argparse.ArgumentTypeError(f"must be {'more than' if above else 'at least'} {minimum}, got {text}")
        return value

    return parse


def script_main(main, prog: str) -> None:
    """Run a script's ``main() -> int | None`` and exit with its status; an AccelKitError (a bad
    value found past argparse: an unknown system, preset or precision) is one line,
    ``<prog>: error: ...``, and status 2, as the CLI does."""
    try:
        status = main()
    except AccelKitError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        sys.exit(2)
    sys.exit(status or 0)


class OneLineParser(argparse.ArgumentParser):
    """argparse with usage errors in the CLI's one-line form, ``<program>: error: ... (usage: <prog> -h)``,
    and status 2; the usage is one ``-h`` away. The benchmarks' scripts parse their flags with it too."""

    def error(self, message: str):
        # A sub-command's prog is "accel-kit prepare text": the line starts with the program alone.
        self.exit(2, f"{self.prog.split()[0]}: error: {message} (usage: {self.prog} -h)\n")


class _HelpWithParameters(argparse.Action):
    """``predict -h``: the help, with every parameter ``-p`` takes (``WhatIfParams``'), read only when asked:
    importing the predictor takes seconds, too long for every command's start."""

    def __init__(self, option_strings: list[str], dest: str, help: str | None = None):
        super().__init__(option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, nargs=0, help=help)
        self.param: argparse.Action | None = None  # the -p option, whose help this fills in

    def __call__(self, parser, namespace, values, option_string=None):
        from accel_kit.predict import WhatIfParams

        self.param.help = (f"a what-if parameter: {', '.join(WhatIfParams.parameter_names())}; "
                           "VALUE is YAML (-p devices '[8, 64]')")
        parser.print_help()
        parser.exit()


def _add_link_parser(sub) -> None:
    link = sub.add_parser("link", help="measure the link between devices (an all-reduce probe) for the predictor")
    link.add_argument("--system", required=True, help="system id from params/systems")
    link.add_argument("--nodes", type=at_least(1), default=1,
                      help="1 (default): local ranks, the link within a node; more: ranks over that many nodes "
                           "of the batch job this runs in, kept as the inter-node link")
    link.add_argument("--ranks", type=at_least(2), default=None,
                      help="processes in the probe, spread evenly over the nodes (default: 2 on one node, "
                           "else one per node)")
    link.add_argument("--launcher", choices=["mpiexec", "mpirun", "srun", "torchrun"], default=None,
                      help="how the ranks start across nodes (default: the batch job's scheduler's: srun, mpiexec)")
    link.add_argument("--output-dir", default=None, help="the records' folder the link is kept beside "
                                                          "(default: outputs/, or $ACCEL_KIT_OUTPUT_DIR)")
    link.set_defaults(func=_cmd_link)


def build_parser() -> argparse.ArgumentParser:
    from accel_kit import __version__

    parser = OneLineParser(prog="accel-kit", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"accel-kit {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run a study on a system")
    run.add_argument("study", help="study name (e.g. microbenchmark)")
    run.add_argument("--system", default="cpu", help="system id from params/systems (default: cpu)")
    run.add_argument("--profile", default="quick", help="parameter profile from params/<study>/ (default: quick)")
    run.add_argument("-p", "--param", nargs=2, action="append", metavar=("NAME", "VALUE"), type=str,
                     help="override a parameter; VALUE is parsed as YAML (e.g. -p batch_sizes '[4]')")
    run.add_argument("--output-dir", default=None, help="results root (default: <project>/outputs)")
    run.add_argument("--rerun", action="store_true",
                     help="measure every point again, even those recorded before (default: resume them)")
    run.add_argument("--no-figures", action="store_true", help="skip the HTML figures (no plotly needed)")
    run.add_argument("-q", "--quiet", action="store_true", help="no progress bars or table")
    run.set_defaults(func=_cmd_run)

    job = sub.add_parser("jobscript", help="write a PBS or Slurm job script that runs a study on several nodes")
    job.add_argument("study")
    job.add_argument("--system", required=True)
    job.add_argument("--nodes", type=int, required=True, help="nodes to request (at least 1)")
    job.add_argument("--scheduler", choices=["pbs", "slurm", "appliance"], default=None,
                     help="pbs, slurm, or appliance (a cluster without batch scheduler, whose script "
                          "the system's adapter writes); default: the system's first")
    job.add_argument("--profile", default="full")
    job.add_argument("--walltime", default=None,
                     help="HH:MM:SS (default: the listed points' timeouts added up, plus the job's setup, rounded "
                          "up to a quarter hour, at most 24:00:00; 01:00:00 where the points are not counted: "
                          "GenSLM, sparsity, and an appliance's, where it is each of its jobs' limit)")
    job.add_argument("--out", default=None, help="script path (default: accel-kit-STUDY-SYSTEM-Nn.SCHED.sh)")
    job.add_argument("--launcher", choices=["mpiexec", "srun", "torchrun"], default=None,
                     help="how each point starts its ranks: mpiexec or srun (every rank), or torchrun (one per "
                          "node, meeting at a c10d rendezvous on the first node); default: the scheduler's "
                          "(mpiexec under PBS, srun under Slurm) or the system's own")
    job.add_argument("--devices-per-node", type=int, default=None, metavar="N",
                     help="devices (ranks) each node runs: Slurm's tasks per node, and how the points' ranks "
                          "spread over the nodes (default: the system's; on cpu, the cores here)")
    job.add_argument("--setup", action="append", default=None, metavar="LINE",
                     help="a shell line the job runs before accel-kit (repeatable; e.g. 'module load conda'); "
                          "default: one activating the venv this command runs from")
    job.add_argument("--no-link-probe", dest="link_probe", action="store_false",
                     help="leave out the job's first step on several nodes: the inter-node link measured for the "
                          "predictor (accel-kit link), a few seconds")
    job.add_argument("-p", "--param", nargs=2, action="append", metavar=("NAME", "VALUE"), type=str,
                     help="parameter override passed to the run (the layout too: -p tp 2, -p engine fsdp)")
    job.set_defaults(func=_cmd_jobscript)

    from accel_kit.data.cli import add_prepare_parser

    add_prepare_parser(sub)

    pred = sub.add_parser("predict", help="predict throughput and memory past the devices at hand (what-if)",
                          add_help=False)
    helper = pred.add_argument("-h", "--help", action=_HelpWithParameters,
                               help="show this help message, every parameter -p takes included, and exit")
    pred.add_argument("--system", required=True, help="system id from params/systems")
    pred.add_argument("--preset", default=None, help="model preset (default: the profile's)")
    pred.add_argument("--profile", default=None, help="params/what_if/<profile>.yaml (default: none)")
    helper.param = pred.add_argument("-p", "--param", nargs=2, action="append", metavar=("NAME", "VALUE"), type=str,
                                     help="a what-if parameter (-h lists them); VALUE is YAML (-p devices '[8, 64]')")
    pred.add_argument("--records", nargs="+", default=None,
                      help="output folders, .jsonl files or archives of them to fit on (default: outputs/)")
    pred.add_argument("--probe-link", action="store_true", help="measure the link with an all-reduce probe first")
    pred.add_argument("--probe-ranks", type=at_least(2), default=2,
                      help="processes in the probe (default: 2; an all-reduce needs at least 2)")
    pred.set_defaults(func=_cmd_predict)

    _add_link_parser(sub)
    from accel_kit.report.cli import add_report_parser
    from accel_kit.tune.cli import add_tune_parser

    add_report_parser(sub)
    add_tune_parser(sub, at_least)

    systems = sub.add_parser("systems", help="list systems and whether each is available here")
    systems.set_defaults(func=_cmd_systems)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # -p values stay text here: the parameters' validation (accel_kit.params.validate) parses each once,
    # as YAML, for the fields that are not plain strings, exactly as it does papermill's.
    try:
        return args.func(args)
    except AccelKitError as exc:
        parser.exit(2, f"accel-kit: error: {exc}\n")
    except KeyboardInterrupt:
        parser.exit(130, "accel-kit: interrupted; records written so far are kept\n")


if __name__ == "__main__":
    sys.exit(main())
