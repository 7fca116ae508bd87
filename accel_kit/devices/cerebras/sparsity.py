"""Weight sparsity through ``cstorch.sparse``: Static, magnitude (``topk``) masks, kept by cstorch."""
from __future__ import annotations

import cerebras.pytorch as cstorch
import torch

from accel_kit.devices.types import TrainPointFields
from accel_kit.json_types import JSONObject
from accel_kit.sparsity.execution import SparseExecution, declare_kind
from accel_kit.sparsity.prune import prunable_layers

# A CS-2 skips the zero weights of a pruned layer in hardware: an execution kind of its own for the
# tables (recorded as ``sparse_execution_kind``), declared by this device.
CSX_EXECUTION = declare_kind("csx", "zeros skipped by the CS-2", kernel=True)


class CstorchSparsity:
    """Weight sparsity through ``cstorch.sparse``: Static, magnitude (``topk``) masks on every block linear.

    The same layers and the same rule as ``accel_kit.sparsity.WeightSparsity`` (the fraction of
    each block linear's weights with the smallest magnitude is pruned; cstorch keeps
    floor((1 - s) n) weights where accel-kit keeps n - round(s n), at most one fewer), but kept by cstorch:
    it prunes the weights before each forward, the gradients in a hook and AdamW's state in
    an optimizer hook, and on a CS-2 the compiler is told the sparsity level. ``attach`` (in
    the trainer, after ``cstorch.compile`` and the optimizer, as cstorch requires) applies it.
    """

    def __init__(self, model: torch.nn.Module, point: TrainPointFields, backend_type: str):
        self.model, self.level, self.backend_type = model, float(point.sparsity), backend_type
        self.layers = prunable_layers(model) if self.level > 0 else []
        self.algorithm = None
        if not self.layers:
            self.execution = SparseExecution("dense-model")
        elif backend_type == "CSX":
            self.execution = SparseExecution(CSX_EXECUTION, "every pruned layer (cstorch.sparse Static)",
                                             kernel="CS-2 sparse weight streaming")
        else:
            self.execution = SparseExecution("dense-zeros", "cstorch.sparse Static masks; the cstorch CPU "
                                                            "backend multiplies the masked weights in dense matmuls")

    @property
    def active(self) -> bool:
        return bool(self.layers)

    def apply_masks(self) -> None:
        """Nothing to do after a step: cstorch keeps the masks itself."""

    def attach(self, optimizer) -> None:
        if not self.active:
            return
        self.algorithm = cstorch.sparse.configure({
            "algorithm": "static", "sparsity": self.level, "init_method": "topk",
            "param_filter": [f"{name}.weight" for name, _ in self.layers]})
        self.algorithm.apply(self.model)
        self.algorithm.apply(optimizer)

    def _host(self, tensor: torch.Tensor) -> torch.Tensor:
        return cstorch.backend().to_cpu(tensor.detach())

    def masks(self) -> dict[str, torch.Tensor]:
        """Each pruned layer's cstorch mask (True: kept), on the host."""
        return {name: self._host(linear.weight_mask).bool() for name, linear in self.layers}

    def metrics(self) -> JSONObject:
        """What a record says about the sparsity, measured from the weights and masks now."""
        fractions, zeros, total, kept, masked_nonzero = {}, 0, 0, 0, 0
        layers = self.layers or prunable_layers(self.model)
        masks = self.masks() if self.layers else {}
        for name, linear in layers:
            weight = self._host(linear.weight)
            n_zero = int((weight == 0).sum())
            fractions[name] = n_zero / weight.numel()
            zeros, total = zeros + n_zero, total + weight.numel()
            if name in masks:
                kept += int(masks[name].sum())
                masked_nonzero += int(((weight != 0) & ~masks[name]).sum())
        out = {
            "sparsity_measured": zeros / total,
            "sparsity_layer_min": min(fractions.values()) if self.layers else None,
            "sparsity_layer_max": max(fractions.values()) if self.layers else None,
            "pruned_layers": len(self.layers),
            "nonzero_block_weights": kept if self.layers else total,
            "sparse_execution": self.execution.describe(),
            "sparse_execution_kind": self.execution.kind,
            "sparse_kernel": self.execution.kernel,
            "sparse_kernel_layers": len(self.layers) if self.execution.kernel else 0,
            "sparse_kernel_timing": [],
        }
        if self.layers:
            out |= {"sparsity_algorithm": "cstorch.sparse Static, init topk (magnitude)",
                    "sparsity_mask_density": kept / total,
                    # Pruned weights that are not zero: 0 when the masks held through training.
                    "sparsity_masked_nonzero": masked_nonzero}
        return out

    def release(self) -> None:
        """Every weight trains again (dense fine-tuning): the masks become all-ones.

        cstorch prunes with the mask buffers on every forward, gradient and optimizer step, so
        filling them is enough on the CPU backend (on CSX the level is compiled in; the adapter
        records such a point as unsupported).
        """
        with torch.no_grad():
            for _, linear in self.layers:
                linear.weight_mask.fill_(True)
        self.layers = []
