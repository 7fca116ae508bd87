"""Sparse kernels for a pruned linear: ``KernelLinear`` (the module swapped in), the kernel classes
(CSR, 2:4 semi-structured) and the autograd function through which all three products of a
training step run.

Each kernel keeps its sparse operands, rebuilt once per optimizer step, and checks itself
against the dense layer (``self_check``) before it is used.
"""
from __future__ import annotations

import contextlib
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn


class KernelLinear(nn.Module):
    """A pruned ``nn.Linear`` executed by a sparse kernel; holds the *same* weight and bias Parameters.

    Parameter names are unchanged (``weight``, ``bias``), so optimizers, state dicts and
    ``release()`` (which puts the original module back) see no difference.
    """

    def __init__(self, dense: nn.Linear, kernel: "SparseKernel"):
        super().__init__()
        # Kept to put back on release(); set past nn.Module so it is not a child (no parameters counted twice).
        object.__setattr__(self, "dense", dense)
        self.weight, self.bias = dense.weight, dense.bias
        self.in_features, self.out_features = dense.in_features, dense.out_features
        self.kernel = kernel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_autocast_enabled(x.device.type):
            dtype = torch.get_autocast_dtype(x.device.type)
        else:
            dtype = self.weight.dtype
        # The kernel casts explicitly; autocast would otherwise re-cast inside its products.
        with torch.autocast(x.device.type, enabled=False):
            return _SparseLinearFn.apply(x, self.weight, self.bias, self.kernel, dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, kernel={self.kernel.label}"


# What makes the context a training forward runs in (``select.autocast_factory``): autocast, or a null context.
Autocast = Callable[[], contextlib.AbstractContextManager[object]]


class SparseKernel:
    """Sparse operands of one pruned weight, rebuilt when the weight changes (once per optimizer step)."""

    kind = ""  # the SparseExecution kind it gives ("csr", "2:4")
    label = "sparse"
    note = ""
    backend: str | None = None  # the library behind the kernel, once built

    def __init__(self, mask: torch.Tensor, dtype: torch.dtype):
        self.pruned, self.dtype = ~mask, dtype  # mask: True where kept
        self._cache_key: tuple | None = None
        self._ops: tuple | None = None

    def invalidate(self) -> None:
        self._cache_key = None

    def operands(self, weight: torch.Tensor, dtype: torch.dtype) -> tuple:
        # ``_version`` counts in-place updates: the optimizer step and apply_masks bump it.
        key = (weight._version, dtype, weight.data_ptr())
        if key != self._cache_key:
            self._ops = self.build(weight.detach(), dtype)
            self._cache_key = key
        return self._ops

    def build(self, weight: torch.Tensor, dtype: torch.dtype) -> tuple:
        raise NotImplementedError

    def forward(self, ops: tuple, x2: torch.Tensor) -> torch.Tensor:
        """Y (M, out) = X2 (M, in) @ W^T."""
        raise NotImplementedError

    def backward(self, ops: tuple, x2: torch.Tensor, g2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(dX (M, in), dW (out, in), zero where pruned) from dY g2 (M, out)."""
        raise NotImplementedError

    def self_check(self, dense: nn.Linear, autocast: Autocast) -> None:
        """Raise unless the kernel matches the dense layer (forward and gradients) on a small input."""
        x = torch.randn(64, dense.in_features, device=dense.weight.device, dtype=dense.weight.dtype,
                        requires_grad=True)
        module = KernelLinear(dense, self)
        outs = []
        for m in (dense, module):
            with autocast():
                y = m(x)
            grads = torch.autograd.grad(y.float().square().sum(), [x, dense.weight])
            outs.append((y.float(), grads[0].float(), grads[1].float().masked_fill(self.pruned, 0)))
        tol = {"rtol": 2e-2, "atol": 2e-2} if self.dtype in (torch.float16, torch.bfloat16) else \
            {"rtol": 1e-4, "atol": 1e-5}
        for name, a, b in zip(("output", "input gradient", "weight gradient"), outs[0], outs[1]):
            scale = float(a.detach().abs().max()) or 1.0
            if not torch.allclose(a / scale, b / scale, **tol):
                raise RuntimeError(f"{self.label} {name} differs from dense (max abs diff "
                                   f"{float((a - b).abs().max()):.3g} of {scale:.3g})")


class CSRKernel(SparseKernel):
    """All three products sparse: CSR (torch.sparse: MKL on CPU, cuSPARSE on GPUs)."""

    kind = "csr"
    label = "CSR sparse matmul (torch.sparse)"

    def __init__(self, mask: torch.Tensor, dtype: torch.dtype):
        super().__init__(mask, dtype)
        out_f, in_f = mask.shape
        structure = mask.to(torch.float32).to_sparse_csr()  # row-major order of the kept weights
        self.crow, self.col = structure.crow_indices(), structure.col_indices()
        self.flat = mask.flatten().nonzero().squeeze(1)  # W's flat index of each CSR value
        mask_t = mask.t().contiguous()  # (in, out): W^T, for the input gradient
        structure_t = mask_t.to(torch.float32).to_sparse_csr()
        self.crow_t, self.col_t = structure_t.crow_indices(), structure_t.col_indices()
        i, j = mask_t.nonzero(as_tuple=True)  # W^T[i, j] = W[j, i]
        self.flat_t = j * in_f + i
        self.shape = (out_f, in_f)

    def build(self, weight: torch.Tensor, dtype: torch.dtype) -> tuple:
        flat = weight.reshape(-1).to(dtype)
        w = torch.sparse_csr_tensor(self.crow, self.col, flat[self.flat], self.shape, check_invariants=False)
        w_t = torch.sparse_csr_tensor(self.crow_t, self.col_t, flat[self.flat_t], self.shape[::-1],
                                      check_invariants=False)
        pattern = torch.sparse_csr_tensor(self.crow, self.col, torch.ones_like(flat[self.flat]), self.shape,
                                          check_invariants=False)
        return w, w_t, pattern

    def forward(self, ops: tuple, x2: torch.Tensor) -> torch.Tensor:
        w, _, _ = ops
        return torch.mm(w, x2.t()).t()  # (out, M) -> (M, out)

    def backward(self, ops: tuple, x2: torch.Tensor, g2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        _, w_t, pattern = ops
        grad_x = torch.mm(w_t, g2.t()).t()  # (in, M) -> (M, in)
        # dW = dY^T X, computed only at the kept positions (sampled dense-dense product).
        values = torch.sparse.sampled_addmm(pattern, g2.t(), x2, beta=0.0).values()
        grad_w = torch.zeros(self.pruned.numel(), dtype=values.dtype, device=values.device)
        grad_w.index_copy_(0, self.flat, values)
        return grad_x, grad_w.view(self.shape)


class SemiStructuredKernel(SparseKernel):
    """2:4 sparse tensor cores (``torch.sparse.to_sparse_semi_structured``) for the forward product."""

    kind = "2:4"
    label = "2:4 semi-structured sparse matmul"
    note = " (forward product; the backward products run dense, see accel_kit.sparsity)"

    def build(self, weight: torch.Tensor, dtype: torch.dtype) -> tuple:
        from torch.sparse import to_sparse_semi_structured

        # (out, in), 2 of every 4 consecutive weights along `in` zero: the layout the kernels take
        masked = weight.to(dtype).masked_fill(self.pruned, 0).contiguous()
        compressed = to_sparse_semi_structured(masked)
        self.backend = type(compressed).__name__  # ...CUSPARSELT or ...CUTLASS: torch picks
        return compressed, masked

    def forward(self, ops: tuple, x2: torch.Tensor) -> torch.Tensor:
        compressed, _ = ops
        return F.linear(x2, compressed)  # dispatches to cuSPARSELt / CUTLASS

    def backward(self, ops: tuple, x2: torch.Tensor, g2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        _, masked = ops
        return g2 @ masked, (g2.t() @ x2).masked_fill_(self.pruned, 0)


class _SparseLinearFn(torch.autograd.Function):
    """Y = X W^T + b through a ``SparseKernel``; gradients for X, W (zero where pruned) and b."""

    @staticmethod
    def forward(ctx, x, weight, bias, kernel: SparseKernel, dtype: torch.dtype):
        ops = kernel.operands(weight, dtype)
        x2 = x.reshape(-1, x.shape[-1]).to(dtype).contiguous()  # (M, in)
        y = kernel.forward(ops, x2).contiguous()  # (M, out); contiguous: callers .view() it
        if bias is not None:
            y.add_(bias.to(dtype))
        ctx.save_for_backward(x2)
        ctx.kernel, ctx.ops, ctx.has_bias = kernel, ops, bias is not None
        ctx.x_shape, ctx.x_dtype, ctx.w_dtype = x.shape, x.dtype, weight.dtype
        return y.view(*x.shape[:-1], y.shape[-1])

    @staticmethod
    def backward(ctx, g):
        (x2,) = ctx.saved_tensors
        g2 = g.reshape(-1, g.shape[-1]).to(x2.dtype).contiguous()  # (M, out)
        grad_x, grad_w = ctx.kernel.backward(ctx.ops, x2, g2)
        grad_b = g2.sum(0).to(ctx.w_dtype) if ctx.has_bias else None
        return (grad_x.reshape(ctx.x_shape).to(ctx.x_dtype), grad_w.to(ctx.w_dtype), grad_b, None, None)
