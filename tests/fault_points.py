"""A point kind that fails on purpose, for the sweep runner's isolation tests (run in worker processes)."""
from __future__ import annotations

import os
import signal
import time
from typing import Literal

from accel_kit.engine.kinds import register_kind
from accel_kit.engine.point import Point
from accel_kit.engine.result import Result


class FaultPoint(Point):
    """Does what ``fault`` says in the worker: succeed, run out of memory, raise, hang or crash."""

    kind: str = "fault_points:FaultPoint"
    fault: Literal["ok", "oom", "error", "hang", "segfault"]

    def label(self) -> str:
        return self.fault

    def measure(self, ctx) -> Result:
        import torch

        if self.fault == "oom":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        if self.fault == "error":
            def deep_inside():
                raise RuntimeError("kernel exploded")
            deep_inside()
        if self.fault == "hang":
            time.sleep(3600)
        if self.fault == "segfault":
            os.kill(os.getpid(), signal.SIGSEGV)
        return Result(status="ok", metrics={"tflops": 1.0}, times_s=[0.1])


# A kind of its own, registered where it is defined (a "module:Name" kind: the worker imports this module).
register_kind("fault_points:FaultPoint", FaultPoint, lambda point, ctx: point.measure(ctx))
