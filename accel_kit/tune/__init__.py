"""``accel-kit tune``: the fastest layout that fits a model on N devices of a system, predicted, then measured.

    from accel_kit import tune
    run = tune.tune("cpu", tune.resolve_params("smoke", {"preset": "llama3-debug", "devices": 4}))
    print("\\n".join(run.lines()))

1. Every configuration (``accel_kit.tune.space``: engine x tp x pp x cp x ep, micro-batch and GAS for the global
   batch, activation checkpointing off and on) that the layout's and the model's checks let through;
2. predicted with the what-if predictor (``accel_kit.predict.Predictor``: the system's records, probes and
   datasheet), those whose predicted memory, grown by the memory model's held-out error, exceeds the device's
   usable memory removed (``memory``), the rest ranked by tokens/s;
3. where the system's device is here, the top ``top_k`` and the system's default layout measured through the
   sweep (``accel_kit.tune.measure``: records in ``outputs/tune/<system>.jsonl``, resumed, within ``budget_s``),
   the two rankings compared (Kendall's tau) and the fastest measured chosen; elsewhere it stops after the
   prediction, marked as one.
"""
from __future__ import annotations

from accel_kit.tune.measure import Tuned, run_notebook, tune
from accel_kit.tune.plan import STUDY, USABLE_FRACTION, Candidate, Plan, Ranked, TuneParams, plan, resolve_params

__all__ = ["Candidate", "Plan", "Ranked", "STUDY", "TuneParams", "Tuned", "USABLE_FRACTION", "plan", "resolve_params",
           "run_notebook", "tune"]
