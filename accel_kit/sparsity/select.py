"""Choosing how the pruned layers execute: which sparse kernel may serve a run, and the setup
calibration that times it against the dense matmul per layer shape, so that a kernel is used
only where it measured faster, and the ``SparseExecution`` that results.
"""
from __future__ import annotations

import contextlib
from typing import Callable, Protocol

import torch
from torch import nn

from accel_kit.json_types import JSONObject
from accel_kit.sparsity.execution import SparseExecution
from accel_kit.sparsity.kernels import Autocast, CSRKernel, KernelLinear, SemiStructuredKernel, SparseKernel
from accel_kit.precision import spec
from accel_kit.sparsity.prune import PrunedLayer


class KernelAdapter(Protocol):
    """What sparse execution asks of a device adapter (``accel_kit.devices.base.BaseAdapter`` answers it).
    The adapters build on this package (a vendor's own sparse execution), so it names what it uses, not
    their class."""

    name: str

    def sparse_kernel(self, pattern: str, dtype: torch.dtype) -> tuple[str | None, str]: ...

    def synchronize(self) -> None: ...


KERNEL_MODES: tuple[str, ...] = ("dense", "auto")

# CSR is only timed from this sparsity up: below it a CSR product does more memory traffic
# per useful FLOP than a dense GEMM. On the 2-core Xeon (AMX) we measured, a CSR training
# step (fp32) beats dense only at about 99 % (benchmarks/sparsity_speed.py); trying from 80 %
# lets a machine with a better sparse library still win, while sparing ordinary runs the timing.
CSR_MIN_SPARSITY = 0.8
# A kernel must beat dense by this factor in the setup timing, so noise alone never switches paths.
KERNEL_MIN_SPEEDUP = 1.05
# The kernel class for each kind a device adapter may answer ``sparse_kernel`` with.
KERNELS: dict[str, type[SparseKernel]] = {cls.kind: cls for cls in (SemiStructuredKernel, CSRKernel)}


def candidate_kernel(pattern: str, sparsity: float, adapter: KernelAdapter,
                     dtype: torch.dtype) -> tuple[type[SparseKernel] | None, str]:
    """(kernel class, what it is) if a sparse kernel may serve this run, else (None, why not).

    Whether a kernel exists for the pattern and dtype is the device's answer
    (``adapter.sparse_kernel``); whether CSR is worth timing at this sparsity is the model's
    (``CSR_MIN_SPARSITY``).
    """
    kind, reason = adapter.sparse_kernel(pattern, dtype)
    if kind is None:
        return None, reason
    if kind not in KERNELS:
        raise ValueError(f"adapter {getattr(adapter, 'name', adapter)!r} offers sparse kernel kind {kind!r}; "
                         f"accel_kit.sparsity has kernels for {', '.join(KERNELS)}")
    if kind == "csr" and sparsity < CSR_MIN_SPARSITY:
        return None, (f"no sparse kernel beats dense at {sparsity:.0%} {pattern} sparsity "
                      f"(CSR is tried from {CSR_MIN_SPARSITY:.0%}; see benchmarks/sparsity_speed.py)")
    return KERNELS[kind], reason


def calibrate(layers: list[PrunedLayer], kernel_cls: type[SparseKernel], dtype: torch.dtype,
              autocast: Autocast, tokens: int, synchronize: Callable[[], None],
              force: bool = False) -> tuple[dict[tuple[int, ...], bool], list[JSONObject]]:
    """Check and time the kernel once per distinct layer shape: ({shape: use it}, one timing entry per shape).

    A kernel that fails its self-check (or its timing) is not used, and its entry says why.
    ``force`` uses every kernel that passes the self-check, without timing (tests).
    """
    chosen: dict[tuple[int, ...], bool] = {}
    entries: list[JSONObject] = []
    for layer in layers:
        shape = tuple(layer.module.weight.shape)
        if shape in chosen:
            continue
        candidate = KernelLinear(layer.module, kernel_cls(layer.mask, dtype))
        entry: JSONObject = {"layer": layer.name, "shape": list(shape), "kernel": kernel_cls.label}
        try:
            candidate.kernel.self_check(layer.module, autocast)
            if force:
                entry["use"] = True
            else:
                dense_s, sparse_s = time_layer(layer.module, candidate, tokens, dtype, autocast, synchronize)
                entry |= {"dense_ms": 1e3 * dense_s, "sparse_ms": 1e3 * sparse_s,
                          "speedup": dense_s / sparse_s, "use": dense_s / sparse_s >= KERNEL_MIN_SPEEDUP}
        except Exception as exc:  # a kernel that fails here is not used; the record says why
            text = str(exc).strip().splitlines()
            entry |= {"use": False, "error": f"{type(exc).__name__}: {text[0] if text else ''}"[:200]}
        if candidate.kernel.backend:
            entry["backend"] = candidate.kernel.backend
        chosen[shape] = entry["use"]
        entries.append(entry)
    return chosen, entries


def chosen_execution(kernel_cls: type[SparseKernel], calibration: list[JSONObject], n_kernel: int,
                     n_layers: int) -> SparseExecution:
    """How the pruned layers run once ``n_kernel`` of ``n_layers`` use ``kernel_cls`` after ``calibration``."""
    if n_kernel:
        backend = next((e.get("backend") for e in calibration if e.get("backend")), None)
        where = "every pruned layer" if n_kernel == n_layers else \
            f"{n_kernel} of {n_layers} pruned layers (dense matmul with zeros elsewhere)"
        label = f"{kernel_cls.label} [{backend}]" if backend else kernel_cls.label
        return SparseExecution(kernel_cls.kind, f"{where}{kernel_cls.note}", kernel=label)
    errors = [e["error"] for e in calibration if "error" in e]
    if errors:
        return SparseExecution("dense-zeros", f"{kernel_cls.label} failed here ({errors[0]})")
    best = max(e["speedup"] for e in calibration)
    return SparseExecution("dense-zeros", f"{kernel_cls.label} measured slower than dense at every layer shape "
                                          f"(best sparse/dense speedup {best:.2f}x, needs {KERNEL_MIN_SPEEDUP}x)")


def autocast_factory(weight: torch.Tensor, precision: str) -> Autocast:
    """The context the training forward runs in: autocast when fp32 weights meet a 16-bit precision.

    (``Trainer`` runs fp16 under autocast with fp32 weights, and bf16 on a bf16 model without it.)
    """
    kind = spec(precision)
    if not kind.mixed or weight.dtype != torch.float32:
        return contextlib.nullcontext
    return lambda: torch.autocast(weight.device.type, dtype=kind.dtype)  # autocast where the weights are


def time_layer(dense: nn.Linear, kernel: KernelLinear, tokens: int, dtype: torch.dtype,
               autocast: Autocast, synchronize: Callable[[], None]) -> tuple[float, float]:
    """Best forward+backward time (s) of the dense layer and of its sparse replacement, same inputs."""
    from accel_kit.timing import measure

    w = dense.weight
    x = torch.randn(tokens, w.shape[1], device=w.device, dtype=dtype, requires_grad=True)
    g = torch.randn(tokens, w.shape[0], device=w.device, dtype=dtype)
    params = [p for p in (dense.weight, dense.bias) if p is not None]

    def step(module: nn.Module) -> Callable[[], None]:
        def run() -> None:
            kernel.kernel.invalidate()  # charge the once-per-step rebuild of the sparse operands to every call
            with autocast():
                y = module(x)
            torch.autograd.grad(y, [x, *params], g.to(y.dtype))
        return run

    def best_s(run: Callable[[], None]) -> float:
        first = measure(run, synchronize, warmup=1, trials=1).min_s
        # Products under ~50 ms are noisy against other work on the machine: take the best of more trials.
        more = measure(run, synchronize, warmup=0, trials=2 if first > 0.05 else 9).min_s
        return min(first, more)

    return best_s(step(dense)), best_s(step(kernel))
