"""Studies: each is a module that declares ``STUDY = Study(...)`` (``accel_kit.studies.study``): its parameters, its
points or its runner, its table, the columns a reader sees, its figures, findings, headline metric and report tables.

A study declares its points (``points(params, system) -> Sequence[Point]``, of any registered kind,
``accel_kit.engine.kinds``) and the generic runner (``run_declared``) runs them through the sweep
runner; a study whose running differs (the training studies' data and measured peak) declares a
``run(params, system, ...)`` of its own instead. ``run_study`` is the single entry point behind both
the notebooks and the CLI, so the two always produce the same records. Adding a study is its module,
its params/<study>/ profiles and one line in ``STUDIES`` (or ``register_study``: ``docs/engine.md``).
"""
from __future__ import annotations

import functools
import importlib
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Sequence

import pandas as pd

from accel_kit import params as _params
from accel_kit import results
from accel_kit.errors import ParameterError
from accel_kit.paths import output_dir as _output_dir
from accel_kit.paths import output_dir_origin, writable_dir
from accel_kit.studies.study import Headline, ReportTable, Row, Study
from accel_kit.json_types import JSONObject, JSONValue
from accel_kit.params import StudyParams
from accel_kit.systems import System, load_system

if TYPE_CHECKING:
    from plotly.graph_objects import Figure

# Study name -> the module that declares its ``STUDY``, imported when the study is first asked for. Adding a
# study is its module, its params/<study>/ profiles and one line here.
STUDIES: dict[str, str] = {
    "microbenchmark": "accel_kit.studies.microbenchmark",
    "scaling": "accel_kit.studies.scaling",
    "seq_length": "accel_kit.studies.seq_length",
    "gas": "accel_kit.studies.gas",
    "sparsity": "accel_kit.studies.sparsity",
    "genslm": "accel_kit.studies.genslm",
    "inference": "accel_kit.studies.inference",
}


def register_study(name: str, module: str) -> None:
    """Add study ``name``, declared by ``module``'s ``STUDY`` (a study defined outside accel_kit, e.g. a test's)."""
    if STUDIES.get(name, module) != module:
        raise ValueError(f"study {name!r} registered twice: {STUDIES[name]} and {module}")
    STUDIES[name] = module


def get_study(name: str) -> Study:
    """The declaration of study ``name`` (its module's ``STUDY``); an unknown name is one line."""
    try:
        declared = getattr(importlib.import_module(STUDIES[name]), "STUDY", None)
    except KeyError:
        raise ParameterError(f"unknown study {name!r}; known: {', '.join(STUDIES)}") from None
    if not isinstance(declared, Study) or declared.name != name:
        raise TypeError(f"{STUDIES[name]} declares no STUDY = Study({name!r}, ...)")
    return declared


def study_module(name: str) -> ModuleType:
    """The module of study ``name`` (what it declares beyond ``STUDY``: its helpers, its constants)."""
    get_study(name)  # a one-line error for an unknown name, a TypeError for a module without its declaration
    return importlib.import_module(STUDIES[name])


@dataclass
class StudyRun:
    """What one invocation of a study produced."""

    study: str
    system: str
    run_id: str
    study_dir: Path  # outputs/<study>/
    records: list[results.Record]
    profile: str | None = "quick"
    # What the run was given beyond its profile (None = the profile's value), for the re-run command.
    overrides: JSONObject = field(default_factory=dict)
    output_dir: str | Path | None = None  # as given (None: $ACCEL_KIT_OUTPUT_DIR or <project>/outputs)

    @property
    def records_path(self) -> Path:
        return records_path(self.study_dir, self.system)

    def df(self) -> pd.DataFrame:
        """This run's records (including those of earlier runs it resumed from)."""
        df = results.load(self.records_path) if self.records_path.exists() else pd.DataFrame()
        if df.empty:
            return df
        ids = {rec.record_id for rec in self.records}
        return df[df["record_id"].isin(ids)].reset_index(drop=True)

    @property
    def reused(self) -> int:
        """How many of the records come from an earlier run (points skipped on resume)."""
        return sum(rec.run_id != self.run_id for rec in self.records)

    def table(self) -> pd.DataFrame:
        """The study's summary table of this run (the data: every column, the record ids)."""
        return get_study(self.study).table(self.df())

    def summary(self, table: str = "table"):
        """The table for people (``accel_kit.tables.readable``): the study's columns with units, a spread
        beside every throughput, rounded to what the noise supports; the trials and runs come from every
        record of the folder, so a point re-run shows the range of its runs. ``table``: the study's function
        that builds it (a study with a second table, e.g. inference's ``serve_table``)."""
        from accel_kit import tables

        declared = get_study(self.study)
        every = results.load(self.records_path) if self.records_path.exists() else pd.DataFrame()
        shown = list(declared.shown) if declared.shown is not None and table == "table" else None
        return tables.readable(declared.table(self.df(), table), every, shown)

    def findings(self) -> list[str]:
        """The study's findings over every system's records under ``study_dir`` (a difference is called one
        only when the confidence interval of the ratio excludes 1: ``accel_kit.noise``); empty for a study
        that states none."""
        declared = get_study(self.study)
        if declared.findings is None or not self.study_dir.exists():
            return []
        return [f["text"] for f in declared.findings(results.load(self.study_dir))]

    def show_findings(self) -> None:
        """Print the findings, one a line (or why there is none)."""
        print("\n".join(self.findings()) or "No finding: no configuration has two points to compare.")

    def reuse_line(self) -> str | None:
        """One line when points were recorded by an earlier run and not measured now: how many, when, and
        how to measure again; None when every point was measured now."""
        if not self.reused:
            return None
        earlier = [rec for rec in self.records if rec.run_id != self.run_id]
        dates = sorted(rec.timestamp[:16].replace("T", " ") for rec in earlier)
        when = dates[0] if dates[0] == dates[-1] else f"{dates[0]} to {dates[-1]}"
        head = (f"Nothing was measured now: all {len(self.records)} points" if self.reused == len(self.records)
                else f"{self.reused} of {len(self.records)} points (the rest measured now)")
        return (f"{head} were recorded before ({when} UTC) and are shown from {self.records_path.name}. "
                f"To measure again: {self.rerun_how()}.")

    def rerun_how(self) -> str:
        """How to measure this run's points afresh: in the notebook, and as a command that runs as printed."""
        return rerun_how(self.study, self.system, self.profile, self.overrides, self.output_dir)

    def precision_line(self) -> str:
        """The precision each point ran in and why (``auto``'s choice and its reason), once per distinct choice."""
        seen = dict.fromkeys(results.precision_text(rec.params) for rec in self.records
                             if rec.params.get("precision"))
        return "Precision that ran: " + " | ".join(seen) if seen else "Precision: no point recorded one."

    def figures(self, save: bool = True) -> dict[str, Figure]:
        """The study's figures over every system's latest records under ``study_dir``."""
        return figures(self.study, self.study_dir, save=save)

    def report_line(self) -> str:
        """Where the cross-system report is and how to rebuild it (the last line of a study notebook)."""
        return report_line(self.study_dir.parent)

    def show_figures(self) -> dict[str, Figure]:
        """Show (and save) the figures; when there is nothing to draw, say why instead of staying blank."""
        figs = self.figures(save=True)
        for fig in figs.values():
            fig.show()
        if not figs:
            print(self.nothing_to_draw())
        return figs

    def nothing_to_draw(self) -> str:
        """Why a study has no figure: its points' statuses and the first reason of each."""
        counts: dict[str, int] = {}
        reasons: dict[str, str] = {}
        for rec in self.records:
            counts[rec.status] = counts.get(rec.status, 0) + 1
            reasons.setdefault(rec.status, rec.reason or "")
        if not self.records:
            return "No figure to draw: this run has no points."
        if "ok" in counts:
            return "No figure to draw: the ok records lack the metrics the figures plot."
        parts = [f"{n} {status} (e.g. {reasons[status][:160]})" for status, n in counts.items()]
        return f"No figure to draw: none of this run's {len(self.records)} points has status ok: " + "; ".join(parts)


def rerun_command(study: str, system: str = "cpu", profile: str | None = "quick",
                  overrides: JSONObject | None = None, output_dir: str | Path | None = None) -> str:
    """The ``accel-kit run`` command that measures afresh the points of a run of ``study`` with these
    arguments, quoted for a POSIX shell: the same points, since it passes the same parameters."""
    import json

    words = ["accel-kit", "run", study, "--system", system]
    if profile is not None:
        words += ["--profile", profile]
    for name, value in (overrides or {}).items():
        if value is not None:  # None: the profile's value, which --profile gives already
            # -p VALUE is YAML; JSON is YAML, so a list, a number or a string reads back as the same value.
            words += ["-p", name, value if isinstance(value, str) else json.dumps(value, default=str)]
    if output_dir:
        words += ["--output-dir", str(output_dir)]
    return shlex.join([*words, "--rerun"])


def rerun_how(study: str, system: str = "cpu", profile: str | None = "quick",
              overrides: JSONObject | None = None, output_dir: str | Path | None = None) -> str:
    """The one way to measure afresh points already recorded (README, "Exploring in JupyterLab")."""
    return (f"set rerun = True in the parameters cell (papermill -p rerun true; "
            f"{rerun_command(study, system, profile, overrides, output_dir)})")


REPORT_HOW = ("the cross-system report of every study: run notebooks/report.ipynb, or accel-kit report "
              "(writes outputs/report.html)")


def report_line(output_dir: str | Path | None = None) -> str:
    """Where the cross-system report is, whether it is older than the records beside it, and how to rebuild it."""
    root = _output_dir(output_dir)
    page = root / "report.html"
    newest = max((f.stat().st_mtime for f in root.glob("*/*.jsonl")), default=None) if root.exists() else None
    if not page.exists():
        state = f"{page} is not built yet"
    elif newest is not None and page.stat().st_mtime < newest:
        state = f"{page} is older than the newest records, rebuild it"
    else:
        state = f"{page} is up to date with the records"
    return f"Report: {state}; {REPORT_HOW}."


def records_path(study_dir: Path, system: str) -> Path:
    return study_dir / f"{system}.jsonl"


def resolve(study: str, profile: str | None = "quick", **overrides: JSONValue) -> StudyParams:
    """The study's validated parameters for ``profile`` with ``overrides`` (None = profile default)."""
    return _params.resolve(get_study(study).params, study, profile, overrides)


def run_study(study: str, system: str = "cpu", profile: str | None = "quick", *,
              output_dir: str | Path | None = None, progress: bool = True, rerun: bool = False,
              **overrides: JSONValue) -> StudyRun:
    """Run ``study`` on ``system`` with ``profile`` and overrides; records go to outputs/<study>/<system>.jsonl.

    A point recorded before with the same parameters is not measured again (resume) unless ``rerun``.

    Bad input (a parameter, the system, an output folder that cannot be written) raises an
    AccelKitError before any point runs.
    """
    declared = get_study(study)
    params = _params.resolve(declared.params, study, profile, overrides)
    sys_desc = load_system(system)
    # Before any point runs: an output folder that cannot take the records is one line now, not a
    # traceback after the sweep (the notebook's failed cell shows the same line).
    study_dir = writable_dir(_output_dir(output_dir) / study, f"output folder ({output_dir_origin(output_dir)})")
    run_id = results.new_run_id()
    run = declared.run or functools.partial(run_declared, declared)
    records = run(params, sys_desc, records_path=records_path(study_dir, system), run_id=run_id,
                  profile=profile, progress=progress, rerun=bool(rerun))
    return StudyRun(study, system, run_id, study_dir, records, profile=profile,
                    overrides={k: v for k, v in overrides.items() if v is not None}, output_dir=output_dir)


def run_declared(declared: Study, params: StudyParams, system: System, *, records_path: Path, run_id: str,
                 profile: str | None = None, progress: bool = True, rerun: bool = False) -> list[results.Record]:
    """The generic runner: the study's declared points (``declared.points(params, system)``, of any kind), each in
    its own process (``accel_kit.engine.sweep.run_sweep``); one record each. The records' params are each
    point's fields, beside the study's parameters that no point holds (``params.timeout_s``: each point's
    limit, default 600 s)."""
    from accel_kit.engine.sweep import run_sweep

    points = list(declared.points(params, system))
    in_points = set().union(*(type(p).model_fields for p in points)) if points else set()
    extra = params.model_dump(exclude=in_points) | {"profile": profile}
    return run_sweep(declared.name, points, records_path=records_path, run_id=run_id, extra_params=extra,
                     timeout_s=getattr(params, "timeout_s", 600), progress=progress, rerun=rerun)


def parameter_names(study: str) -> list[str]:
    """What a user may set for ``study`` (beyond system, profile and output_dir); a notebook's
    parameters cell names exactly these."""
    return get_study(study).params.parameter_names()


NOTEBOOK_NAMES = ("system", "profile", "output_dir", "rerun")
# The profile a notebook runs when nothing injected one (papermill -p profile wins); `make test` sets it.
NOTEBOOK_PROFILE_ENV = "ACCEL_KIT_NOTEBOOK_PROFILE"


def run_notebook(study: str, namespace: dict[str, object], *, progress: bool = True) -> StudyRun:
    """Run ``study`` from a notebook whose parameters cell set ``namespace`` (its globals()).

    papermill only warns about a parameter the notebook does not declare and runs on without it;
    here such a parameter is an error. It is found in the cell papermill injects (its source
    starts with "# Parameters"), read from IPython's input history.
    """
    injected = injected_parameters(study, namespace, sorted(set(NOTEBOOK_NAMES) | set(parameter_names(study))))
    overrides = {name: namespace.get(name) for name in parameter_names(study)}
    run = run_study(study, system=namespace.get("system", "cpu"), profile=notebook_profile(namespace, injected),
                    output_dir=namespace.get("output_dir"), progress=progress, rerun=bool(namespace.get("rerun")),
                    **overrides)
    # Said on the page, once: a Run All that measured nothing, and the precision auto chose.
    for line in (run.reuse_line(), run.precision_line()):
        if line:
            print(line)
    return run


def injected_parameters(notebook: str, namespace: dict[str, object], known: Sequence[str]) -> list[str]:
    """The names papermill injected into a notebook whose globals() are ``namespace``; one not in
    ``known`` is a ParameterError (papermill itself only warns and runs on without it)."""
    injected = _injected_names(namespace)
    unknown = sorted(set(injected) - set(known))
    if unknown:
        raise ParameterError(f"unknown parameter {', '.join(map(repr, unknown))} for notebook {notebook!r}; "
                             f"known: {', '.join(known)}")
    return injected


def notebook_profile(namespace: dict[str, object], injected: list[str]) -> str:
    """The profile a notebook runs: injected, else $ACCEL_KIT_NOTEBOOK_PROFILE, else its parameters cell's."""
    if "profile" not in injected and os.environ.get(NOTEBOOK_PROFILE_ENV):
        # `make test` runs the committed notebooks (nbval, which injects nothing) with the smoke profile.
        return os.environ[NOTEBOOK_PROFILE_ENV]
    return namespace.get("profile", "quick")


def _injected_names(namespace: dict[str, object]) -> list[str]:
    import ast

    names = []
    for source in namespace.get("In", []) or []:
        if not source.lstrip().startswith("# Parameters"):
            continue
        for node in ast.parse(source).body:
            if isinstance(node, ast.Assign):
                names += [t.id for t in node.targets if isinstance(t, ast.Name)]
    return names


def figures(study: str, study_dir: str | Path, save: bool = True) -> dict[str, Figure]:
    """Figures from every system's records under ``study_dir``; saved as HTML under ``study_dir/figures``."""
    from accel_kit import plots

    study_dir = Path(study_dir)
    df = results.load(study_dir) if study_dir.exists() else pd.DataFrame()
    figs = get_study(study).figures(df)
    if save:
        plots.save_html(figs, study_dir / "figures")
    return figs
