"""Magnitude pruning: which layers are pruned, the keep-masks (unstructured and 2:4), their checks.

Pure functions of a model's weights, and ``PrunedLayer``, the record of one pruned linear
that ``WeightSparsity`` keeps; no kernels and no device knowledge here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

Pattern = Literal["unstructured", "2:4"]
PATTERNS: tuple[str, ...] = ("unstructured", "2:4")


def prunable_layers(model: nn.Module) -> list[tuple[str, nn.Linear]]:
    """The linears the model's family prunes, by qualified name in ``model`` (wrappers included): every
    block's, as the paper prunes; embeddings, norms and the output projection stay dense."""
    from accel_kit.models import family_of_model

    return family_of_model(model).prunable_linears(model)


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
    # 1 where the weight is kept, 0 where pruned; shaped like the weight and in the weight's dtype
    # (why: WeightSparsity.__init__).
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
