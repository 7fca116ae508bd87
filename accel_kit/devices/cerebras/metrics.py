"""What a Cerebras training point adds to its record: cstorch's own figures beside ours."""
from __future__ import annotations

from typing import TYPE_CHECKING

import cerebras.pytorch as cstorch
import torch

from accel_kit.devices._vendor import package_version
from accel_kit.devices.cerebras.options import PACKAGE
from accel_kit.json_types import JSONObject
from accel_kit.precision import spec

if TYPE_CHECKING:
    from accel_kit.timing import Timing

# AdamW's epsilon: torch's default, which every other system's step uses (cstorch's own default is 1e-6).
ADAMW_EPS = 1e-8

# The worker's host-side probes say nothing about a CS-2: the compiler lowers attention itself, and no
# eager matmul peak exists there (the adapter marks peak points unsupported).
CSX_FIELDS: JSONObject = {
    "attention_kernel_ran": None, "attention_op": None,
    "attention_kernel_reason": "the CS-2 compiler lowers attention itself; the host probe does not apply",
    "mfu_measured_reason": "no measured matmul peak on a CS-2: every computation is a compiled step",
}


def run_fields(precision: str, backend_type: str, gas_in: str) -> JSONObject:
    """The cstorch run's settings: backend, versions, mixed precision, optimizer, where GAS happens."""
    mixed = spec(precision).mixed
    return {
        "cstorch_backend": backend_type,
        "cerebras_pytorch_version": package_version(PACKAGE),
        "torch_version": torch.__version__,
        "cstorch_mixed_precision": mixed,
        "cstorch_half_dtype": cstorch.amp.get_half_dtype_str() if mixed else None,
        "optimizer": f"cstorch.optim.AdamW (eps {ADAMW_EPS:g})",
        "gas_in": gas_in,
    } | (CSX_FIELDS if backend_type == "CSX" else {})


def same_window(rate: JSONObject, timing: Timing | None) -> JSONObject:
    """``samples_per_s_same_window``: cstorch's sample count over our clock's time for the same steps.

    cstorch's rate tracker (``samples_per_s_cstorch``, read at the end of the timed steps) counts
    the samples of every step so far but starts its clock in a step closure, i.e. at the end of the
    first step (to leave compilation out): its figure includes one step's samples that its clock
    did not see. Over our clock's time for every step but the first, the two differ only by the
    clocks; ``samples_per_s`` (the median step, warm-up excluded) is what every system reports.
    """
    if timing is None or not rate:
        return {}
    seconds = sum((list(timing.warmup_times_s) + list(timing.times_s))[1:])
    return {"samples_per_s_same_window": rate["cstorch_total_samples"] / seconds if seconds else None}
