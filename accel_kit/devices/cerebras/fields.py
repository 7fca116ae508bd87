"""The record metrics a Cerebras training point adds beside every system's (``accel_kit.metrics``):
cstorch's settings and its rate tracker. Declared here, without importing cerebras-pytorch, so the
schema knows them wherever the adapter is imported (the worker, the report, the tests).
"""
from __future__ import annotations

from accel_kit.metrics import Metric, declare


CEREBRAS_METRICS = (
    Metric("cstorch_backend", "text", "cerebras-pytorch backend (CPU, CSX)"),
    Metric("cerebras_pytorch_version", "text", "the cerebras-pytorch release"),
    Metric("torch_version", "text", "the torch the vendor runtime ran on"),
    Metric("cstorch_mixed_precision", "bool", "cstorch's mixed precision on"),
    Metric("cstorch_half_dtype", "text", "cstorch's half dtype"),
    Metric("optimizer", "text", "the vendor runtime's optimizer"),
    Metric("gas_in", "text", "where gradient accumulation ran (the host or the compiled step)"),
    Metric("samples_per_s_cstorch", "samples/s", "cstorch's rate tracker"),
    Metric("samples_per_s_same_window", "samples/s", "our clock over cstorch's counted steps"),
    Metric("samples_per_s_cstorch_smoothed", "samples/s", "cstorch's smoothed rate"),
    Metric("cstorch_total_samples", "samples", "samples cstorch's rate tracker counted"),
    Metric("cstorch_elapsed_s", "s", "cstorch's rate tracker's clock"),
    Metric("cstorch_flops_utilization_pct", "%", "cstorch's own FLOPs utilisation figure"),
)

declare(*CEREBRAS_METRICS)
