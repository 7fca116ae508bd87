"""Token dispatch of one MoE layer on one process: each token's k copies sorted by expert, the experts run
on their contiguous runs, and the outputs put back in token order, weighted and summed over the k.

An expert-parallel dispatcher (another ``__call__`` of the same signature) sends the sorted runs to the
ranks that hold their experts and back; the MoE MLP calls whichever it holds as ``dispatcher``.
"""
from __future__ import annotations

import torch


class LocalDispatch:
    """Every expert on this process. ``last_tokens_per_expert``: (E,) int64 of the last call, detached
    (the load-imbalance figures read it: the busiest expert's count over the mean)."""

    def __init__(self) -> None:
        self.last_tokens_per_expert: torch.Tensor | None = None

    def __call__(self, x2d: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor,
                 experts) -> torch.Tensor:
        """Args:
            x2d: (N, h) tokens.
            top_k_index: (N, k) int64, the experts each token is routed to.
            top_k_weights: (N, k), the router's weights of those experts.
            experts: a module with ``n_experts`` and ``forward_sorted(x_sorted, counts)`` (``moe.experts``).
        Returns:
            (N, h): sum over j of top_k_weights[:, j] x expert_{top_k_index[:, j]}(x).
        """
        n, k = top_k_index.shape
        flat = top_k_index.reshape(-1)  # (N k,) copy c is token c // k's j-th choice, j = c % k
        order = torch.argsort(flat, stable=True)  # copies grouped by expert, tokens in order within each
        counts = torch.bincount(flat, minlength=experts.n_experts)  # (E,)
        self.last_tokens_per_expert = counts.detach()
        y_sorted = experts.forward_sorted(x2d[order // k], counts)  # (N k, h)
        # back to copy order by a gather (its backward a scatter-add), then weight and sum each token's k
        y = y_sorted[torch.argsort(order)].view(n, k, -1)
        return (y * top_k_weights.unsqueeze(-1).to(y.dtype)).sum(dim=1)
