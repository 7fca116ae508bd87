"""A short timed matmul per dtype: which precisions a device really runs at speed.

A CPU's bf16 or fp16 products may run on native units (AMX, AVX-512 BF16) several times
faster than fp32, or be emulated 50-100x slower (AVX2 only): the flags do not say which
path torch's kernels take, so the rate is measured. One product of a few hundred rows takes
milliseconds where the precision is native and a fraction of a second where it is not; the
result is cached for the process.
"""
from __future__ import annotations

from typing import Callable

import torch

from accel_kit.timing import measure

PROBE_SIZE = 384  # about 0.1 s per product at 1 GFLOP/s (emulated bf16), 1 ms natively
# A lower precision counts as native when it is at least this fast relative to fp32.
NATIVE_MIN_RATIO = 1.0


_RATES: dict[tuple[str, torch.dtype, int], float] = {}


def matmul_gflops(device: torch.device, dtype: torch.dtype, synchronize: Callable[[], None], n: int = PROBE_SIZE) -> float:
    """GFLOP/s of an n x n product in ``dtype`` on ``device`` (best of a few, after one warm-up); cached."""
    key = (str(device), dtype, n)
    if key not in _RATES:
        _RATES[key] = _probe(device, dtype, synchronize, n)
    return _RATES[key]


def _probe(device: torch.device, dtype: torch.dtype, synchronize: Callable[[], None], n: int) -> float:
    gen = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(n, n, generator=gen).to(device=device, dtype=dtype)
    b = torch.randn(n, n, generator=gen).to(device=device, dtype=dtype)
    first = measure(lambda: torch.mm(a, b), synchronize, warmup=1, trials=1).min_s
    # Fast products are noisy: repeat them more; a slow (emulated) one is clear after two.
    trials = 2 if first > 0.02 else 10
    best = min(first, measure(lambda: torch.mm(a, b), synchronize, warmup=0, trials=trials).min_s)
    return 2 * n**3 / best / 1e9
