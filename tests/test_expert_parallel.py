"""Expert parallelism (issue 31): the all-to-all dispatcher against the local one on two gloo ranks, forward
and backward, with deliberately uneven splits."""
import os

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from accel_kit.models.moe.parallel import ExpertParallelDispatch, ExpertParallelStats
from ranks import rendezvous, spawn

E, K, H, FFN, TOKENS = 4, 2, 8, 6, 10


class Experts(nn.Module):
    """SwiGLU experts as the MoE family holds them: (E, 2F, h) and (E, h, F), each expert on its run of rows."""

    def __init__(self, n_experts: int):
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.randn(n_experts, 2 * FFN, H) / H ** 0.5)
        self.down_proj = nn.Parameter(torch.randn(n_experts, H, FFN) / FFN ** 0.5)

    def forward_sorted(self, x, counts):
        outs = []
        for e, rows in enumerate(x.split(counts.tolist())):
            gate, up = (rows @ self.gate_up_proj[e].T).chunk(2, dim=-1)
            outs.append((F.silu(gate) * up) @ self.down_proj[e].T)
        return torch.cat(outs) if outs else x[:0]


def local_dispatch(x, top_k_index, top_k_weights, experts):
    """The reference: every expert here, each token's copies weighted and summed."""
    n, k = top_k_index.shape
    flat = top_k_index.reshape(-1)
    order = torch.argsort(flat, stable=True)
    y = experts.forward_sorted(x[order // k], torch.bincount(flat, minlength=E))
    return (y[torch.argsort(order)].view(n, k, -1) * top_k_weights.unsqueeze(-1)).sum(1)


def _routing(rank):
    # rank 0 sends nearly everything to expert 0 (on rank 0) and nothing to expert 3; rank 1 sends all its
    # copies to rank 0's experts except one: splits of 17 : 3 and 19 : 1 rows, and an expert with no rows.
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(TOKENS, H, generator=g, requires_grad=True)
    index = torch.tensor([[0, 1]] * 8 + [[0, 2], [2, 1]]) if rank == 0 else torch.tensor([[1, 0]] * 9 + [[2, 0]])
    weights = torch.rand(TOKENS, K, generator=g).softmax(-1).requires_grad_(True)
    return x, index, weights


def _dispatch_ranks(rank, meet):
    os.environ.update(meet)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    full = Experts(E)
    x, index, weights = _routing(rank)
    reference = local_dispatch(x, index, weights, full)
    reference.square().sum().backward()
    expected = [x.grad.clone(), weights.grad.clone(), full.gate_up_proj.grad.clone(), full.down_proj.grad.clone()]
    for g in expected[2:]:  # a rank's expert gradient sums every rank's tokens' contributions
        dist.all_reduce(g)
    local = Experts(E // 2)
    with torch.no_grad():
        local.gate_up_proj.copy_(full.gate_up_proj[2 * rank:2 * rank + 2])
        local.down_proj.copy_(full.down_proj[2 * rank:2 * rank + 2])
    x.grad = weights.grad = None
    stats = ExpertParallelStats()
    out = ExpertParallelDispatch(dist.group.WORLD, E, stats)(x, index, weights, local)
    out.square().sum().backward()
    torch.testing.assert_close(out, reference)
    got = [x.grad, weights.grad, local.gate_up_proj.grad, local.down_proj.grad]
    expected[2:] = [g[2 * rank:2 * rank + 2] for g in expected[2:]]
    for name, a, b in zip(["x", "weights", "gate_up_proj", "down_proj"], got, expected):
        torch.testing.assert_close(a, b, msg=lambda m: f"rank {rank}: {name}: {m}")
    stats.end_step()
    # the group's load: expert 0 has 8 + 1 + 9 + 1 = 19 of 40 copies, the mean 10
    assert stats.imbalance == [pytest.approx(1.9)] and stats.a2a_s[0] > 0
    dist.destroy_process_group()


@pytest.mark.slow
def test_expert_parallel_dispatch_equals_local_forward_and_backward():
    with rendezvous(1) as meets:
        spawn(_dispatch_ranks, (meets[0],), 2)
