"""``WeightSparsity``: one model's pruned layers, the masks that keep them pruned through
training, how they execute (dense, or the sparse kernels ``select`` chose), and what the
record says about them.
"""
from __future__ import annotations

import torch
from torch import nn

from accel_kit.json_types import JSONObject
from accel_kit.precision import dtype_of
from accel_kit.sparsity.execution import SparseExecution
from accel_kit.sparsity.kernels import KernelLinear
from accel_kit.sparsity.prune import Pattern, PrunedLayer, check_pattern, magnitude_mask, prunable_layers
from accel_kit.sparsity.select import (KERNEL_MODES, KernelAdapter, autocast_factory, calibrate, candidate_kernel,
                                      chosen_execution)


class WeightSparsity:
    """Prunes a model's block linears by magnitude and keeps the pruned weights at zero.

    Usage::

        sparse = WeightSparsity(model, 0.9)            # prunes now; gradient hooks installed
        trainer = Trainer(..., after_step=sparse.apply_masks)
        sparse.select_kernels("auto", adapter, ...)    # optional: sparse execution where it helps
        sparse.zero_fraction()                         # measured sparsity of the pruned layers
        sparse.release()                               # back to a dense model (dense fine-tuning)
    """

    def __init__(self, model: nn.Module, sparsity: float, pattern: Pattern = "unstructured"):
        check_pattern(sparsity, pattern)
        self.model, self.sparsity, self.pattern = model, sparsity, pattern
        self.layers: list[PrunedLayer] = []
        self._hooks = []
        # How the pruned layers run (select_kernels decides); metrics() records its kind and its text.
        self.execution = SparseExecution("dense-model") if sparsity == 0 else \
            SparseExecution("dense-zeros", "no sparse kernel selected")
        self.kernel: str | None = None
        self.calibration: list[JSONObject] = []
        if sparsity == 0:
            return  # the dense baseline: nothing to prune or mask
        modules = dict(model.named_modules())
        for name, linear in prunable_layers(model):
            parent_name, _, attr = name.rpartition(".")
            # The mask is kept in the weight's dtype on every device (no per-device choice): the masks
            # are applied twice a step (the gradient hook, apply_masks), and on a CPU a bool select
            # (masked_fill, where, mul by a bool tensor) is branchy, 7x and more slower than a
            # same-dtype multiply at 60 % sparsity (a uint8 mask 2-3x; 2-core Xeon). On a GPU either
            # is one memory-bound pass. The price: 2 or 4 bytes per pruned-layer weight where a bool
            # mask takes 1, which on a GPU (bool until this change) is memory the fit estimate misses.
            keep = magnitude_mask(linear.weight, sparsity, pattern).to(linear.weight.dtype)
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

    def select_kernels(self, mode: str, adapter: KernelAdapter, precision: str, tokens: int, *,
                       force: bool = False) -> SparseExecution:
        """Choose how the pruned layers execute; sets and returns ``self.execution``.

        Args:
            mode: ``dense`` (zeros in a dense matmul) or ``auto`` (a sparse kernel for a layer
                where one exists here and it measured faster than dense at that layer's shape).
            adapter: the device adapter of the device the model is on: which sparse kernel exists
                there for the pattern and dtype (``sparse_kernel``), and its ``synchronize`` for the timing.
            precision: fp32 / fp16 / bf16 (the compute dtype of the products).
            tokens: rows of the products: micro-batch x sequence length.
            force: use the candidate kernel without timing it (tests: exercise the sparse path).
        """
        if mode not in KERNEL_MODES:
            raise ValueError(f"sparse_kernels must be one of {KERNEL_MODES}, got {mode!r}")
        if not self.layers:
            self.execution = SparseExecution("dense-model")
            return self.execution
        if mode == "dense":
            self.execution = SparseExecution("dense-zeros", "sparse_kernels=dense")
            return self.execution
        dtype = dtype_of(precision)
        kernel_cls, why_not = candidate_kernel(self.pattern, self.sparsity, adapter, dtype)
        if kernel_cls is None:
            self.execution = SparseExecution("dense-zeros", why_not)
            return self.execution
        autocast = autocast_factory(self.layers[0].module.weight, precision)
        chosen, entries = calibrate(self.layers, kernel_cls, dtype, autocast, tokens, adapter.synchronize, force)
        self.calibration += entries
        n_kernel = 0
        for layer in self.layers:
            if chosen[tuple(layer.module.weight.shape)]:
                module = KernelLinear(layer.module, kernel_cls(layer.mask, dtype))
                setattr(layer.parent, layer.attr, module)
                layer.module = module
                n_kernel += 1
        if n_kernel:
            self.kernel = kernel_cls.label
        self.execution = chosen_execution(kernel_cls, self.calibration, n_kernel, len(self.layers))
        return self.execution

        return self.execution

    def metrics(self) -> JSONObject:
        """What a record says about this run's sparsity (measured now) and execution."""
        fractions = self.layer_zero_fractions()
        return {
            "sparsity_measured": self.zero_fraction(),
            "sparsity_layer_min": min(fractions.values()) if fractions else None,
            "sparsity_layer_max": max(fractions.values()) if fractions else None,
            "pruned_layers": len(self.layers),
            "nonzero_block_weights": self.nonzero_weights(),
            "sparse_execution": self.execution.describe(),
            "sparse_execution_kind": self.execution.kind,
            "sparse_kernel": self.kernel,
            "sparse_kernel_layers": sum(isinstance(layer.module, KernelLinear) for layer in self.layers),
            "sparse_kernel_timing": self.calibration,
        }
