"""Which scaled-dot-product attention kernel a training point asks for, and which one ran.

The model's attention is one ``torch.nn.functional.scaled_dot_product_attention`` call per
block (``accel_kit.models.sdpa.causal_attention``). PyTorch picks a kernel per call from what the device
has and what the inputs allow (dtype, head dim, alignment, causal mask, grad): a fused
flash or memory-efficient kernel, cuDNN's, or the "math" composite that materialises the
(T, T) score matrix. Long sequences (GenSLM's 10240 codons) need a fused one: the math
kernel's scores alone are ``batch x heads x T^2`` elements per layer.

``attention_context(kernel)`` forces a choice for the steps it wraps ("auto" leaves PyTorch's
choice alone); ``probe_attention_kernel`` runs one call of the point's shape and watches the
aten ops it dispatches, so each record says which kernel it measured.
"""
from __future__ import annotations

import contextlib
from typing import Literal

import torch
# The documented hook for seeing dispatched aten ops (PyTorch "Extending PyTorch": __torch_dispatch__).
from torch.utils._python_dispatch import TorchDispatchMode

from accel_kit.models.sdpa import causal_attention

AttentionKernel = Literal["auto", "flash", "efficient", "math"]

# The fused kernels' aten ops -> kernel. SDPA dispatches to one of these, or else runs the math
# composite (aten::_scaled_dot_product_attention_math), which decomposes into bmm and softmax
# before dispatch, so it is recognised by its softmax.
FUSED_OPS: tuple[tuple[str, str], ...] = (
    ("aten::_scaled_dot_product_flash_attention_for_cpu", "flash"),
    ("aten::_scaled_dot_product_flash_attention", "flash"),
    ("aten::_scaled_dot_product_efficient_attention", "efficient"),
    ("aten::_scaled_dot_product_cudnn_attention", "cudnn"),
    ("aten::_scaled_dot_product_fused_attention_overrideable", "overrideable"),
)
MATH_OP = "aten::_scaled_dot_product_attention_math"
_SOFTMAX_OPS = ("aten::_safe_softmax", "aten::_softmax", "aten::softmax")


class AttentionKernelUnavailable(RuntimeError):
    """The kernel the point asks for cannot run these inputs on this device."""


def attention_context(kernel: AttentionKernel):
    """A context manager that restricts SDPA to ``kernel`` ("auto": a no-op, PyTorch chooses)."""
    if kernel == "auto":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
               "math": SDPBackend.MATH}[kernel]
    return sdpa_kernel(backend)


def kernel_of_ops(op_names: set[str]) -> tuple[str | None, str | None]:
    """``(kernel, aten op)`` from the aten ops one SDPA call dispatched; ``(None, None)`` if unrecognised."""
    for op, kernel in FUSED_OPS:
        if op in op_names:
            return kernel, op
    if op_names & set(_SOFTMAX_OPS):
        return "math", MATH_OP
    return None, None


class _OpNames(TorchDispatchMode):
    """Collects the names of the aten ops dispatched inside it (below autograd, so the fused op is seen)."""

    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.add(func.name().split(".")[0])  # "aten::add.Tensor" -> "aten::add"
        return func(*args, **(kwargs or {}))


def probe_attention_kernel(kernel: AttentionKernel, *, n_heads: int, head_dim: int, seq_len: int,
                           device: torch.device, dtype: torch.dtype | None, n_kv_heads: int | None = None) -> dict:
    """Run one causal SDPA call of the training shape and report the kernel that ran.

    Args:
        kernel: the point's choice ("auto" or a forced kernel).
        n_heads, head_dim, seq_len: the model's attention shape.
        n_kv_heads: key/value heads where fewer than ``n_heads`` (grouped-query attention; the probe
            makes the models' own call, ``accel_kit.models.sdpa.causal_attention``).
        device: where training runs.
        dtype: the autocast dtype of mixed precision, or None for fp32.

    Returns:
        ``{"attention_kernel_ran": "flash" | "efficient" | "cudnn" | "overrideable" | "math",
        "attention_op": its aten op}``; both None, with ``attention_kernel_reason``, when the
        dispatched ops are not recognised.

    Raises:
        AttentionKernelUnavailable: a forced kernel that cannot run these inputs here.
    """
    # Batch 1: PyTorch's kernel choice (sdp_utils) depends on dtype, head dim, alignment, the
    # mask and grad, not on the batch, and batch 1 keeps the probe's memory small.
    # requires_grad: some fused kernels have no backward for some inputs, so training may
    # choose differently from inference.
    kv_heads = n_kv_heads or n_heads
    q, k, v = (torch.randn(1, heads, seq_len, head_dim, device=device, dtype=dtype or torch.float32,
                           requires_grad=True) for heads in (n_heads, kv_heads, kv_heads))  # (B, nh, T, hs)

    autocast = (torch.autocast(device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext())
    try:
        with attention_context(kernel), autocast, _OpNames() as ops:
            causal_attention(q, k, v)  # the models' own call (GQA included)
    except RuntimeError as exc:
        if kernel != "auto" and ("No viable backend" in str(exc) or "No available kernel" in str(exc)):
            raise AttentionKernelUnavailable(
                f"attention kernel {kernel!r} is not available on {device.type} for heads {n_heads} "
                f"({kv_heads} key/value) x "
                f"head dim {head_dim}, seq {seq_len}, {dtype or torch.float32}") from None
        raise
    ran, op = kernel_of_ops(ops.names)
    result = {"attention_kernel_ran": ran, "attention_op": op}
    if ran is None:
        result["attention_kernel_reason"] = f"unrecognised ops: {', '.join(sorted(ops.names))[:200]}"
    return result
