"""The inference predictor: a system's own offline-generation records in, TTFT and TPOT of a generation not run out.

Each time is a sum of terms, a count of work times a rate fitted by non-negative least squares on relative error
(``accel_kit.predict.nnls``, the training fits' solver and ``TERM_PENALTY``) over the system's ``generate`` records
of one group (``records.group_key``: same system, precision and host threads):

| time | term | work | what it stands for |
|---|---|---|---|
| TTFT (the prefill) | ``prefill_flops`` | ``Family.prefill_flops`` of the batch's prompts | the matrix units |
| | ``prefill_launches`` | the model's layers | per-kernel overhead (launches are not recorded: one forward's kernels grow with its layers) |
| | ``constant`` | 1 | the first token's sampling, the host's per-call cost |
| TPOT (one decode step) | ``decode_bytes`` | bytes a step reads (weights once, the KV cache at its length), the record's ``decode_bytes`` over its ``output_len - 1`` steps | memory bandwidth, what bounds a decode |
| | ``decode_flops`` | a step's FLOPs (``decode_flops`` over the steps) | the matrix units, where a large batch makes the step compute-bound |
| | ``decode_launches`` | the model's layers | per-kernel overhead, which bounds a tiny model's step |

The counts of a generation not run come from the family (``generate_measure.generation_work``), the same function
the ``generate`` kind records them with. The held-out error is measured as for training (``heldout.held_out``):
leave-one-out per point key, each point predicted from a fit that never saw any of its runs, against the median of
its runs.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

import numpy as np
import pandas as pd

from accel_kit.json_types import JSONObject
from accel_kit.predict.fits import MIN_FIT_RECORDS, TERM_PENALTY
from accel_kit.predict.nnls import nnls_relative
from accel_kit.predict.records import group_key, host_threads, known_preset
from accel_kit.results import Record

TTFT_TERMS = ("prefill_flops", "prefill_launches", "constant")
TPOT_TERMS = ("decode_bytes", "decode_flops", "decode_launches")
KIND = "generate"  # the records learnt from (accel_kit.engine.generate_measure)


@dataclass(frozen=True)
class GenerationShape:
    """What one greedy generation computes: the prefill's FLOPs, and per decode step (the mean over its steps)
    the bytes read and the FLOPs."""

    preset: str
    precision: str
    batch_size: int
    input_len: int
    output_len: int
    n_layers: int
    prefill_flops: float
    decode_bytes_per_step: float | None  # None: output_len 1, no decode step
    decode_flops_per_step: float | None

    def ttft_work(self) -> np.ndarray:
        """The work of each of ``TTFT_TERMS``."""
        return np.array([self.prefill_flops, self.n_layers, 1.0], dtype=float)

    def tpot_work(self) -> np.ndarray | None:
        """The work of each of ``TPOT_TERMS`` per decode step; None without a decode step."""
        if self.decode_bytes_per_step is None:
            return None
        return np.array([self.decode_bytes_per_step, self.decode_flops_per_step, self.n_layers], dtype=float)


def generation_shape(preset: str, *, batch_size: int, input_len: int, output_len: int,
                     precision: str) -> GenerationShape:
    """The counts of a generation of ``preset`` (run or not), from its family."""
    from accel_kit.engine.generate_measure import generation_work
    from accel_kit.models import family_of, get_config
    from accel_kit.precision import spec

    cfg = get_config(preset, seq_len=input_len + output_len)  # as the generate kind builds it
    family = family_of(cfg)
    prefill, flops, read = generation_work(family, cfg, batch_size, input_len, output_len,
                                           spec(precision).dtype.itemsize)
    return _shape(preset, precision, batch_size, input_len, output_len, family.shape(cfg).n_layers, prefill, flops,
                  read)


def _shape(preset, precision, b, t, n, n_layers, prefill, flops, read) -> GenerationShape:
    steps = n - 1  # the first new token comes with the prefill
    return GenerationShape(preset, precision, b, t, n, int(n_layers), float(prefill),
                           read / steps if steps else None, flops / steps if steps else None)


def shape_of_record(record: Record) -> GenerationShape:
    """The counts a ``generate`` record kept (its metrics say what it measured)."""
    p, m = record.params, record.metrics
    return _shape(p["preset"], p["precision"], p["batch_size"], p["input_len"], p["output_len"], m["n_layers"],
                  m["prefill_flops"], m["decode_flops"], m["decode_bytes"])


def usable(record: Record) -> bool:
    """An ok generate record with a TTFT and its counts, of a model known here."""
    p, m = record.params, record.metrics
    return bool(record.status == "ok" and (record.kind or p.get("kind")) == KIND and m.get("ttft_s")
                and all(m.get(k) is not None for k in ("prefill_flops", "decode_flops", "decode_bytes", "n_layers"))
                and known_preset(p.get("preset", "")))


@dataclass
class InferenceFit:
    """Seconds per unit of each TTFT and TPOT term for one (system, precision, threads) group."""

    ttft_rates: np.ndarray
    ttft_rms: float
    tpot_rates: np.ndarray | None  # None: no record of the group had a decode step
    tpot_rms: float
    records: int

    def ttft_s(self, shape: GenerationShape) -> float:
        return float(shape.ttft_work() @ self.ttft_rates)

    def tpot_s(self, shape: GenerationShape) -> float | None:
        work = shape.tpot_work()
        return None if work is None or self.tpot_rates is None else float(work @ self.tpot_rates)


def fit_inference(records: list[Record]) -> InferenceFit:
    """TTFT and TPOT rates fitted on ``records`` (usable ones of one group). Raises ValueError with too few
    records, or where no non-negative fit exists."""
    if len(records) < MIN_FIT_RECORDS:
        raise ValueError(f"{len(records)} generate records; the fit needs at least {MIN_FIT_RECORDS}")
    shapes = [shape_of_record(r) for r in records]
    ttft = np.array([r.metrics["ttft_s"] for r in records], dtype=float)
    ttft_rates, ttft_rms = nnls_relative(np.stack([s.ttft_work() for s in shapes]), ttft, penalty=TERM_PENALTY)
    decoding = [(s.tpot_work(), r.metrics["tpot_s"]) for s, r in zip(shapes, records)
                if s.tpot_work() is not None and r.metrics.get("tpot_s")]
    tpot_rates, tpot_rms = None, float("nan")
    if decoding:
        tpot_rates, tpot_rms = nnls_relative(np.stack([w for w, _ in decoding]),
                                             np.array([t for _, t in decoding], dtype=float), penalty=TERM_PENALTY)
    return InferenceFit(ttft_rates, ttft_rms, tpot_rates, tpot_rms, len(records))


@dataclass
class InferencePrediction:
    """A predicted generation: TTFT, TPOT and what they rest on."""

    system: str
    shape: GenerationShape
    ttft_s: float
    tpot_s: float | None
    basis: str
    inputs: list[str] = field(default_factory=list)

    @property
    def output_tokens_per_s(self) -> float | None:
        """The batch's output tokens over the whole generation: prefill, then ``output_len - 1`` steps."""
        if self.tpot_s is None and self.shape.output_len > 1:
            return None
        s = self.shape
        return s.batch_size * s.output_len / (self.ttft_s + (s.output_len - 1) * (self.tpot_s or 0.0))

    def row(self) -> JSONObject:
        s = self.shape
        return {"system": self.system, "preset": s.preset, "precision": s.precision, "batch_size": s.batch_size,
                "input_len": s.input_len, "output_len": s.output_len, "ttft_s": self.ttft_s, "tpot_s": self.tpot_s,
                "output_tokens_per_s": self.output_tokens_per_s, "basis": self.basis}


class InferencePredictor:
    """TTFT and TPOT predictions for one system from its generate records (those of other systems are ignored)."""

    def __init__(self, system: str, records: Iterable[Record]):
        self.system = system
        self.records = [r for r in records if r.system == system and usable(r)]

    def groups(self) -> dict[tuple, list[Record]]:
        out: dict[tuple, list[Record]] = {}
        for r in self.records:
            out.setdefault(group_key(r), []).append(r)
        return out

    def precisions(self) -> list[str]:
        """The precisions of the records, the most common first (what a prediction defaults to)."""
        return list(pd.Series([r.params["precision"] for r in self.records], dtype=object).value_counts().index)

    def predict(self, shape: GenerationShape, *, exclude: set[str] = frozenset(),
                threads: int | None = None) -> InferencePrediction:
        """Predict ``shape`` from the records of its precision (and ``threads`` host threads, where given; the
        largest such group), never those whose ids are in ``exclude``. Raises ValueError without any."""
        groups = [[r for r in g if r.record_id not in exclude] for (_, precision, t), g in self.groups().items()
                  if precision == shape.precision and (threads is None or t == threads)]
        group = max(groups, key=len, default=[])
        if len(group) < MIN_FIT_RECORDS:
            raise ValueError(f"no other ok {shape.precision} generate records of {self.system}"
                             + (f" at {threads} host thread(s)" if threads is not None else "")
                             + " to fit TTFT and TPOT on (run the inference study there)")
        fit = fit_inference(group)
        presets = sorted({r.params["preset"] for r in group})
        inputs = [f"fitted on {fit.records} generate record(s) of {self.system} ({shape.precision}; "
                  f"{', '.join(presets)}); relative RMS error of the fit: TTFT {fit.ttft_rms:.1%}, TPOT "
                  + ("n/a (no decode step in the records)" if fit.tpot_rates is None else f"{fit.tpot_rms:.1%}"),
                  "TTFT: " + _terms(TTFT_TERMS, fit.ttft_rates)]
        if fit.tpot_rates is not None:
            inputs.append("TPOT: " + _terms(TPOT_TERMS, fit.tpot_rates))
        return InferencePrediction(self.system, shape, fit.ttft_s(shape), fit.tpot_s(shape), "records", inputs)


def _terms(names: tuple[str, ...], rates: np.ndarray) -> str:
    kept = [f"{r:.3g} s per unit of {n}" for n, r in zip(names, rates) if r > 0]
    return ", ".join(kept) or "no term kept"


def held_out(records: list[Record], systems: Iterable[str] | None = None) -> pd.DataFrame:
    """One row per generate point of each system: measured TTFT and TPOT (the medians of its runs) and the
    leave-one-out predictions, with their relative errors."""
    from accel_kit import results

    rows = []
    wanted = set(systems) if systems else {r.system for r in records if usable(r)}
    for system in sorted(s for s in wanted if s):
        predictor = InferencePredictor(system, records)
        points: dict[tuple, list[Record]] = {}
        for rec in predictor.records:
            points.setdefault((rec.study, results.point_key_of(rec)), []).append(rec)
        for runs in points.values():
            runs.sort(key=lambda r: r.timestamp or "", reverse=True)  # the latest first
            rec, shape = runs[0], shape_of_record(runs[0])
            tpots = [r.metrics["tpot_s"] for r in runs if r.metrics.get("tpot_s")]
            row = {"system": system, "study": rec.study, "record_id": rec.record_id, "runs": len(runs),
                   **{k: v for k, v in shape.__dict__.items() if k in ("preset", "precision", "batch_size",
                                                                       "input_len", "output_len")},
                   "measured_ttft_s": float(np.median([r.metrics["ttft_s"] for r in runs])),
                   "measured_tpot_s": float(np.median(tpots)) if tpots else None}
            try:
                pred = predictor.predict(shape, exclude={r.record_id for r in runs}, threads=host_threads(rec))
            except ValueError as exc:
                rows.append(row | {"predicted_ttft_s": None, "predicted_tpot_s": None, "why_not": str(exc)})
                continue
            rows.append(row | {"predicted_ttft_s": pred.ttft_s, "predicted_tpot_s": pred.tpot_s, "why_not": None})
    df = pd.DataFrame(rows)
    if df.empty:
        return df
    for what in ("ttft", "tpot"):
        measured = pd.to_numeric(df[f"measured_{what}_s"], errors="coerce")
        df[f"{what}_error"] = (pd.to_numeric(df[f"predicted_{what}_s"], errors="coerce") - measured) / measured
    return df


def error_summary(df: pd.DataFrame) -> pd.DataFrame:
    """Per system, then over all: points, points predicted, mean and maximum |relative error| of TTFT and TPOT."""
    if df.empty:
        return pd.DataFrame()

    def summary(g: pd.DataFrame, system: str) -> dict:
        out = {"system": system, "points": len(g), "predicted": int(g["predicted_ttft_s"].notna().sum())}
        for what in ("ttft", "tpot"):
            errors = g[f"{what}_error"].dropna().abs()
            out[f"{what}_mean_abs_error"] = errors.mean() if len(errors) else None
            out[f"{what}_max_abs_error"] = errors.max() if len(errors) else None
        return out

    return pd.DataFrame([summary(g, s) for s, g in df.groupby("system")] + [summary(df, "all")])


__all__ = ["GenerationShape", "InferenceFit", "InferencePrediction", "InferencePredictor", "TPOT_TERMS",
           "TTFT_TERMS", "error_summary", "fit_inference", "generation_shape", "held_out", "shape_of_record",
           "usable"]
