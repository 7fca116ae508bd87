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
ROUNDS = 3  # the dtypes are timed in turn, this many times, and each keeps its best


def matmul_gflops(device: torch.device, dtype: torch.dtype, synchronize: Callable[[], None], n: int = PROBE_SIZE) -> float:
    """GFLOP/s of an n x n product in ``dtype`` on ``device``; cached for the process.

    The first call times every precision in turn (fp32, bf16, fp16, ``ROUNDS`` times) and keeps
    each one's best: a busy moment then slows every dtype alike instead of one of them, so the
    comparison with fp32 that decides "native" is not tipped by another process.
    """
    key = (str(device), dtype, n)
    if key not in _RATES:
        rates = _probe(device, (torch.float32, torch.bfloat16, torch.float16, dtype), synchronize, n)
        _RATES.update({(str(device), d, n): r for d, r in rates.items()})
    return _RATES[key]


def _probe(device: torch.device, dtypes: tuple[torch.dtype, ...], synchronize: Callable[[], None],
           n: int) -> dict[torch.dtype, float]:
    gen = torch.Generator(device="cpu").manual_seed(0)
    a32, b32 = torch.randn(n, n, generator=gen), torch.randn(n, n, generator=gen)
    operands = {d: (a32.to(device=device, dtype=d), b32.to(device=device, dtype=d)) for d in dict.fromkeys(dtypes)}
    best: dict[torch.dtype, float] = {}
    for _ in range(ROUNDS):
        for d, (a, b) in operands.items():
            # One warm-up, then a few products; a slow (emulated) one needs only one to be clear.
            first = measure(lambda: torch.mm(a, b), synchronize, warmup=1 if d not in best else 0, trials=1).min_s
            more = 4 if first < 0.02 else 0
            t = min([first] + (measure(lambda: torch.mm(a, b), synchronize, warmup=0, trials=more).times_s
                               if more else []))
            best[d] = min(best.get(d, float("inf")), t)
    return {d: 2 * n**3 / t / 1e9 for d, t in best.items()}
