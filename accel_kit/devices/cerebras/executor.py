"""cstorch's ``DataExecutor`` driven one step at a time.

A step's closures run when the executor is asked for the next batch, so each ``step(fn)`` runs
``fn`` on the held batch, then advances the executor (which runs the closures: the step's value
is known) and holds the next batch for the following call.
"""
from __future__ import annotations

import cerebras.pytorch as cstorch

from accel_kit.json_types import JSONObject


class StepExecutor:
    """A DataExecutor driven one step at a time: ``step(fn)`` runs ``fn(batch)``, hands its output to
    ``record`` (a ``cstorch.step_closure``), and ends the step, which runs the closures."""

    def __init__(self, dataloader, num_steps: int, record):
        self.record = record
        self.executor = cstorch.utils.data.DataExecutor(dataloader, num_steps=num_steps, checkpoint_steps=0)
        self._it = iter(self.executor)
        self._batch = next(self._it)  # starts the run: the model to the device, sparsity masks initialised

    def step(self, fn) -> None:
        if self._batch is None:
            raise RuntimeError("the cstorch executor has run all its steps")
        out = fn(self._batch)
        self.record(out)
        self._batch = next(self._it, None)  # the step's end: its closures run (record has its value)

    def rate_tracker(self) -> JSONObject:
        """cstorch's own throughput: the executor profiler's rate tracker, now."""
        tracker = self.executor.profiler.rate_tracker
        return {"samples_per_s_cstorch": tracker.global_rate, "samples_per_s_cstorch_smoothed": tracker.rate,
                "cstorch_total_samples": tracker.total_samples, "cstorch_elapsed_s": tracker.total_time,
                "cstorch_flops_utilization_pct": tracker.flops_utilization}
