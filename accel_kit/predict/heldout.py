"""How wrong the predictions are: fit on part of a system's records, predict the rest.

Leave-one-out over a system's dense training points: each point is predicted from a fit that
never saw it (none of its runs), so every other sequence length, GAS, micro-batch or device
count informs it but it does not inform itself. A point measured in several runs is compared
by the median of its runs: on a shared machine one run's step time drifts by 10-20 % with the
neighbours' load, and the median of a few runs is the better measurement to be judged against.
Errors are relative, (predicted - measured) / measured, for the step time and the peak memory.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

import numpy as np
import pandas as pd

from accel_kit import results
from accel_kit.errors import AccelKitError
from accel_kit.predict.fits import shape_key
from accel_kit.predict.predictor import Predictor
from accel_kit.predict.records import host_threads, shape_of_record, usable
from accel_kit.predict.shape import GiB
from accel_kit.mesh import LAYOUT_DEFAULTS
from accel_kit.results import Record


def load_records(sources: Iterable[str | Path]) -> list[Record]:
    """Every record of each source (an output folder, a .jsonl file or an archive of them,
    ``results.read_source``), once per record id."""
    seen: dict[str, Record] = {}
    for source in sources:
        for rec in results.read_source(source):
            seen.setdefault(rec.record_id, rec)
    return list(seen.values())


def held_out(records: list[Record], systems: Iterable[str] | None = None, *, link_root: str | None = None,
             probe: bool = True) -> pd.DataFrame:
    """One row per dense training point: measured (the median of its runs) and leave-one-out predicted
    step time and memory (``link_root``: where a probed link is kept, beside the records; ``probe``: measure a missing link here)."""
    rows = []
    wanted = set(systems) if systems else {r.system for r in records if usable(r)}
    for system in sorted(s for s in wanted if s):
        predictor = Predictor(system, records, link_root=link_root, probe=probe)
        # A point is predicted with its own nodes' share of devices (a job's -p devices_per_node).
        by_node = {None: predictor}
        points: dict[tuple, list[Record]] = {}
        for rec in predictor.train:
            # A point is its key (results.point_key_of) within its study (two studies can run the same shape).
            points.setdefault((rec.study, results.point_key_of(rec)), []).append(rec)
        # Held out with its point's other runs and every repeat of its shape under another key (tune's calibration
        # measures each shape twice, with two seeds): the fit keeps the fastest repeat of a shape
        # (fits.fastest_per_shape), so a repeat left in would predict its twin.
        keys = {r.record_id: shape_key(r) for r in predictor.train}
        repeats: dict[tuple, set[str]] = {}
        for record_id, key in keys.items():
            repeats.setdefault(key, set()).add(record_id)
        for runs in points.values():
            runs.sort(key=lambda r: r.timestamp or "", reverse=True)  # the latest first
            rec = runs[0]
            steps = np.array([r.metrics["step_time_s"] for r in runs], dtype=float)
            mems = [r.metrics["mem_peak_gib"] for r in runs if r.metrics.get("mem_peak_gib")]
            row = {"system": system, "study": rec.study, "record_id": rec.record_id,
                   "runs": len(runs), "devices": rec.params["devices"],
                   # its layout (each point is predicted with its own, records.shape_of_record)
                   **{k: rec.params.get(k, default) for k, default in LAYOUT_DEFAULTS.items()},
                   "seq_len": rec.params["seq_len"],
                   "micro_batch_size": rec.params["micro_batch_size"], "gas": rec.params["gas"],
                   "precision": rec.params["precision"],
                   "measured_step_s": float(np.median(steps)),
                   "measured_mem_gib": float(np.median(mems)) if mems else None,
                   # the farthest run from the median: the measurement's own noise, beside the prediction's
                   "run_spread": float(np.abs(steps / np.median(steps) - 1).max()) if len(runs) > 1 else None}
            try:
                per_node = rec.params.get("devices_per_node")
                if per_node not in by_node:
                    by_node[per_node] = Predictor(system, records, link_root=link_root, probe=probe,
                                                  devices_per_node=per_node)
                pred = by_node[per_node].predict(shape_of_record(rec),
                                                 exclude={r.record_id for r in runs} | repeats[keys[rec.record_id]],
                                                 threads=host_threads(rec))
            except (AccelKitError, ValueError) as exc:
                rows.append(row | {"predicted_step_s": None, "predicted_mem_gib": None, "basis": None,
                                   "why_not": str(exc)})
                continue
            if pred.basis != "records":
                rows.append(row | {"predicted_step_s": None, "predicted_mem_gib": None, "basis": pred.basis,
                                   "why_not": "too few other records of its kind to fit (would use "
                                              f"{pred.basis} rates)"})
                continue
            rows.append(row | {"predicted_step_s": pred.step_time_s, "predicted_mem_gib": pred.memory_per_device_gib,
                               "basis": pred.basis, "why_not": None})
    df = pd.DataFrame(rows)
    if df.empty:
        return df
    df["step_error"] = (df["predicted_step_s"] - df["measured_step_s"]) / df["measured_step_s"]
    df["mem_error"] = (df["predicted_mem_gib"] - df["measured_mem_gib"]) / df["measured_mem_gib"]
    return df


def error_summary(df: pd.DataFrame) -> pd.DataFrame:
    """Per system and study, then over all: points predicted, mean and maximum |relative error| of step
    time and memory, and the runs' own spread (the noise a prediction cannot beat, where points ran twice)."""
    if df.empty:
        return pd.DataFrame()

    def summary(g: pd.DataFrame, system: str, study: str) -> dict:
        ok = g.dropna(subset=["predicted_step_s"])
        mem = ok.dropna(subset=["mem_error"])
        spread = g["run_spread"].dropna() if "run_spread" in g else pd.Series(dtype=float)
        return {"system": system, "study": study, "points": len(g), "predicted": len(ok),
                "step_mean_abs_error": ok["step_error"].abs().mean() if len(ok) else None,
                "step_max_abs_error": ok["step_error"].abs().max() if len(ok) else None,
                "mem_mean_abs_error": mem["mem_error"].abs().mean() if len(mem) else None,
                "mem_max_abs_error": mem["mem_error"].abs().max() if len(mem) else None,
                "run_spread_mean": spread.mean() if len(spread) else None}

    out = [summary(g, system, study) for (system, study), g in df.groupby(["system", "study"])]
    out.append(summary(df, "all", "all"))
    return pd.DataFrame(out)


__all__ = ["GiB", "error_summary", "held_out", "load_records"]
