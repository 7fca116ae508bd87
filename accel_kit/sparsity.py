"""Weight sparsity (paper Figures 7-8): magnitude pruning, masks kept through training, sparse kernels.

The paper prunes a fraction ``s`` of the weights of every dense layer and trains on a
Cerebras CS-2, whose hardware skips zero weights. This module makes the same models
anywhere accel-kit runs, and says truthfully how each run executed:

- **Pruning.** Every linear of every transformer block (attention QKV and output
  projections, MLP up and down; not embeddings, LayerNorm or the tied output projection)
  is pruned by magnitude, per weight matrix. ``unstructured``: the ``round(s * numel)``
  smallest |w| are zeroed (an exact count; ties broken by ``topk``). ``2:4``: in each group
  of 4 consecutive input weights of a row the 2 largest are kept (always 50 %), the pattern
  NVIDIA's sparse tensor cores execute (Ampere and newer).
- **Masks survive training.** A gradient hook zeroes the gradient of pruned weights (so
  clipping's global norm and AdamW's moments see only live weights, as on sparse hardware),
  and ``apply_masks`` re-zeroes the weights after every optimizer step (``Trainer``'s
  ``after_step``), so nothing (weight decay, a scaler, a fused optimizer) can revive them.
- **Execution** (``sparse_kernels``): ``dense`` always multiplies zeros in a dense matmul.
  ``auto`` uses a sparse kernel for a layer only where one exists for this device and
  dtype *and* it measured faster than the dense matmul at that layer's shape (a short
  forward+backward timing at setup, recorded): 2:4 semi-structured tensors
  (``torch.sparse.to_sparse_semi_structured``: cuSPARSELt / CUTLASS) on NVIDIA GPUs of
  compute capability >= 8.0 in fp16/bf16, and CSR products (``torch.sparse``: MKL on CPU,
  cuSPARSE on GPUs) for unstructured sparsity. Everything else is the dense fallback, and
  the record says so (``sparse_execution``). FLOPs are recorded both ways (dense-equivalent,
  which MFU uses, and effective) by ``accel_kit.flops``.

What the sparse kernels do in training (both are exact, up to rounding, against the dense
path on the masked weights; tests check it):

- 2:4: the forward product Y = X W^T runs on the compressed weight, rebuilt once per
  optimizer step. The backward products run dense on the masked weight: dX = dY W reduces
  over W's output dimension, along which W has no 2:4 structure, so a tensor-core sparse
  product cannot serve it without a second, transposed pruning (which would change the
  model). So 2:4 speeds up one of the three products of a training step at best.
- CSR: all three products are sparse: Y^T = W_csr X^T, dX^T = (W^T)_csr dY^T, and dW only at
  the kept positions (``torch.sparse.sampled_addmm``). On CPU these exist in fp32/fp64 only
  (MKL), so a bf16 run (the CPU default) always takes the dense fallback. In fp32 the
  benchmark (``benchmarks/sparsity_speed.py``, GPT-2 XL MLP shapes, two Xeon cores) finds
  the CSR forward product faster than dense from about 95 % zeros, a whole training step
  (forward + backward) only at about 99 %, and even then 2-4x slower than bf16 dense.

Costs and limits, recorded rather than hidden: on the dense fallback a sparse run is a little
*slower* than the dense model, because the masks cost a pass over the pruned layers' gradients
and one over their weights each step (O(parameters): visible when a step has few tokens). The
masks take 1 byte per block weight, which the memory-fit estimate does not count. The DeepSpeed
engine is not supported (no ``after_step``). Under data parallelism each rank times the kernels
itself at setup, so ranks could in principle choose differently; the record is rank 0's.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Literal

import torch
import torch.nn.functional as F
from torch import nn

Pattern = Literal["unstructured", "2:4"]
PATTERNS: tuple[str, ...] = ("unstructured", "2:4")
KERNEL_MODES: tuple[str, ...] = ("dense", "auto")

DENSE_FALLBACK = "dense (zeros in dense matmul)"
NO_SPARSITY = "dense (no sparsity)"

# CSR is only timed from this sparsity up: below it a CSR product does more memory traffic
# per useful FLOP than a dense GEMM. On the 2-core Xeon (AMX) we measured, a CSR training
# step (fp32) beats dense only at about 99 % (benchmarks/sparsity_speed.py); trying from 80 %
# lets a machine with a better sparse library still win, while sparing ordinary runs the timing.
CSR_MIN_SPARSITY = 0.8
# A kernel must beat dense by this factor in the setup timing, so noise alone never switches paths.
KERNEL_MIN_SPEEDUP = 1.05
# The semi-structured kernels need NVIDIA sparse tensor cores: compute capability 8.0 (Ampere) or newer.
SEMI_STRUCTURED_MIN_CC = (8, 0)


# --------------------------------------------------------------------------- pruning

def prunable_layers(model: nn.Module) -> list[tuple[str, nn.Linear]]:
    """The linears of every transformer block, by qualified name: the layers the paper prunes.

    Embeddings, LayerNorms and the output projection (tied to the embedding) stay dense.
    """
    from accel_kit.models.block import Block

    layers = []
    for block_name, block in model.named_modules():
        if isinstance(block, Block):
            for name, module in block.named_modules():
                if isinstance(module, nn.Linear):
                    layers.append((f"{block_name}.{name}", module))
    return layers


def magnitude_mask(weight: torch.Tensor, sparsity: float, pattern: Pattern = "unstructured") -> torch.Tensor:
    """Which weights to keep (True) when pruning ``weight`` (out, in) by magnitude.

    Args:
        weight: a linear layer's weight, (out_features, in_features).
        sparsity: fraction to zero, 0 <= s < 1 (``unstructured``); 2:4 is always 0.5.
        pattern: ``unstructured`` (the smallest |w| of the whole matrix) or ``2:4`` (2 largest
            of every 4 consecutive weights along the input dimension).
    Returns:
        A bool tensor shaped like ``weight``.
    """
    if pattern not in PATTERNS:
        raise ValueError(f"sparsity pattern must be one of {PATTERNS}, got {pattern!r}")
    magnitude = weight.detach().abs().float()
    if pattern == "2:4":
        out_f, in_f = weight.shape
        if in_f % 4:
            raise ValueError(f"2:4 sparsity needs in_features divisible by 4, got {in_f}")
        groups = magnitude.view(out_f, in_f // 4, 4)  # (out, in/4, 4): 4 consecutive input weights
        keep = torch.zeros_like(groups, dtype=torch.bool)
        keep.scatter_(-1, groups.topk(2, dim=-1).indices, True)
        return keep.view(out_f, in_f)
    if not 0.0 <= sparsity < 1.0:
        raise ValueError(f"sparsity must be in [0, 1), got {sparsity}")
    n_keep = weight.numel() - round(sparsity * weight.numel())
    keep = torch.zeros(weight.numel(), dtype=torch.bool, device=weight.device)
    keep[magnitude.flatten().topk(n_keep, sorted=False).indices] = True
    return keep.view_as(weight)


def check_pattern(sparsity: float, pattern: str) -> None:
    """Reject a (sparsity, pattern) pair that cannot be built, naming both."""
    if pattern not in PATTERNS:
        raise ValueError(f"sparsity_pattern must be one of {', '.join(PATTERNS)}, got {pattern!r}")
    if not 0.0 <= sparsity < 1.0:
        raise ValueError(f"sparsity must be in [0, 1), got {sparsity}")
    if pattern == "2:4" and sparsity != 0.5:
        raise ValueError(f"sparsity_pattern '2:4' keeps 2 of every 4 weights, so sparsity must be 0.5 "
                         f"(got {sparsity})")


@dataclass
class PrunedLayer:
    name: str
    module: nn.Module  # the nn.Linear, or the KernelLinear that replaced it
    # 1 where the weight is kept, 0 where pruned; shaped like the weight. On a CPU it has the
    # weight's dtype: a bool select (masked_fill, where, mul by bool) is branchy there, about 7x
    # slower than a same-dtype multiply at 60 % sparsity. On GPUs a select costs no more, so
    # the mask stays bool (1 byte per weight instead of 2 or 4).
    keep: torch.Tensor
    parent: nn.Module
    attr: str

    @property
    def mask(self) -> torch.Tensor:
        """Bool, True where the weight is kept."""
        return self.keep.bool()

    @property
    def pruned(self) -> torch.Tensor:
        """Bool, True where the weight is pruned."""
        return self.keep == 0


class WeightSparsity:
    """Prunes a model's block linears by magnitude and keeps the pruned weights at zero.

    Usage::

        sparse = WeightSparsity(model, 0.9)            # prunes now; gradient hooks installed
        trainer = Trainer(..., after_step=sparse.apply_masks)
        sparse.select_kernels("auto", ...)             # optional: sparse execution where it helps
        sparse.zero_fraction()                         # measured sparsity of the pruned layers
        sparse.release()                               # back to a dense model (dense fine-tuning)
    """

    def __init__(self, model: nn.Module, sparsity: float, pattern: Pattern = "unstructured"):
        check_pattern(sparsity, pattern)
        self.model, self.sparsity, self.pattern = model, sparsity, pattern
        self.layers: list[PrunedLayer] = []
        self._hooks = []
        self.execution = NO_SPARSITY if sparsity == 0 else f"{DENSE_FALLBACK}: no sparse kernel selected"
        self.kernel: str | None = None
        self.calibration: list[dict[str, Any]] = []
        if sparsity == 0:
            return  # the dense baseline: nothing to prune or mask
        modules = dict(model.named_modules())
        for name, linear in prunable_layers(model):
            parent_name, _, attr = name.rpartition(".")
            keep = magnitude_mask(linear.weight, sparsity, pattern)
            if linear.weight.device.type == "cpu":
                keep = keep.to(linear.weight.dtype)
            with torch.no_grad():
                linear.weight.mul_(keep)
            self.layers.append(PrunedLayer(name, linear, keep, modules[parent_name], attr))
            # Pruned weights get no gradient: clipping and AdamW then see only the live ones.
            self._hooks.append(linear.weight.register_hook(lambda g, k=keep: g * k))

    @property
    def active(self) -> bool:
        return bool(self.layers)

    def apply_masks(self) -> None:
        """Re-zero every pruned weight (call after each optimizer step)."""
        with torch.no_grad():
            for layer in self.layers:
                layer.module.weight.mul_(layer.keep)

    def zero_fraction(self) -> float:
        """Fraction of exactly-zero weights over the pruned layers (over every block linear when none is)."""
        weights = [layer.module.weight for layer in self.layers] or \
            [linear.weight for _, linear in prunable_layers(self.model)]
        return sum(int((w == 0).sum()) for w in weights) / sum(w.numel() for w in weights)

    def layer_zero_fractions(self) -> dict[str, float]:
        """Per pruned layer: the fraction of its weights that are exactly zero."""
        return {layer.name: float((layer.module.weight == 0).float().mean()) for layer in self.layers}

    def nonzero_weights(self) -> int:
        """Weights the masks keep, over all block linears (all of them for a dense model)."""
        if not self.layers:
            return sum(linear.weight.numel() for _, linear in prunable_layers(self.model))
        return sum(int(layer.keep.count_nonzero()) for layer in self.layers)

    def release(self) -> None:
        """Stop masking: remove the hooks and sparse kernels; every weight trains again (dense fine-tuning)."""
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()
        for layer in self.layers:
            if isinstance(layer.module, KernelLinear):
                setattr(layer.parent, layer.attr, layer.module.dense)
        self.layers.clear()

    # ----------------------------------------------------------------------- execution

    def select_kernels(self, mode: str, device: torch.device, precision: str, tokens: int, *,
                       synchronize: Callable[[], None] | None = None, force: bool = False) -> str:
        """Choose how the pruned layers execute; sets and returns ``self.execution``.

        Args:
            mode: ``dense`` (zeros in a dense matmul) or ``auto`` (a sparse kernel for a layer
                where one exists here and it measured faster than dense at that layer's shape).
            device: where the model runs.
            precision: fp32 / fp16 / bf16 (the compute dtype of the products).
            tokens: rows of the products: micro-batch x sequence length.
            synchronize: the device's synchronize, for the setup timing.
            force: use the candidate kernel without timing it (tests: exercise the sparse path).
        """
        if mode not in KERNEL_MODES:
            raise ValueError(f"sparse_kernels must be one of {KERNEL_MODES}, got {mode!r}")
        if not self.layers:
            self.execution = NO_SPARSITY
            return self.execution
        if mode == "dense":
            self.execution = f"{DENSE_FALLBACK}: sparse_kernels=dense"
            return self.execution
        dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[precision]
        kernel_cls, why_not = _candidate_kernel(self.pattern, self.sparsity, device, dtype)
        if kernel_cls is None:
            self.execution = f"{DENSE_FALLBACK}: {why_not}"
            return self.execution
        sync = synchronize or (torch.cuda.synchronize if device.type == "cuda" else (lambda: None))
        autocast = _autocast_factory(device, precision, self.layers[0].module.weight.dtype)
        chosen: dict[tuple[int, int], bool] = {}
        for layer in self.layers:
            shape = tuple(layer.module.weight.shape)
            if shape in chosen:
                continue
            candidate = KernelLinear(layer.module, kernel_cls(layer.mask, dtype))
            entry: dict[str, Any] = {"layer": layer.name, "shape": list(shape), "kernel": kernel_cls.label}
            try:
                candidate.kernel.self_check(layer.module, autocast)
                if force:
                    entry["use"] = True
                else:
                    dense_s, sparse_s = _time_layer(layer.module, candidate, tokens, dtype, autocast, sync)
                    entry |= {"dense_ms": 1e3 * dense_s, "sparse_ms": 1e3 * sparse_s,
                              "speedup": dense_s / sparse_s, "use": dense_s / sparse_s >= KERNEL_MIN_SPEEDUP}
            except Exception as exc:  # a kernel that fails here is not used; the record says why
                text = str(exc).strip().splitlines()
                entry |= {"use": False, "error": f"{type(exc).__name__}: {text[0] if text else ''}"[:200]}
            if candidate.kernel.backend:
                entry["backend"] = candidate.kernel.backend
            chosen[shape] = entry["use"]
            self.calibration.append(entry)
        n_kernel, backend = 0, None
        for layer in self.layers:
            if chosen[tuple(layer.module.weight.shape)]:
                module = KernelLinear(layer.module, kernel_cls(layer.mask, dtype))
                setattr(layer.parent, layer.attr, module)
                layer.module = module
                n_kernel += 1
        if n_kernel:
            self.kernel = kernel_cls.label
            backend = next((e.get("backend") for e in self.calibration if e.get("backend")), None)
            where = "every pruned layer" if n_kernel == len(self.layers) else \
                f"{n_kernel} of {len(self.layers)} pruned layers (dense matmul with zeros elsewhere)"
            label = f"{kernel_cls.label} [{backend}]" if backend else kernel_cls.label
            self.execution = f"{label} on {where}{kernel_cls.note}"
        else:
            errors = [e["error"] for e in self.calibration if "error" in e]
            if errors:
                self.execution = f"{DENSE_FALLBACK}: {kernel_cls.label} failed here ({errors[0]})"
            else:
                best = max(e["speedup"] for e in self.calibration)
                self.execution = (f"{DENSE_FALLBACK}: {kernel_cls.label} measured slower than dense at every layer "
                                  f"shape (best sparse/dense speedup {best:.2f}x, needs {KERNEL_MIN_SPEEDUP}x)")
        return self.execution

    def metrics(self) -> dict[str, Any]:
        """What a record says about this run's sparsity (measured now) and execution."""
        fractions = self.layer_zero_fractions()
        return {
            "sparsity_measured": self.zero_fraction(),
            "sparsity_layer_min": min(fractions.values()) if fractions else None,
            "sparsity_layer_max": max(fractions.values()) if fractions else None,
            "pruned_layers": len(self.layers),
            "nonzero_block_weights": self.nonzero_weights(),
            "sparse_execution": self.execution,
            "sparse_kernel": self.kernel,
            "sparse_kernel_layers": sum(isinstance(layer.module, KernelLinear) for layer in self.layers),
            "sparse_kernel_timing": self.calibration,
        }


def _candidate_kernel(pattern: str, sparsity: float, device: torch.device, dtype: torch.dtype):
    """(kernel class, None) if a sparse kernel may serve this run, else (None, why not)."""
    name = str(dtype).removeprefix("torch.")
    if pattern == "2:4":
        if device.type != "cuda":
            return None, f"2:4 sparse kernels are NVIDIA tensor-core kernels; this is {device.type}"
        if torch.version.cuda is None:
            return None, "2:4 sparse kernels are NVIDIA tensor-core kernels; this torch is not a CUDA build"
        cc = torch.cuda.get_device_capability(device)
        if cc < SEMI_STRUCTURED_MIN_CC:
            return None, f"2:4 sparse tensor cores need compute capability >= 8.0, this GPU has {cc[0]}.{cc[1]}"
        if dtype not in (torch.float16, torch.bfloat16):
            return None, f"torch's 2:4 kernels run fp16/bf16 (and int8/fp8), not {name}"
        return SemiStructuredKernel, None
    if device.type == "cpu" and dtype not in (torch.float32, torch.float64):
        return None, f"torch has no CPU sparse matmul for {name} (its CSR products use MKL: fp32/fp64 only)"
    if sparsity < CSR_MIN_SPARSITY:
        return None, (f"no sparse kernel beats dense at {sparsity:.0%} unstructured sparsity "
                      f"(CSR is tried from {CSR_MIN_SPARSITY:.0%}; see benchmarks/sparsity_speed.py)")
    return CSRKernel, None


def _autocast_factory(device: torch.device, precision: str, weight_dtype: torch.dtype) -> Callable[[], Any]:
    """The context the training forward runs in: autocast when fp32 weights meet a 16-bit precision.

    (``Trainer`` runs fp16 under autocast with fp32 weights, and bf16 on a bf16 model without it.)
    """
    if precision == "fp32" or weight_dtype != torch.float32:
        return contextlib.nullcontext
    dtype = torch.float16 if precision == "fp16" else torch.bfloat16
    return lambda: torch.autocast(device.type, dtype=dtype)


def _time_layer(dense: nn.Linear, kernel: "KernelLinear", tokens: int, dtype: torch.dtype,
                autocast: Callable[[], Any], synchronize: Callable[[], None]) -> tuple[float, float]:
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


# --------------------------------------------------------------------------- kernels

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


class SparseKernel:
    """Sparse operands of one pruned weight, rebuilt when the weight changes (once per optimizer step)."""

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

    def self_check(self, dense: nn.Linear, autocast: Callable[[], Any]) -> None:
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


# --------------------------------------------------------------------------- records

MFU_BASIS = "dense-equivalent FLOPs (zero weights counted, as the dense model)"


def record_metrics(sparse_metrics: dict[str, Any], cfg, seq_len: int, flops_per_step: int, tokens_per_step: int,
                   step_s: float, finetune_losses: list[float]) -> dict[str, Any]:
    """A training record's sparsity fields: FLOPs both ways, measured sparsity, execution path, fine-tuning.

    Args:
        sparse_metrics: ``WeightSparsity.metrics()`` taken after the last sparse step.
        cfg: the model's ``GPTConfig``.
        seq_len: tokens per sample.
        flops_per_step: the dense model's FLOPs per optimizer step per device (what MFU uses).
        tokens_per_step: tokens per optimizer step per device.
        step_s: median step time.
        finetune_losses: losses of the dense fine-tuning steps after the sparse ones (may be empty).
    """
    from accel_kit import flops

    per_token = flops.sparse_gpt_flops_per_token(
        cfg.n_layers, cfg.hidden_size, seq_len, cfg.padded_vocab_size,
        nonzero_block_weights=sparse_metrics["nonzero_block_weights"], mlp_ratio=cfg.mlp_ratio)
    out = {
        "flops_dense_equivalent": flops_per_step,
        "flops_effective": per_token * tokens_per_step,
        "flops_per_token_effective": per_token,
        "tflops_effective_per_device": flops.tflops(per_token * tokens_per_step, step_s),
        "mfu_basis": MFU_BASIS,
        **sparse_metrics,
    }
    if finetune_losses:
        out |= {"finetune_losses": finetune_losses, "finetune_loss_last": finetune_losses[-1]}
    return out
