"""Tolerances for comparing two floating-point computations of the same quantity.

Two implementations of the same math (ours and a reference, a fast path and a plain one, one
batch and several micro-batches, one process and two) differ only in the order of their sums
and in which intermediate results they round. That difference depends on the CPU (AMX, AVX-512
with or without bf16, AVX2: each picks other kernels, blockings and thread splits), so a fixed
constant tuned on one machine fails on another. The bounds here follow from the dtype, the
length of the reductions and the magnitude of the values instead:

* A sum of n terms computed in any order is off by at most about (n - 1) u sum|x_i| (Higham's
  gamma bound, u = eps / 2), so two orders differ by at most about n eps sum|x_i|. For
  random-signed terms the probabilistic bound (Higham and Mary) is lambda sqrt(n) u sum|x_i|,
  and sum|x_i| is about sqrt(n) |sum|, which again gives about n eps |sum| (lambda = 2). Hence
  ``atol = eps(accumulation dtype) x n x magnitude``, the magnitude being the largest |value|
  of the reference (a bound on every partial sum that does not cancel).
* A chain of reductions (a block's forward and backward) adds the errors of its stages: n is
  then the sum of the stages' lengths.
* Each result is finally rounded to its storage dtype: two sums that differ by a hair may round
  to neighbouring values, one ulp apart, hence ``rtol = eps(storage dtype)``.
"""
from __future__ import annotations

import torch


def eps(dtype: torch.dtype) -> float:
    """Machine epsilon of a floating-point dtype (the gap between 1 and the next value)."""
    return torch.finfo(dtype).eps


def sum_tolerance(dtype: torch.dtype, n_terms: int, magnitude: float, *,
                  accumulate: torch.dtype | None = None) -> dict[str, float]:
    """``rtol``/``atol`` for ``torch.testing.assert_close`` of two computations of sums of ``n_terms``.

    Args:
        dtype: the dtype the results are stored in (one ulp of it is the rounding allowance).
        n_terms: the reduction length (for a chain of reductions, the sum of their lengths).
        magnitude: the size of the values summed, usually the largest |value| of the reference.
        accumulate: the dtype the sums are accumulated in, where wider than ``dtype`` (CPU bf16
            kernels accumulate in fp32); defaults to ``dtype``.
    """
    if n_terms < 1:
        raise ValueError(f"n_terms must be at least 1, got {n_terms}")
    return {"rtol": eps(dtype), "atol": eps(accumulate or dtype) * n_terms * float(magnitude)}


def assert_close_sums(actual: torch.Tensor, expected: torch.Tensor, *, n_terms: int,
                      magnitude: float | None = None, accumulate: torch.dtype | None = None,
                      msg: str | None = None) -> None:
    """``torch.testing.assert_close`` with :func:`sum_tolerance` (magnitude: max |expected| by default)."""
    if magnitude is None:
        magnitude = expected.detach().abs().max().item() if expected.numel() else 0.0
    tol = sum_tolerance(expected.dtype, n_terms, magnitude, accumulate=accumulate)
    torch.testing.assert_close(actual, expected, msg=msg, **tol)


def gpt_forward_terms(cfg, seq_len: int) -> int:
    """Terms summed along the longest path of a GPT forward (a chain: the stages' lengths add up).

    The embedding sum (2), then per block LayerNorm (h), qkv (h), scores (head_dim), softmax and
    attention-weighted values (2 T), projection (h), LayerNorm (h), MLP up (h) and down (4 h);
    then the final LayerNorm and the LM head (h each). A backward runs as many again.
    """
    h = cfg.hidden_size
    per_block = 9 * h + h // cfg.n_heads + 2 * seq_len
    return 2 + cfg.n_layers * per_block + 2 * h


def engine_adamw(model) -> torch.optim.AdamW:
    """AdamW with the engine's defaults (``accel_kit.engine.step.OptimConfig``): lr 6e-4, betas (0.9, 0.95),
    weight decay 0.1 on matrices (a MoE's 3-D expert tensors too), none on norms; the reference loops apply
    the engine's clipping at global norm 1.0 themselves."""
    params = list(model.parameters())
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=6e-4, betas=(0.9, 0.95))
