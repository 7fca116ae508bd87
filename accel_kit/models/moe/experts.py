"""The routed experts of one MoE layer: every expert's SwiGLU weights in two 3-D tensors, and its product
on the rows routed to it.

Layout and names are transformers 5's (``Qwen3MoeExperts``, ``MixtralExperts``, ``OlmoeExperts``):
``gate_up_proj`` (E, 2F, h), each expert's gate rows then its up rows, and ``down_proj`` (E, h, F), so the
weights convert by name. The rows come sorted by expert (``moe.dispatch``): expert e's tokens are one
contiguous run, ``counts[e]`` long.

Kernels: ``torch._grouped_mm`` multiplies every run by its expert's matrix in one call (runs on this CPU
in fp32 and bf16, and on CUDA); it needs 16-byte-aligned strides, so 16-bit widths that are not a
multiple of 8 run padded with zeros (a zero column adds nothing to a product). Where it does not run
(another device, another dtype), one product per expert (``loop``), which reads ``counts`` on the host.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

ALIGN_BYTES = 16  # _grouped_mm's stride alignment


@functools.lru_cache(maxsize=None)
def grouped_mm_runs(device_type: str, dtype: torch.dtype) -> bool:
    """Whether ``torch._grouped_mm`` runs forward and backward on ``device_type`` in ``dtype``: tried once on a
    tiny aligned problem (two experts, one empty), on the device's first index."""
    if not hasattr(torch, "_grouped_mm"):
        return False
    try:
        # the first call may come from a no-grad forward or from generation under inference mode, where a
        # backward cannot run: the probe's answer (cached for the process) must not depend on that
        with torch.inference_mode(False), torch.enable_grad():
            x = torch.randn(8, 16, device=device_type, dtype=dtype, requires_grad=True)
            w = torch.randn(2, 16, 16, device=device_type, dtype=dtype, requires_grad=True)
            offs = torch.tensor([0, 8], device=device_type, dtype=torch.int32)
            y = torch._grouped_mm(x, w.transpose(-2, -1), offs=offs)
            y.backward(torch.ones_like(y))
            return True
    except Exception:  # noqa: BLE001 (any device's way of saying it has no such kernel: then the loop runs)
        return False


@torch.compiler.assume_constant_result
def _grouped_mm_runs_constant(device_type: str, dtype: torch.dtype) -> bool:
    """``grouped_mm_runs``, which torch.compile calls once, eagerly, and takes as a constant (tracing the probe
    would trace its backward)."""
    return grouped_mm_runs(device_type, dtype)


class _ContiguousGrad(torch.autograd.Function):
    """Identity forward; backward hands on a contiguous gradient (``_grouped_mm``'s backward refuses an
    expanded one, as a ``sum()``'s is)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad.contiguous()


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype the products run in: autocast's where it is on (``_grouped_mm`` is not on autocast's lists, so
    it would run in the fp32 of the weights and of the norm's output), else the input's."""
    device = x.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype


def _aligned(width: int, dtype: torch.dtype) -> int:
    per = ALIGN_BYTES // torch.empty((), dtype=dtype).element_size()
    return -(-width // per) * per


class Experts(nn.Module):
    """``n_experts`` SwiGLU experts, h -> F -> h: down_e(silu(gate_e x) * up_e x) for the rows of expert e.

    ``kernel``: "grouped_mm", "loop" or "auto" (grouped_mm where ``grouped_mm_runs``). ``kernel_ran``: the
    kernel the last forward used (None before one).
    """

    def __init__(self, n_experts: int, hidden_size: int, ffn_hidden_size: int, kernel: str = "auto"):
        super().__init__()
        self.n_experts, self.hidden_size, self.ffn_hidden_size = n_experts, hidden_size, ffn_hidden_size
        self.kernel = kernel
        self.kernel_ran: str | None = None
        # random values: the family's (``MoE.init_rule``: N(0, 0.02^2), as transformers' _init_weights)
        self.gate_up_proj = nn.Parameter(torch.empty(n_experts, 2 * ffn_hidden_size, hidden_size))
        self.down_proj = nn.Parameter(torch.empty(n_experts, hidden_size, ffn_hidden_size))

    def resolve_kernel(self, x: torch.Tensor) -> str:
        dtype = _compute_dtype(x)
        if torch.compiler.is_compiling() and dtype != torch.bfloat16:
            # _grouped_mm's fake-tensor rule (what torch.compile traces with) takes bf16 only, though the CPU
            # kernel runs fp32: the loop then, whatever was asked
            return "loop"
        if self.kernel != "auto":
            return self.kernel
        return "grouped_mm" if _grouped_mm_runs_constant(x.device.type, dtype) else "loop"

    def forward_sorted(self, x_sorted: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Each expert's SwiGLU on its run of rows.

        Args:
            x_sorted: (N, h) rows sorted by expert.
            counts: (E,) int64, rows of each expert (summing to N).
        Returns:
            (N, h), row i the output of the expert row i belongs to (unweighted).
        """
        self.kernel_ran = kernel = self.resolve_kernel(x_sorted)
        if kernel == "grouped_mm":
            return self._grouped(x_sorted, counts)
        return self._loop(x_sorted, counts)

    def _grouped(self, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        x = x.to(_compute_dtype(x))
        offs = torch.cumsum(counts, 0).to(torch.int32)  # end row of each expert's run
        h, f = self.hidden_size, self.ffn_hidden_size
        hp, fp = _aligned(h, x.dtype), _aligned(f, x.dtype)
        gate_up, down = self.gate_up_proj.to(x.dtype), self.down_proj.to(x.dtype)  # no-ops in the weights' dtype
        if (hp, fp) != (h, f):  # zero rows and columns: the padded products hold the same values and zeros
            gate_up = F.pad(gate_up.unflatten(1, (2, f)), (0, hp - h, 0, fp - f)).flatten(1, 2)  # (E, 2 fp, hp)
            down = F.pad(down, (0, fp - f, 0, hp - h))  # (E, hp, fp)
            x = F.pad(x, (0, hp - h))
        gu = torch._grouped_mm(x, gate_up.transpose(-2, -1), offs=offs)  # (N, 2 fp)
        gate, up = _ContiguousGrad.apply(gu).chunk(2, dim=-1)  # (N, fp) views each
        y = torch._grouped_mm(F.silu(gate) * up, down.transpose(-2, -1), offs=offs)  # (N, hp)
        return _ContiguousGrad.apply(y if hp == h else y[:, :h])

    def _loop(self, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        outs = []
        # unbind: one backward that stacks every expert's gradient, where indexing each expert would fill a
        # zero tensor of all the experts' weights per expert
        gate_ups, downs = self.gate_up_proj.unbind(0), self.down_proj.unbind(0)
        for e, rows in enumerate(x.split(counts.tolist())):  # one host sync for the run lengths
            if rows.shape[0] == 0:
                continue
            gate, up = F.linear(rows, gate_ups[e]).chunk(2, dim=-1)
            outs.append(F.linear(F.silu(gate) * up, downs[e]))
        return torch.cat(outs) if outs else x.new_zeros(0, self.hidden_size)
