"""Parallelism beyond DDP, on torch's own APIs: FSDP2, DTensor tensor parallelism, context parallelism, and
expert parallelism, and the trainer for them.

The ranks form a device mesh ``(pp, dp, cp, tp)`` (``torch.distributed.device_mesh``); with expert
parallelism ``dp`` is itself ``dp_mod_ep x ep`` (``EXPERT_MESH_DIMS``), flattened back into ``dp`` for what
is not an expert. Tensor parallelism is the family's plan (``Family.apply_tensor_parallel``: column-wise then
row-wise linears per block, heads split) on the mesh's ``tp`` dimension; FSDP2 (``fully_shard``) shards
every block, then the root, over ``dp`` (with ``cp`` folded in). Under engine ddp with tensor, context or
expert parallelism the gradients are averaged over ``dp`` (and ``cp``) after the step's micro-batches (DDP
itself takes no DTensor parameters, nor parameters that differ between its ranks).

Context parallelism is torch's ``context_parallel`` (``torch.distributed.tensor.experimental``), applied
as torchtitan's train loop applies it: each micro-batch's forward and backward run inside it, which
shards the tokens, the targets and the family's position buffers (``Family.position_buffers``) over the
mesh's ``cp`` ranks in its load-balanced order and replaces SDPA by ring attention over their key/value
shards. Each rank's loss is the mean over its shard's targets; the ranks' gradients are parts of one
micro-batch's, averaged over cp with dp (so with no padded targets the step is one process's step over
the whole sequence). It is written for CUDA and has not run here: torch's ring attention takes CUDA's
fused SDPA kernels only, and a CPU point with cp above 1 is ``unsupported`` before it starts.

Expert parallelism is the family's (``Family.apply_expert_parallel``, ``accel_kit.models.moe.parallel``):
each MoE layer's routed experts sharded over the mesh's ``ep`` ranks, its tokens exchanged by all-to-all.
The other parameters are replicated over ``dp`` and their gradients averaged over it as without ep; an
expert's gradient, which already sums the contributions of every ep rank's tokens, is summed over the
``dp_mod_ep`` ranks holding the same experts and divided by dp (under FSDP2: the experts sharded over
``dp_mod_ep``, whose reduce-scatter averages over it, then divided by ep), so it is the same mean over dp's
micro-batches as a replicated parameter's. This follows torchtitan, which carves ep out of ``dp_shard`` and
shards the experts' FSDP over ``dp_shard_mod_ep``.

``ParallelTrainer`` is ``accel_kit.engine.step.Trainer`` with what sharded parameters change: bf16 under
FSDP keeps fp32 (sharded) parameters and lets the mixed-precision policy cast them per forward (so no
master copy), the optimizer's parameter groups hold DTensors and plain tensors apart (a foreach kernel
takes one kind), and clipping sums each gradient's squared norm over its shards (an expert shard's over ep).
"""
from __future__ import annotations

import contextlib
import dataclasses
import statistics
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, TypedDict

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from accel_kit.engine.step import Trainer, param_groups
from accel_kit.precision import PrecisionSpec, spec
from accel_kit.timing import Stopwatch, Timing

from accel_kit.mesh import MESH_DIMS

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup
    from torch.distributed.device_mesh import DeviceMesh

    from accel_kit.devices.types import Batches
    from accel_kit.engine.point import TrainPoint
    from accel_kit.engine.step import OptimConfig
    from accel_kit.models.family import Family
    from accel_kit.models.moe.parallel import ExpertShards


# With expert parallelism, dp as dp / ep replicas of each expert shard (outer) x ep shards (inner): an ep group is
# dp ranks that are neighbours, as their data ranks are (``layout.data_rank``).
EXPERT_MESH_DIMS = ("pp", "dp_mod_ep", "ep", "cp", "tp")


def device_mesh(point: TrainPoint, device: torch.device) -> DeviceMesh:
    """The point's ranks as a ``(pp, dp, cp, tp)`` mesh (over the process group the worker started); with ep above
    1, as ``EXPERT_MESH_DIMS`` (``data_parallel_mesh`` is their ``dp``)."""
    from torch.distributed.device_mesh import init_device_mesh

    if point.ep == 1:
        return init_device_mesh(device.type, point.mesh_shape, mesh_dim_names=MESH_DIMS)
    pp, dp, cp, tp = point.mesh_shape
    return init_device_mesh(device.type, (pp, dp // point.ep, point.ep, cp, tp), mesh_dim_names=EXPERT_MESH_DIMS)


def data_parallel_mesh(point: TrainPoint, mesh: DeviceMesh) -> DeviceMesh:
    """The mesh's ``dp`` ranks: with ep above 1, its ``dp_mod_ep x ep`` flattened (made once, then the root's)."""
    return mesh["dp"] if point.ep == 1 else mesh["dp_mod_ep", "ep"]._flatten("dp")


def gradient_mesh(point: TrainPoint, mesh: DeviceMesh) -> DeviceMesh:
    """The ranks whose gradients are averaged: ``dp``, with ``cp`` folded in where it is above 1 (a
    context-parallel group's ranks hold parts of one micro-batch's gradient), as torchtitan's ``dp_shard_cp``."""
    if point.cp == 1:
        return data_parallel_mesh(point, mesh)
    return mesh["dp", "cp"]._flatten("dp_cp")


def fsdp_wrap(model: nn.Module, blocks: Iterable[nn.Module], mesh: DeviceMesh, precision: str) -> nn.Module:
    """FSDP2 on every block, then the root (embedding, final norm, head): a block's parameters are
    all-gathered just before it runs and freed after, so one block's worth is whole at a time."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    # bf16: compute in bf16, reduce-scatter the gradients in fp32 (a sum over dp ranks loses less), and
    # keep the sharded parameters (what AdamW updates) in fp32: the master copy is the shard itself.
    policy = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
              if precision == "bf16" else MixedPrecisionPolicy())
    for block in blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model


def fsdp_experts(experts: ExpertShards, mesh: DeviceMesh, precision: str) -> None:
    """FSDP2 on each MoE layer's expert shard over ``mesh`` (the dp / ep ranks holding the same experts), before
    its block's: their gradients are reduce-scattered over those ranks (averaged over them; the trainer
    divides them by ep after, ``ParallelTrainer.optimizer_step``)."""
    from torch.distributed.fsdp import register_fsdp_forward_method

    for module in experts.modules:
        fsdp_wrap(module, [], mesh, precision)
        # the dispatcher calls the experts' forward_sorted, not forward: gathered around it as around a forward
        register_fsdp_forward_method(module, "forward_sorted")


def parallelize(model: nn.Module, point: TrainPoint, family: Family,
                mesh: DeviceMesh) -> tuple[nn.Module, ExpertShards | None]:
    """``model`` with the point's tensor parallelism (the family's plan), expert parallelism (the family's) and,
    for engine fsdp, FSDP2; and the family's expert shards (None without ep)."""
    if point.tp > 1:
        family.apply_tensor_parallel(model, mesh["tp"])
    experts = family.apply_expert_parallel(model, mesh["ep"]) if point.ep > 1 else None
    if point.engine == "fsdp":
        if experts is not None:
            fsdp_experts(experts, mesh["dp_mod_ep"], point.precision)
        blocks = getattr(model, family.pipeline_stages(model).blocks)
        model = fsdp_wrap(model, blocks, gradient_mesh(point, mesh), point.precision)
    return model, experts


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


class ParallelTrainer(Trainer):
    """``Trainer`` over sharded parameters (FSDP2, tensor parallel) or sequences (context parallel).

    ``dp_group``: average the gradients over it after each step's micro-batches (engine ddp with tensor or
    context parallelism); None: FSDP does, or there is one replica. ``cp_mesh``: the context-parallel ranks
    each micro-batch's sequence is sharded over, with the model's ``position_buffers`` (tensor, sequence
    dimension) sharded too; ``cp_backends``: the SDPA kernels to restrict attention to there (None: as set
    around the window). None: no context parallelism. ``synchronize``: the device's (the adapter's), for
    ``grad_sync``, the time in the gradient reductions this trainer issues itself (``extra_metrics``).
    ``experts``: the family's expert shards under expert parallelism (``accel_kit.models.moe.parallel``), with
    ``expert_group``, the ranks holding the same shard, over which engine ddp sums their gradients (None: one
    rank, or FSDP does).
    """

    def __init__(self, *args: object, fsdp: bool, dp_group: ProcessGroup | None = None,
                 cp_mesh: DeviceMesh | None = None, position_buffers: list[tuple[torch.Tensor, int]] = (),
                 cp_backends: list | None = None, synchronize: Callable[[], None] | None = None,
                 experts: ExpertShards | None = None, expert_group: ProcessGroup | None = None, **kwargs: object):
        self.fsdp, self.dp_group = fsdp, dp_group
        self.cp_mesh, self.position_buffers, self.cp_backends = cp_mesh, list(position_buffers), cp_backends
        self.grad_sync = Stopwatch(synchronize or (lambda: None))
        self.experts, self.expert_group = experts, expert_group
        if experts is not None:
            experts.stats.synchronize = synchronize or (lambda: None)
        super().__init__(*args, **kwargs)
        # The expert shards' parameters (after FSDP's wrapping: its DTensors) and their fp32 masters, by identity
        # (a pipeline's norm takes a filtered list): their gradients reduce over other ranks than the rest's.
        shards = {id(p) for p in experts.parameters()} if experts is not None else set()
        self.expert_ids = shards | {id(m) for p, m in zip(self.params, self.master or []) if id(p) in shards}

    def extra_metrics(self, timing: Timing) -> dict[str, float]:
        """The exposed gradient reductions per step (median over the timed steps; on this path one timed call
        is one optimizer step), and their share of the step. FSDP's and DDP's own overlap the backward."""
        out = self.experts.stats.metrics(len(timing.times_s), timing.median_s) if self.experts is not None else {}
        if not self.grad_sync.regions:  # it reduced no gradient itself
            return out
        sync_s = statistics.median(self.grad_sync.times_s[-len(timing.times_s):])
        return out | {"grad_sync_s": sync_s, "grad_sync_pct": 100 * sync_s / timing.median_s}

    @contextlib.contextmanager
    def sequence_context(self, x: torch.Tensor, y: torch.Tensor):
        """Under context parallelism: ``x``, ``y`` (B, T) and the position buffers sharded in place along the
        sequence (T / cp tokens each), and SDPA as torch's ring attention, for one micro-batch's forward and
        backward (the backward's ring runs in it too)."""
        if self.cp_mesh is None:
            yield
            return
        from torch.distributed.tensor.experimental import context_parallel

        with contextlib.ExitStack() as stack:
            # The tokens and targets are this micro-batch's own, so they are not put back; the positions
            # are, for the next micro-batch to shard again.
            stack.enter_context(context_parallel(
                self.cp_mesh, buffers=[x, y] + [t for t, _ in self.position_buffers],
                buffer_seq_dims=[1, 1] + [dim for _, dim in self.position_buffers], no_restore_buffers={x, y}))
            if self.cp_backends is not None:
                from torch.nn.attention import sdpa_kernel

                stack.enter_context(sdpa_kernel(self.cp_backends))
            yield

    def accumulate(self) -> torch.Tensor:
        total = super().accumulate()
        if self.cp_mesh is not None:  # each rank's loss is its shard's mean: the micro-batch's is their mean
            dist.all_reduce(total, group=self.cp_mesh.get_group())
            total /= self.cp_mesh.size()
        return total

    def precision_spec(self, precision: str) -> PrecisionSpec:
        kind = spec(precision)
        if self.fsdp and kind.master_weights:  # fp32 shards, cast per forward by FSDP's policy
            return dataclasses.replace(kind, model_dtype=torch.float32, master_weights=False)
        return kind

    def make_optimizer(self, params: nn.Module | list[torch.Tensor]) -> torch.optim.Optimizer:
        """AdamW with each weight-decay group split into its DTensors and its plain tensors."""
        groups = []
        for group in param_groups(params, self.optim_cfg.weight_decay):
            for is_dtensor in (True, False):
                part = [p for p in group["params"] if isinstance(p, DTensor) == is_dtensor]
                if part:
                    groups.append(group | {"params": part})
        cfg = self.optim_cfg  # AdamW as ``step.make_optimizer`` builds it, over the split groups
        return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), fused=self.fused_optimizer)

    def _no_sync(self, last: bool):
        if self.fsdp:  # FSDP2: reduce-scatter the gradients once, after the last micro-batch
            self.model.set_requires_gradient_sync(last)
        return contextlib.nullcontext()

    def clip_gradients(self, params: list[torch.Tensor], max_norm: float) -> None:
        """Scale to a global norm of at most ``max_norm``: a sharded gradient's norm reduced over its shards
        (a replicated one's counted once), then every local shard scaled by the same factor."""
        squares = self.squared_grad_norm(params)
        scale = (max_norm / (squares.sqrt() + 1e-6)).clamp(max=1.0)
        for g in (p.grad for p in params if p.grad is not None):
            _local(g).mul_(scale.to(g.dtype))

    def squared_grad_norm(self, params: list[torch.Tensor]) -> torch.Tensor:
        """The squared norm of all of ``params``' gradients together: each sharded one's over its shards, the
        expert shards' summed over the ep ranks (each holds other experts)."""
        squares, expert_squares = torch.zeros((), device=self.device), torch.zeros((), device=self.device)
        for p in (p for p in params if p.grad is not None):
            norm = torch.linalg.vector_norm(p.grad)
            square = (norm.full_tensor() if isinstance(norm, DTensor) else norm).float() ** 2
            if id(p) in self.expert_ids:
                expert_squares += square
            else:
                squares += square
        if self.experts is not None:
            dist.all_reduce(expert_squares, group=self.experts.ep_group)
        return squares + expert_squares

    def copy_masters(self) -> None:
        """As ``Trainer``'s, on the local shards: DTensor has no foreach copy, and a master is placed as its
        parameter is, so shard copies into shard."""
        with torch.no_grad():
            torch._foreach_copy_([_local(p) for p in self.params], [_local(m) for m in self.master])

    def optimizer_step(self) -> None:
        if self.dp_group is not None:
            size = dist.get_world_size(self.dp_group)
            if self.expert_group is not None:
                # A rank whose experts received no rows this step has no gradient for them while a replica of
                # its shard may: zeros, so that every rank reduces the same tensors.
                for p in self.params:
                    if p.grad is None and id(p) in self.expert_ids:
                        p.grad = torch.zeros_like(p)
            grads = [(_local(p.grad), id(p) in self.expert_ids) for p in self.params if p.grad is not None]
            with self.grad_sync.region():
                _mean_over(self.dp_group, [g for g, expert in grads if not expert], size)
                # an expert's gradient sums every ep rank's tokens' already: over its replicas, divided by dp too
                _mean_over(self.expert_group, [g for g, expert in grads if expert], size)
        if self.fsdp and self.experts is not None:
            # FSDP averaged an expert's gradient over the dp / ep ranks holding its shard; each already sums the
            # ep ranks' tokens, so over ep too for dp's mean. (FSDP2's gradient divide factor would do it in
            # the reduce-scatter, but as NCCL's PREMUL_SUM, which gloo has not.)
            ep = dist.get_world_size(self.experts.ep_group)
            for p in self.params:
                if p.grad is not None and id(p) in self.expert_ids:
                    _local(p.grad).div_(ep)
        super().optimizer_step()
        self.grad_sync.end_step()
        if self.experts is not None:
            self.experts.stats.end_step()


def _mean_over(group: ProcessGroup | None, grads: list[torch.Tensor], divisor: int) -> None:
    """Sum ``grads`` in place over ``group`` (None: this rank alone) and divide them by ``divisor``: one
    all-reduce of them flattened together per dtype, not one per tensor (a few dozen small ones would cost
    each collective's latency again, as DDP's buckets avoid)."""
    from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for g in grads:
        by_dtype.setdefault(g.dtype, []).append(g)
    for same in by_dtype.values():
        flat = _flatten_dense_tensors(same)
        if group is not None:
            dist.all_reduce(flat, group=group)
        flat.div_(divisor)
        torch._foreach_copy_(same, list(_unflatten_dense_tensors(flat, same)))


class ContextParallelArgs(TypedDict, total=False):
    """``ParallelTrainer``'s context-parallel keywords (none where cp is 1)."""

    cp_mesh: DeviceMesh
    position_buffers: list[tuple[torch.Tensor, int]]
    cp_backends: list | None


def context_parallel_kwargs(point: TrainPoint, model: nn.Module, family: Family,
                            mesh: DeviceMesh) -> ContextParallelArgs:
    """``ParallelTrainer``'s context-parallel arguments for ``point`` ({} where cp is 1)."""
    if point.cp == 1:
        return ContextParallelArgs()
    buffers = family.position_buffers(model)
    for t, dim in buffers:  # the model reads a buffer's first T entries: it must cover exactly the sequence
        if t.shape[dim] != point.seq_len:
            raise RuntimeError(f"a position buffer of {family.name} holds {t.shape[dim]} positions, not the "
                               f"point's {point.seq_len}: context parallelism would shard it wrongly")
    backends = None
    if point.attention_kernel == "auto":  # torch's ring attention takes the fused kernels only, never math
        from torch.nn.attention import SDPBackend

        backends = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION]
    return ContextParallelArgs(cp_mesh=mesh["cp"], position_buffers=buffers, cp_backends=backends)


def _owned(batches: Batches) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """``batches`` with every tensor a copy of its own: context parallelism resizes them in place, and a
    batch already on the device is not copied by ``Trainer``'s move."""
    for x, y in batches:
        yield x.clone(), y.clone()


def parallel_trainer(point: TrainPoint, model: nn.Module, batches: Batches, device: torch.device, optim: OptimConfig,
                     family: Family, **kwargs: object) -> ParallelTrainer:
    """The trainer of a point with engine fsdp, or tp, cp or ep above 1: its mesh, its model sharded, its
    gradients' reduction, its sequences' sharding, its experts'."""
    from accel_kit.models import is_deferred, materialize_deferred

    mesh = device_mesh(point, device)
    model, experts = parallelize(model, point, family, mesh)
    if is_deferred(model):  # built on meta (``EagerModel.build_model``): each rank allocates and draws its shards
        materialize_deferred(model, device)
    dp_group = expert_group = None
    if point.engine == "ddp" and point.dp * point.cp > 1:
        dp_group = gradient_mesh(point, mesh).get_group()
        if experts is not None and point.dp > point.ep:
            expert_group = mesh["dp_mod_ep"].get_group()
    cp = context_parallel_kwargs(point, model, family, mesh)
    return ParallelTrainer(model, _owned(batches) if cp else iter(batches), device, point.precision, point.gas,
                           optim, fsdp=point.engine == "fsdp", dp_group=dp_group, experts=experts,
                           expert_group=expert_group, **cp, **kwargs)
