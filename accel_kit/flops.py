"""FLOP counting: the one convention every model family counts its work in.

Convention (PaLM, Chowdhery et al. 2022, appendix B; Megatron-LM, Narayanan et al. 2021,
section 5.1): count the multiply-adds of matrix products as 2 FLOPs each; ignore biases,
LayerNorm, softmax, GELU and residual adds (O(b*s*h), under 1 % at GPT-2 XL sizes); count
attention over the full s x s score matrix even when a causal kernel skips the masked half;
the backward pass costs twice the forward (one product for input gradients, one for weight
gradients); activation recomputation is *not* counted (model FLOPs, not hardware FLOPs).

Each family applies it to its own shape (``accel_kit.models.<family>``, ``Family.flop_terms``):
GPT-2's formulas are in ``accel_kit.models.gpt2.flops``.
"""
from __future__ import annotations

DIRECTIONS = ("forward", "forward_backward")

# Backward = 2x forward: dL/dX = dL/dY @ W^T and dL/dW = X^T @ dL/dY, each as costly as Y = X @ W.
BACKWARD_TO_FORWARD = 2


def tflops(flops: float, time_s: float) -> float:
    """Achieved TFLOP/s (10^12 FLOPs per second)."""
    if time_s <= 0:
        raise ValueError(f"time must be positive, got {time_s}")
    return flops / time_s / 1e12


def direction_factor(direction: str) -> int:
    """How many forwards' worth of work ``direction`` is: 1, or 3 with the backward."""
    if direction == "forward":
        return 1
    if direction == "forward_backward":
        return 1 + BACKWARD_TO_FORWARD
    raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
