"""A point's result: what a kind's measurement, the worker and the sweep runner pass along, typed.

Every kind's measurement returns a ``Result``; the worker writes it as the point's result file
(its ``model_dump()`` as JSON) and the sweep runner reads it back (``from_json``) and builds the point's record
from its fields, in one place (``accel_kit.engine.sweep``). The record's JSON shape is
``accel_kit.results``'; this is the engine's side of it.

It also holds the one test of whether a failure was the device running out of memory
(``is_oom``), which both the worker (an exception) and the runner (a worker's dying words) ask.
"""
from __future__ import annotations

import json

from pydantic import BaseModel, ConfigDict, Field

from accel_kit.json_types import JSONObject, JSONValue
from accel_kit.results import Status


class Result(BaseModel):
    """One point's outcome: a status (with the reason for any other than ok), its metrics (names
    declared in ``accel_kit.metrics``, with their units), its timed calls, and its provenance."""

    model_config = ConfigDict(extra="forbid")

    status: Status
    reason: str | None = None
    metrics: JSONObject = Field(default_factory=dict)
    times_s: list[float] = Field(default_factory=list)
    warmup_times_s: list[float] = Field(default_factory=list)
    env: JSONObject = Field(default_factory=dict)  # accel_kit.results.environment(), the point's start
    model: str | None = None  # what ran, as a record names it (a preset, a block's shape)
    traceback: str | None = None  # a failure's full story (a worker's traceback or its output's tail)
    summary: str | None = None  # one line for the progress bar ("1234 tok/s")
    # A kind's own output that is no record metric (the peak kind's ``MeasuredPeak``).
    payload: JSONObject | None = None

    @classmethod
    def from_json(cls, text: str) -> "Result":
        """The result a worker wrote (``accel_kit.atomic.write_json_atomic`` of ``model_dump()``: NaN kept)."""
        return cls.model_validate(json.loads(text))

    # Read by field name too: a result reads as the JSON file it is written to (the tests' and notebooks' way).
    def __getitem__(self, name: str) -> JSONValue:
        if name not in type(self).model_fields:
            raise KeyError(name)
        return getattr(self, name)

    def get(self, name: str, default: JSONValue = None) -> JSONValue:
        value = getattr(self, name, None) if name in type(self).model_fields else None
        return default if value is None else value


def failed(status: Status, reason: str, **fields: JSONValue) -> Result:
    """A result that measured nothing (out of memory, an error, unsupported, skipped), with why."""
    return Result(status=status, reason=reason, **fields)


def is_oom_text(text: str) -> bool:
    """Whether ``text`` (an exception's message, a dead worker's last lines) says memory ran out: torch's
    "out of memory" (CUDA, ROCm, the vendors') or the C allocator's "can't allocate memory" (a CPU cap)."""
    return "can't allocate memory" in text or "out of memory" in text.lower()


def is_oom(exc: BaseException) -> bool:
    """Whether the exception is the device (or the process's memory cap) running out of memory."""
    import torch

    return isinstance(exc, torch.OutOfMemoryError) or is_oom_text(str(exc))
