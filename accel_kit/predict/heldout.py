"""How wrong the predictions are: fit on part of a system's records, predict the rest.

Leave-one-out over a system's dense training records: each record is predicted from a fit
that never saw it (nor any re-run of the same point), so every other sequence length, GAS,
micro-batch or device count informs it but it does not inform itself. Errors are relative,
(predicted - measured) / measured, for the step time and the peak memory.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

import pandas as pd

from accel_kit.errors import AccelKitError
from accel_kit.predict.model import GiB, Predictor, host_threads, shape_of_record, usable


def load_records(sources: Iterable[str | Path]) -> list[dict]:
    """Every record of each source (an output folder, a .jsonl file or an archive of them, read as the
    cross-system report reads them), once per record id."""
    from accel_kit.report.records import read_source

    seen: dict[str, dict] = {}
    for source in sources:
        for rec in read_source(source):
            if isinstance(rec, dict) and "record_id" in rec:
                seen.setdefault(rec["record_id"], rec)
    return list(seen.values())


def held_out(records: list[dict], systems: Iterable[str] | None = None, *, link_root: str | None = None,
             probe: bool = True) -> pd.DataFrame:
    """One row per dense training record: measured and leave-one-out predicted step time and memory
    (``link_root``: where a probed link is kept, beside the records; ``probe``: measure a missing link here)."""
    rows = []
    wanted = set(systems) if systems else {r.get("system") for r in records if usable(r)}
    for system in sorted(s for s in wanted if s):
        predictor = Predictor(system, records, link_root=link_root, probe=probe)
        for rec in predictor.train:
            key = rec["params"].get("point_key")
            same_point = {r["record_id"] for r in predictor.train if key and r["params"].get("point_key") == key}
            row = {"system": system, "study": rec.get("study"), "record_id": rec["record_id"],
                   "devices": rec["params"]["devices"], "seq_len": rec["params"]["seq_len"],
                   "micro_batch_size": rec["params"]["micro_batch_size"], "gas": rec["params"]["gas"],
                   "precision": rec["params"]["precision"],
                   "measured_step_s": rec["metrics"]["step_time_s"],
                   "measured_mem_gib": rec["metrics"].get("mem_peak_gib")}
            try:
                pred = predictor.predict(shape_of_record(rec), exclude={rec["record_id"]} | same_point,
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
    """Per system and study: records predicted, mean and maximum |relative error| of step time and memory."""
    if df.empty:
        return pd.DataFrame()
    out = []
    for (system, study), g in df.groupby(["system", "study"]):
        ok = g.dropna(subset=["predicted_step_s"])
        mem = ok.dropna(subset=["mem_error"])
        out.append({"system": system, "study": study, "records": len(g), "predicted": len(ok),
                    "step_mean_abs_error": ok["step_error"].abs().mean() if len(ok) else None,
                    "step_max_abs_error": ok["step_error"].abs().max() if len(ok) else None,
                    "mem_mean_abs_error": mem["mem_error"].abs().mean() if len(mem) else None,
                    "mem_max_abs_error": mem["mem_error"].abs().max() if len(mem) else None})
    total = df.dropna(subset=["predicted_step_s"])
    mem = total.dropna(subset=["mem_error"])
    out.append({"system": "all", "study": "all", "records": len(df), "predicted": len(total),
                "step_mean_abs_error": total["step_error"].abs().mean() if len(total) else None,
                "step_max_abs_error": total["step_error"].abs().max() if len(total) else None,
                "mem_mean_abs_error": mem["mem_error"].abs().mean() if len(mem) else None,
                "mem_max_abs_error": mem["mem_error"].abs().max() if len(mem) else None})
    return pd.DataFrame(out)


__all__ = ["GiB", "error_summary", "held_out", "load_records"]
