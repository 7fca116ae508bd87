"""Expert parallelism: each MoE layer's routed experts sharded over the ``ep`` ranks, every token copy sent to
its expert's rank and its output brought back, by two all-to-alls through torch.distributed.

A MoE layer routes each of its N tokens to k experts and hands its dispatcher ``(x (N, h), top_k_index (N, k),
top_k_weights (N, k), experts)``. ``LocalDispatch`` (``accel_kit.models.moe.dispatch``) computes every expert
in this process; ``ExpertParallelDispatch`` holds only this rank's E / ep experts (``apply_expert_parallel``
slices them) and:

1. sorts the N k token copies by expert (so the copies for rank p's experts are one contiguous run);
2. gathers every rank's per-expert counts (E each): each rank learns what it sends, what it receives from
   whom for each of its experts, and the ep group's load per expert (the record's imbalance);
3. dispatch: one ``all_to_all_single`` with uneven splits sends each run to its rank;
4. regroups the rows it received (source-major) by local expert and runs ``experts.forward_sorted``;
5. combine: the reverse all-to-all returns each copy's output to the rank its token came from, where the
   copies are unsorted, weighted by their router probability and summed over k, as ``LocalDispatch`` does.

The all-to-alls are an autograd Function over ``dist.all_to_all_single`` (the backward of each is the
reverse exchange), not ``_functional_collectives.all_to_all_single_autograd``, which also runs on gloo:
the Function can time its backward exchange too, and the backward's two all-to-alls are half of the
layer's. The counts gather is an all-gather rather than an all-to-all of the same E counts (torchtitan's
choice): the same bytes per rank, and every rank then knows the group's whole routing.

The layout (``accel_kit.engine.parallel``): ep is carved out of the data-parallel ranks, as torchtitan
carves it out of ``dp_shard``. The ``dp`` ranks split as ``dp / ep`` replicas x ``ep``; every parameter
but the routed experts is replicated over dp and its gradient averaged over dp, as without ep; a rank's
experts are replicated over the dp / ep ranks holding the same shard (``dp_mod_ep``). An expert's
gradient on its rank already sums every ep rank's tokens' contributions (the combine's backward brings
them), so it is summed over ``dp_mod_ep`` and divided by dp, not by the replicas: the same mean over
all of dp's micro-batches that a replicated parameter gets.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, TypeVar

import torch
import torch.distributed as dist
from torch import nn

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup
    from torch.distributed.device_mesh import DeviceMesh

T = TypeVar("T")


@dataclass
class ExpertParallelStats:
    """What the dispatchers of one model measured, one entry per optimizer step (``end_step``).

    ``a2a_s``: wall seconds in the counts gather, the dispatch and the combine all-to-alls, forward and
    backward, over every MoE layer and micro-batch of the step (device synchronised around each, as every
    clock here: the compute after an exchange waits on it anyway), the wait for the group's slowest rank
    included (a rank that reaches the exchange first waits there for the busier one). ``imbalance``: per
    step, each MoE layer's busiest expert's token copies over the mean expert's, over the ep group's tokens
    and the step's micro-batches, averaged over the layers (1: balanced; E / k: every copy on k experts).
    """

    synchronize: Callable[[], None] = lambda: None
    a2a_s: list[float] = field(default_factory=list)
    imbalance: list[float] = field(default_factory=list)
    _open_s: float = 0.0
    _loads: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> token copies per expert (E,)

    def time(self, fn: Callable[[], T]) -> T:
        self.synchronize()
        start = time.perf_counter()
        out = fn()
        self.synchronize()
        self._open_s += time.perf_counter() - start
        return out

    def count(self, layer: int, load: torch.Tensor) -> None:
        """Add one call's ep-group token copies per expert (E,) to ``layer``'s for this step."""
        self._loads[layer] = self._loads.get(layer, 0) + load

    def end_step(self) -> None:
        self.a2a_s.append(self._open_s)
        ratios = [float(load.max() / load.float().mean()) for load in self._loads.values() if load.sum() > 0]
        self.imbalance.append(statistics.fmean(ratios) if ratios else float("nan"))
        self._open_s, self._loads = 0.0, {}

    def metrics(self, steps: int, step_s: float) -> dict[str, float]:
        """The record's figures: medians over the last ``steps`` steps (the timed ones), the all-to-all time's
        share of the median step ``step_s``."""
        a2a_s = statistics.median(self.a2a_s[-steps:])
        return {"a2a_time_s": a2a_s, "a2a_pct": 100 * a2a_s / step_s,
                "expert_load_imbalance": statistics.median(self.imbalance[-steps:])}


class _AllToAll(torch.autograd.Function):
    """``dist.all_to_all_single`` of rows with uneven splits; its backward is the reverse exchange."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, out_splits: list[int], in_splits: list[int], group: ProcessGroup,
                stats: ExpertParallelStats) -> torch.Tensor:
        ctx.splits, ctx.group, ctx.stats = (out_splits, in_splits), group, stats
        return _exchange(x, out_splits, in_splits, group, stats)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        out_splits, in_splits = ctx.splits
        return _exchange(grad, in_splits, out_splits, ctx.group, ctx.stats), None, None, None, None


def _exchange(x: torch.Tensor, out_splits: list[int], in_splits: list[int], group: ProcessGroup,
              stats: ExpertParallelStats) -> torch.Tensor:
    out = x.new_empty((sum(out_splits), *x.shape[1:]))
    stats.time(lambda: dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group))
    return out


class ExpertParallelDispatch:
    """The dispatcher of one MoE layer whose experts are sharded over ``ep_group``: this rank holds experts
    ``rank * E / ep`` to ``(rank + 1) * E / ep - 1`` of the layer's ``n_experts``. Called as ``LocalDispatch``
    is; keeps ``last_tokens_per_expert`` (E,), this rank's token copies per expert in the last call."""

    def __init__(self, ep_group: ProcessGroup, n_experts: int, stats: ExpertParallelStats, layer: int = 0):
        self.group, self.n_experts, self.stats, self.layer = ep_group, n_experts, stats, layer
        self.ep, self.rank = dist.get_world_size(ep_group), dist.get_rank(ep_group)
        self.n_local = n_experts // self.ep
        self.last_tokens_per_expert: torch.Tensor | None = None

    def __call__(self, x: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor,
                experts: nn.Module) -> torch.Tensor:
        n, k = top_k_index.shape
        flat = top_k_index.reshape(-1)  # (N k,) each copy's expert
        order = torch.argsort(flat, stable=True)  # copies sorted by expert, a token's copies in k order
        counts = torch.bincount(flat, minlength=self.n_experts)  # (E,)
        self.last_tokens_per_expert = counts.detach()
        send, recv, recv_rows, local_counts = self._splits(counts)
        received = _AllToAll.apply(x[order // k], recv_rows, send, self.group, self.stats)
        # ``received`` is source-major (rank p's copies for each of our experts, then rank p + 1's): regrouped
        # expert-major for forward_sorted, source order kept within an expert.
        local = torch.arange(self.n_local, device=x.device).repeat(self.ep)
        by_expert = torch.argsort(torch.repeat_interleave(local, recv.reshape(-1)), stable=True)
        y = experts.forward_sorted(received[by_expert], local_counts)
        y = y[torch.argsort(by_expert)]  # back to source-major
        returned = _AllToAll.apply(y, send, recv_rows, self.group, self.stats)  # (N k, h), sorted by expert
        copies = returned[torch.argsort(order)].view(n, k, -1)  # back to (token, k) order
        return (copies * top_k_weights.unsqueeze(-1).to(copies.dtype)).sum(dim=1)

    def _splits(self, counts: torch.Tensor) -> tuple[list[int], torch.Tensor, list[int], torch.Tensor]:
        """The exchange's sizes from this rank's per-expert counts (E,): the rows it sends to each rank, the
        rows it receives from each rank for each of its experts ((ep, E / ep), on the device), the rows it
        receives from each rank, and its experts' rows in all (E / ep,). The all-to-all takes its splits on
        the host: one device-to-host copy for both."""
        gathered = counts.new_empty(self.ep * self.n_experts)
        self.stats.time(lambda: dist.all_gather_single(gathered, counts, group=self.group))
        gathered = gathered.view(self.ep, self.n_experts)  # (source rank, expert)
        self.stats.count(self.layer, gathered.sum(0))
        recv = gathered[:, self.rank * self.n_local:(self.rank + 1) * self.n_local]
        sizes = torch.cat([counts.view(self.ep, self.n_local).sum(1), recv.sum(1)]).tolist()
        return sizes[:self.ep], recv, sizes[self.ep:], recv.sum(0)


@dataclass
class ExpertShards:
    """What ``apply_expert_parallel`` made: the experts modules holding this rank's shard (one per MoE layer),
    the ep ranks' group and their dispatchers' shared measurements."""

    modules: list[nn.Module]
    ep_group: ProcessGroup
    stats: ExpertParallelStats

    def parameters(self) -> list[nn.Parameter]:
        """The shards' parameters as they are now (FSDP2 replaces them by DTensors when it wraps a module)."""
        return [p for module in self.modules for p in module.parameters()]


def apply_expert_parallel(model: nn.Module, ep_mesh: DeviceMesh) -> ExpertShards:
    """Shard every MoE layer's routed experts over ``ep_mesh`` in place: this rank keeps its E / ep experts'
    slice of each expert parameter (dimension 0 is the expert's), and the layer dispatches through
    ``ExpertParallelDispatch``. A slice of a freshly built model is the same model, so with the same seed
    the ranks together hold exactly one process's experts.
    """
    group = ep_mesh.get_group()
    ep, rank = dist.get_world_size(group), dist.get_rank(group)  # the rank the dispatcher takes its experts by
    stats = ExpertParallelStats()
    layers = model.moe_layers()
    for index, layer in enumerate(layers):
        n_experts = layer.router.out_features
        if n_experts % ep:
            raise ValueError(f"ep {ep} does not divide the {n_experts} experts of MoE layer {index}")
        n_local = n_experts // ep
        for name, param in list(layer.experts.named_parameters(recurse=False)):
            local = param.detach()[rank * n_local:(rank + 1) * n_local].clone()
            setattr(layer.experts, name, nn.Parameter(local, requires_grad=param.requires_grad))
        if hasattr(layer.experts, "n_experts"):  # the experts module's own count: now this rank's
            layer.experts.n_experts = n_local
        layer.dispatcher = ExpertParallelDispatch(group, n_experts, stats, layer=index)
    return ExpertShards([layer.experts for layer in layers], group, stats)
