"""The three fits of the predictor, each on one group of comparable records (``records.group_key``):

* ``fit_compute``: seconds per unit of each work term, from single-device step times;
* ``fit_exposure``: the fraction of the modelled communication that shows in multi-device step times;
* ``fit_memory``: multiples of each memory term, from the measured peaks.

Compute and memory go through the generic solver (``accel_kit.predict.nnls``); the model they
fit is explained in ``accel_kit.predict.predictor``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from accel_kit.predict.nnls import nnls_relative
from accel_kit.predict.records import group_key, shape_of_record
from accel_kit.predict.shape import GiB, TERMS, StepShape
from accel_kit.results import Record

# A term is kept only if it lowers the fit's relative RMS error by more than this fraction: with a
# handful of records per system, terms that are collinear for one model (every per-token term is
# proportional to tokens) would otherwise take arbitrary shares and extrapolate badly.
TERM_PENALTY = 0.03
MIN_FIT_RECORDS = 1  # with one record, one rate: enough for the same shape on more devices


@dataclass
class ComputeFit:
    """Fitted seconds per unit of each work term for one (system, precision, threads) group."""

    system: str
    precision: str
    threads: int | None
    rates: np.ndarray
    fit_rms: float
    record_ids: list[str]
    basis: str

    def compute_s(self, shape: StepShape) -> float:
        return float(shape.work() @ self.rates)

    def terms_s(self, shape: StepShape) -> dict[str, float]:
        return {t: float(w * r) for t, w, r in zip(TERMS, shape.work(), self.rates) if r > 0}


def _single_rank_time(record: Record) -> float:
    return float(record.metrics["step_time_s"])


def shape_key(record: Record) -> tuple[str, tuple[float, ...]]:
    """What makes two records repeats of one measurement: the same step shape, and so the same work of each term
    (the second item). The shape stands as its repr, which names every field its equality compares: a StepShape
    is not hashable (its layout is a mutable pydantic model)."""
    shape = shape_of_record(record)
    return repr(shape), tuple(shape.work())


def fastest_per_shape(records: list[Record]) -> dict[tuple, Record]:
    """One record per measured shape (``shape_key``): the fastest. Repeats of one shape differ by what else the
    host did meanwhile, which only ever slows a step, so the fastest is the least disturbed (timeit's rule); a
    fit through a slow repeat carries the disturbance into every prediction made from it."""
    best: dict[tuple, Record] = {}
    for r in records:
        key = shape_key(r)
        if key not in best or _single_rank_time(r) < _single_rank_time(best[key]):
            best[key] = r
    return best


def fit_compute(records: list[Record]) -> ComputeFit:
    """Fit the compute rates from single-rank training records of one group (the fastest of repeated shapes)."""
    best = fastest_per_shape([r for r in records if r.params["devices"] == 1])
    one = list(best.values())
    if len(one) < MIN_FIT_RECORDS:
        raise ValueError(f"{len(one)} single-device records; the fit needs at least {MIN_FIT_RECORDS}")
    work = np.array([key[1] for key in best], dtype=float)  # (the shapes' work: the keys carry it)
    times = np.array([_single_rank_time(r) for r in one])
    rates, rms = nnls_relative(work, times, penalty=TERM_PENALTY)
    system, precision, threads = group_key(one[0])
    return ComputeFit(system, precision, threads, rates, rms, [r.record_id for r in one],
                      f"fitted on {len(one)} single-device training record{'s' if len(one) > 1 else ''} of {system} ({precision}"
                      + (f", {threads} host threads per rank" if threads else "") + ")")


def exposure_class(shape: StepShape) -> str:
    """Which overlap a shape's data-parallel traffic has, so that each is fitted on its own records: DDP's
    bucketed all-reduce (and ZeRO-1's reduce-scatter) overlap the backward; FSDP prefetches its gathers;
    with tp, pp or ep above 1 the engine all-reduces the gradients after the step's backward
    (``accel_kit.engine.parallel``), which overlaps nothing."""
    if shape.layout.engine == "fsdp":
        return "fsdp"
    lay = shape.layout
    return "after backward" if lay.tp * lay.pp * lay.ep > 1 else "overlapped"


def fit_exposure(records: list[Record], compute: ComputeFit, comm_of: Callable[[StepShape], tuple[float, float]],
                 kind: str) -> tuple[float, str]:
    """The fraction of the modelled data-parallel communication that shows in the step time, from the
    multi-rank records whose traffic overlaps as ``kind`` (``exposure_class``). ``comm_of``: a shape's
    modelled (data-parallel, tensor- and expert-parallel) seconds; the tensor-parallel all-reduces, the
    expert-parallel all-to-alls and a pipeline's bubble are taken off the measured step first (they are
    modelled as exposed, ``Predictor.predict``)."""
    ratios = []
    for r in records:
        shape = shape_of_record(r)
        if shape.layout.devices < 2 or exposure_class(shape) != kind:
            continue
        dp_s, layer_s = comm_of(shape)
        if dp_s > 0:
            stage_s = (compute.compute_s(shape) + layer_s) / (1 - shape.bubble_fraction)
            ratios.append(max(0.0, (_single_rank_time(r) - stage_s) / dp_s))
    if not ratios:
        return 1.0, (f"exposed communication: all of it (no multi-device records whose data-parallel traffic "
                     f"overlaps as this one's, {kind}, to fit the overlap; assumed, conservative)")
    value = float(np.median(ratios))
    return value, (f"exposed communication: {value:.2f} of the modelled data-parallel time (median over "
                   f"{len(ratios)} multi-device records, {kind})")


@dataclass
class MemoryFit:
    """Fitted multiples of each of ``MEMORY_TERMS`` (the estimate alone where no peak was measured)."""

    coefs: np.ndarray
    fit_rms: float
    records: int

    def bytes(self, shape: StepShape) -> float:
        return float(shape.memory_work() @ self.coefs)

    def describe(self) -> str:
        if not self.records:
            return "memory: the estimate alone (no measured peaks to fit the runtime's baseline)"
        base, scale, accum = self.coefs
        parts = [f"{base / GiB:.2f} GiB runtime baseline"] if base else []
        parts.append(f"{scale:.2f} x the estimate")
        if accum:
            parts.append(f"{accum:.2f} x a micro-batch's activations and logits where GAS > 1")
        return (f"memory: {' + '.join(parts)} (fitted on the measured peaks of {self.records} records; relative "
                f"RMS error {self.fit_rms:.1%})")


def fit_memory(records: list[Record]) -> MemoryFit:
    """The memory terms fitted on the records with a measured peak; the estimate alone without any."""
    measured = [r for r in records if r.metrics.get("mem_peak_gib")]
    if not measured:
        return MemoryFit(np.array([0.0, 1.0, 0.0]), float("nan"), 0)
    work = np.stack([shape_of_record(r).memory_work() for r in measured])
    peaks = np.array([r.metrics["mem_peak_gib"] * GiB for r in measured])
    try:
        coefs, rms = nnls_relative(work, peaks, penalty=TERM_PENALTY)
    except ValueError:
        return MemoryFit(np.array([0.0, 1.0, 0.0]), float("nan"), 0)
    return MemoryFit(coefs, rms, len(measured))
