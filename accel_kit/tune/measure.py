"""Tune's measuring half: the predicted-best configurations and the system's default, measured through the sweep.

Where the system's device is here, each configuration is a training point (``make_point``, as every training
study makes its points) run by ``run_points`` into ``outputs/tune/<system>.jsonl``: a point recorded before is
resumed, not measured again. A model the system has too few single-device records of to fit its rates
(``SAME_PRESET_RECORDS``) is first measured on one device at a few batch shapes, so that the prediction rests
on its own records (the calibration, recorded like the rest). ``budget_s`` bounds all of it: each point runs
with what is left as its ``time_budget_s``, and a point predicted to take longer than what is left is not
started.
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

import pandas as pd

from accel_kit.errors import ParameterError
from accel_kit.json_types import JSONObject
from accel_kit.mesh import ParallelLayout
from accel_kit.predict.predictor import SAME_PRESET_RECORDS
from accel_kit.tune.plan import STUDY, Plan, Ranked, TuneParams, plan, resolve_params, space_for
from accel_kit.tune.rank import kendall_tau, ranks
from accel_kit.tune.space import Candidate
from accel_kit.tune.summary import COLUMNS, KIND, figure

if TYPE_CHECKING:
    import plotly.graph_objects as go

    from accel_kit.devices import PrecisionChoice
    from accel_kit.results import Record
    from accel_kit.systems import System

# The least a point takes beyond its steps: a tiny training point's whole call through the fork server, 0.14 s
# at one rank and 0.21 s as two DDP ranks on the 2-core EPYC (docs/engine.md, benchmarks/point_start.py).
POINT_START_S = 0.2
# Passes over the calibration's shapes. On a shared 2-core host the same single-device step measured 135-141 ms in
# most runs and 202-236 ms in spells of the host's slowness lasting seconds (moe-debug, micro-batch 4, one thread),
# each run steady within itself; a fit through a slow spell mis-ranked moe-debug's layouts (tau 0.39-0.48).
CALIBRATION_REPEATS = 2


@dataclass
class Row:
    """One measured configuration against its prediction."""

    label: str
    predicted: float  # tokens/s
    predicted_rank: int | None  # None: removed for memory (the default may be)
    default: bool
    status: str = "not measured"
    reason: str | None = None
    measured: float | None = None  # tokens/s
    measured_rank: int | None = None
    record_id: str | None = None

    @property
    def error(self) -> float | None:
        """(predicted - measured) / measured tokens/s."""
        return None if not self.measured else self.predicted / self.measured - 1


@dataclass
class Tuned:
    """A plan and its measurement."""

    plan: Plan
    rows: list[Row]
    records_path: Path
    tau: float = float("nan")
    compared: int = 0  # measured configurations tau is over
    notes: list[str] = field(default_factory=list)

    @property
    def chosen(self) -> Row | None:
        ok = [r for r in self.rows if r.measured]
        return max(ok, key=lambda r: r.measured) if ok else None

    @property
    def default_row(self) -> Row | None:
        return next((r for r in self.rows if r.default), None)

    def lines(self, shown: int = 10) -> list[str]:
        return self.plan.lines(shown) + measured_lines(self)

    def table(self) -> pd.DataFrame:
        """Predicted against measured, one row per configuration measured (``tune_table``)."""
        return tune_table(self)

    def figures(self) -> dict[str, go.Figure]:
        p = self.plan.params
        return {"tune_predicted_vs_measured": figure(
            self.table(), f"tune {p.preset} on {p.devices} x {self.plan.system}: measured against predicted "
                          f"(Kendall's tau {self.tau:.2f})")}


class Clock:
    """What is left of ``budget_s`` (None: no limit)."""

    def __init__(self, budget_s: float | None):
        self.budget_s, self.start = budget_s, time.monotonic()

    def left(self) -> float | None:
        return None if self.budget_s is None else self.budget_s - (time.monotonic() - self.start)


class RunArgs(TypedDict):
    """Where and how every measured point of one tune run is recorded (``run_points``' keywords)."""

    records_path: Path
    run_id: str
    profile: str | None
    progress: bool
    rerun: bool


def measure_plan(system: str, params: TuneParams, *, output_dir: str | Path | None = None,
                 profile: str | None = None, progress: bool = True, rerun: bool = False) -> Plan | Tuned:
    """``plan``, then, where the system's device is here, measure its top ``top_k`` and the default.

    Raises:
        ParameterError: a budget too small for one point (before any runs), and ``plan``'s refusals.
    """
    from accel_kit import results
    from accel_kit.paths import output_dir as _output_dir
    from accel_kit.paths import output_dir_origin, writable_dir
    from accel_kit.predict.heldout import load_records
    from accel_kit.studies import records_path as _records_path
    from accel_kit.studies.training import resolve_precision
    from accel_kit.systems import load_system

    sys_desc = load_system(system)
    if not sys_desc.device_adapter().availability():
        return plan(system, params, output_dir=output_dir)
    if params.budget_s is not None and params.budget_s < POINT_START_S:
        raise ParameterError(f"budget_s {params.budget_s:g} is too small for one point: a point's start alone "
                             f"takes about {POINT_START_S} s")
    params.check(sys_desc)  # an unknown preset: one line
    choice = resolve_precision(params, sys_desc)
    space_for(params, sys_desc, choice.precision)  # nothing left to measure: one line before anything runs
    root = _output_dir(output_dir)
    path = _records_path(writable_dir(root / STUDY, f"output folder ({output_dir_origin(output_dir)})"), system)
    sources = params.records or [str(root)]
    clock = Clock(params.budget_s)
    run: RunArgs = {"records_path": path, "run_id": results.new_run_id(), "profile": profile, "progress": progress,
           "rerun": rerun}
    records = load_records(s for s in sources if params.records or Path(s).exists())
    notes = []
    # Where ranks share the host's cores (a CPU's), the calibration runs with one rank's threads: a rank's compute
    # is then its records' stretched by its share of the cores alone, not by how well more threads scale.
    threads = sys_desc.device_adapter().threads_per_rank(params.devices)
    if _needs_calibration(records, system, params.preset, choice.precision, threads):
        # Each shape twice, the second pass after the first (another seed: another point to the sweep), so that a
        # spell of the host's slowness seldom covers both; the compute fit keeps the faster (fits.fit_compute).
        calibrated = [r for k in range(CALIBRATION_REPEATS)
                      for r in _run(params.model_copy(update={"seed": params.seed + k}), sys_desc, choice,
                                    _calibration(sys_desc.micro_batch_size), clock, run,
                                    threads_as_ranks=params.devices)]
        notes.append(f"calibration: {len(calibrated)} single-device points of {params.preset} measured first "
                     f"({', '.join(r.status for r in calibrated)})"
                     + (f" with one rank's {threads} thread(s)" if threads else "")
                     + ", so the prediction rests on its own records")
        records = load_records([*sources, str(path)])
    the_plan = plan(system, params, records, precision=choice.precision, output_dir=root)
    the_plan.notes += notes
    return _measure(the_plan, params, sys_desc, choice, clock, run)


def _needs_calibration(records: list, system: str, preset: str, precision: str, threads: int | None = None) -> bool:
    """Whether the system has fewer single-device records of ``preset`` at ``precision`` (and ``threads`` host
    threads, where given) than a fit of its own takes (the predictor then fits on other models' rates, or has
    none)."""
    from accel_kit.predict.records import host_threads, usable

    own = [r for r in records if r.system == system and usable(r) and r.params["preset"] == preset
           and r.params["precision"] == precision and r.params["devices"] == 1
           and (threads is None or host_threads(r) == threads)]
    return len(own) < SAME_PRESET_RECORDS


def _calibration(system_mb: int) -> list[Candidate]:
    """Single-device configurations whose step times separate the predictor's terms: two micro-batches (per
    token against per micro-batch work), GAS 2 (the optimizer once per step) and checkpointing (recompute)."""
    mb = max(2, system_mb)
    return [Candidate(ParallelLayout(micro_batch_size=b, gas=g), ckpt)
            for b, g, ckpt in ((1, 1, False), (mb, 1, False), (mb, 2, False), (mb, 1, True))]


def _run(params: TuneParams, system: System, choice: PrecisionChoice, candidates: list[Candidate], clock: Clock,
         run: RunArgs, threads_as_ranks: int | None = None) -> list[Record]:
    """Measure ``candidates`` one after the other (each with what is left of the budget; ``threads_as_ranks``:
    ``run_points``'); their records."""
    from accel_kit.studies.training import make_point, run_points

    out = []
    for cand in candidates:
        left = clock.left()
        if left is not None and left <= POINT_START_S:
            break
        point = make_point(params, system, choice, **cand.fields(), time_budget_s=left)
        out += run_points(STUDY, params, system, [point], **run, threads_as_ranks=threads_as_ranks)
    return out


def _selected(the_plan: Plan) -> list[tuple[Ranked, bool]]:
    """The top ``top_k`` predicted and the default (where it is not among them), each with whether it is it."""
    top = the_plan.ranked[:the_plan.params.top_k]
    default = the_plan.default
    chosen = [(r, default is not None and r.candidate == default.candidate) for r in top]
    if default is not None and not any(is_default for _, is_default in chosen):
        chosen.append((default, True))
    return chosen


def _cost_s(ranked: Ranked, params: TuneParams) -> float:
    """A point's predicted wall time: its steps (warm-up and timed) at the predicted step time, and its start."""
    return ranked.prediction.step_time_s * (params.warmup_steps + params.steps) + POINT_START_S


def _measure(the_plan: Plan, params: TuneParams, system: System, choice: PrecisionChoice, clock: Clock,
             run: RunArgs) -> Tuned:
    """The selected configurations measured, compared with their predictions, and the run's summary record
    appended beside their records (``accel_kit.tune.summary``)."""
    from accel_kit import results

    selected = _selected(the_plan)
    left = clock.left()
    if left is not None and min(_cost_s(r, params) for r, _ in selected) > left:
        cheapest = min(_cost_s(r, params) for r, _ in selected)
        raise ParameterError(f"budget_s {params.budget_s:g} is too small for one point: {left:.3g} s left, the "
                             f"cheapest selected configuration is predicted to take {cheapest:.3g} s")
    tuned = Tuned(the_plan, [], run["records_path"])
    for ranked, is_default in selected:
        row = Row(ranked.candidate.label(), ranked.tokens_per_s, the_plan.rank_of(ranked.candidate), is_default)
        tuned.rows.append(row)
        left = clock.left()
        if left is not None and _cost_s(ranked, params) > left:
            row.reason = f"predicted {_cost_s(ranked, params):.3g} s, {max(left, 0):.3g} s of the budget left"
            continue
        for rec in _run(params, system, choice, [ranked.candidate], clock, run):
            row.status, row.reason, row.record_id = rec.status, rec.reason, rec.record_id
            row.measured = rec.metrics.get("tokens_per_s") if rec.status == "ok" else None
    _compare(tuned)
    results.append_record(run["records_path"], summary_record(tuned, run["run_id"]))
    return tuned


def _compare(tuned: Tuned) -> None:
    """Measured ranks and Kendall's tau over the configurations measured ok: the ranking tune made (configurations
    predicted alike ordered by ``simplicity``; the default, where removed for memory, last) against the measured
    tokens/s."""
    ok = [r for r in tuned.rows if r.measured]
    for row, rank in zip(ok, ranks([r.measured for r in ok])):
        row.measured_rank = rank
    tuned.compared = len(ok)
    if len(ok) >= 2:
        last = len(tuned.plan.ranked) + 1
        tuned.tau = kendall_tau([-(r.predicted_rank or last) for r in ok], [r.measured for r in ok])


def row_dicts(tuned: Tuned) -> list[JSONObject]:
    """One object per configuration tune selected (``COLUMNS``), in predicted order."""
    return [{"predicted_rank": r.predicted_rank, "measured_rank": r.measured_rank, "layout": r.label,
             "default": r.default, "predicted_tokens_per_s": r.predicted, "measured_tokens_per_s": r.measured,
             "error_pct": None if r.error is None else 100 * r.error, "status": r.status, "reason": r.reason,
             "record_id": r.record_id} for r in tuned.rows]


def tune_table(tuned: Tuned) -> pd.DataFrame:
    """Predicted against measured (``row_dicts``), as a table."""
    return pd.DataFrame(row_dicts(tuned), columns=list(COLUMNS))


def summary_record(tuned: Tuned, run_id: str) -> Record:
    """The run's summary (``accel_kit.tune.summary``): ok where a configuration was measured ok, else skipped,
    saying why."""
    from accel_kit import results
    from accel_kit.systems import load_system

    plan, chosen, base = tuned.plan, tuned.chosen, tuned.default_row
    question = {"preset": plan.params.preset, "devices": plan.params.devices, "seq_len": plan.seq_len,
                "global_batch": plan.global_batch, "precision": plan.precision, "top_k": plan.params.top_k}
    key = "tune-" + hashlib.sha256(json.dumps(question, sort_keys=True).encode()).hexdigest()[:16]
    metrics: JSONObject = {
        "tune_tau": tuned.tau if tuned.compared >= 2 else None, "tune_compared": tuned.compared,
        "tune_predicted": len(plan.ranked),
        "tune_pruned": ", ".join(f"{reason} {n}" for reason, n in plan.space.pruned.most_common()),
        "tune_chosen": chosen.label if chosen else None,
        "tune_chosen_tokens_per_s": chosen.measured if chosen else None,
        "tune_default_tokens_per_s": base.measured if base else None,
        "tune_chosen_vs_default": chosen.measured / base.measured if chosen and base and base.measured else None,
        "tune_memory_margin_pct": 100 * plan.margin,
        "tune_rows": row_dicts(tuned),
    }
    reasons = "; ".join(f"{r.label}: {r.status}" + (f" ({r.reason})" if r.reason else "") for r in tuned.rows)
    return results.make_record(study=STUDY, kind=KIND, system=plan.system,
                               status="ok" if chosen else "skipped",
                               reason=None if chosen else f"no configuration was measured ok: {reasons}",
                               params={"kind": KIND, **question, "point_key": key}, run_id=run_id,
                               model=plan.params.preset, metrics=metrics,
                               env=results.environment(load_system(plan.system).device_adapter()))


def tune(system: str, params: TuneParams, *, output_dir: str | Path | None = None, profile: str | None = None,
         progress: bool = True, rerun: bool = False):
    """Plan, then (where the system's device is here) measure: a ``accel_kit.tune.measure.Tuned``, or the
    ``Plan`` alone where it is not."""
    return measure_plan(system, params, output_dir=output_dir, profile=profile, progress=progress, rerun=rerun)


def measured_lines(tuned: Tuned) -> list[str]:
    """Predicted against measured, per measured configuration, then tau, the choice and the default's figure."""
    lines = [f"measured on {tuned.plan.system} ({len(tuned.rows)} configurations; records -> {tuned.records_path}):",
             f"{'pred':>4} {'meas':>4}  {'layout':44s} {'predicted':>10} {'measured':>10} {'error':>7}  status"]
    for row in tuned.rows:
        meas = "" if row.measured is None else f"{row.measured:10.4g}"
        err = "" if row.error is None else f"{row.error:+7.1%}"
        lines.append(f"{row.predicted_rank or '-':>4} {row.measured_rank or '-':>4}  {row.label:44s} "
                     f"{row.predicted:10.4g} {meas:>10} {err:>7}  {row.status}"
                     + (" (default)" if row.default else "") + (f": {row.reason[:100]}" if row.reason else ""))
    lines.append(f"Kendall's tau, predicted against measured tokens/s: {tuned.tau:.3f} over {tuned.compared} "
                 "configurations" if tuned.compared >= 2 else "Kendall's tau: fewer than 2 configurations measured")
    if tuned.chosen is not None:
        line = f"chosen: {tuned.chosen.label}, {tuned.chosen.measured:.4g} tokens/s measured"
        base = tuned.default_row
        if base is not None and base.measured:
            line += f", {tuned.chosen.measured / base.measured:.2f}x the default's {base.measured:.4g}"
        lines.append(line)
    return lines + tuned.notes


def run_notebook(namespace: dict[str, object]) -> Plan | Tuned:
    """``tune`` from a notebook's parameters cell (its globals()); an unknown injected parameter is an error. The
    output folder's records are what it learns from and where it records, as ``accel-kit tune --output-dir``."""
    from accel_kit.studies import NOTEBOOK_NAMES, injected_parameters, notebook_profile

    names = TuneParams.parameter_names()
    injected = injected_parameters(STUDY, namespace, sorted(set(NOTEBOOK_NAMES) | set(names)))
    profile = notebook_profile(namespace, injected)
    params = resolve_params(profile, {n: namespace.get(n) for n in names})
    return tune(str(namespace.get("system", "cpu")), params, output_dir=namespace.get("output_dir"), profile=profile,
                progress=False, rerun=bool(namespace.get("rerun")))
