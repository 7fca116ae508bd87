"""What a training record says about sparsity: FLOPs both ways (dense-equivalent, which MFU
uses, and effective), next to ``WeightSparsity.metrics()`` and the dense fine-tuning losses.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from accel_kit.json_types import JSONObject

if TYPE_CHECKING:
    from accel_kit.models.family import FlopTerms

MFU_BASIS = "dense-equivalent FLOPs (zero weights counted, as the dense model)"


def record_metrics(sparse_metrics: JSONObject, flop_terms: FlopTerms, flops_per_step: int, tokens_per_step: int,
                   step_s: float, finetune_losses: list[float]) -> JSONObject:
    """A training record's sparsity fields: FLOPs both ways, measured sparsity, execution path, fine-tuning.

    Args:
        sparse_metrics: ``WeightSparsity.metrics()`` taken after the last sparse step.
        flop_terms: the model's ``accel_kit.models.FlopTerms`` at the point's sequence length.
        flops_per_step: the dense model's FLOPs per optimizer step per device (what MFU uses).
        tokens_per_step: tokens per optimizer step per device.
        step_s: median step time.
        finetune_losses: losses of the dense fine-tuning steps after the sparse ones (may be empty).
    """
    from accel_kit import flops

    per_token = flop_terms.sparse(sparse_metrics["nonzero_block_weights"])
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
