"""Pipeline parallelism on ``torch.distributed.pipelining``: the model's blocks split into ``pp`` stages, one per rank.

Each rank builds the whole model from the point's seed (so the weights are one process's), then keeps
its stage only: its share of the blocks (``layout.stage_blocks``), the first stage the embedding, the
last the head, as the family names them (``Family.pipeline_stages``); the rest is dropped and freed.
The stage's forward is the family's (``Family.stage_forward``). torch's schedule (GPipe or 1F1B) cuts
each micro-batch into ``pp_microbatches`` chunks, sends the activations forward and their gradients
back between neighbouring stages, and runs the loss (the families' ``lm_loss``) on the last stage.

What a pipeline changes in the optimizer step (``PipelineTrainer``, a ``ParallelTrainer``):

- a weight tied across stages (GPT-2's and the tied Llamas' embedding and output projection: one
  parameter in one process, one copy on the first stage and one on the last here) has its two copies'
  gradients summed between those stages before the update, as Megatron-LM does, so both copies get one
  process's gradient and stay equal;
- the gradient norm that clipping needs is every stage's together (summed over ``pp``, a tied weight
  counted once);
- with dp above 1, each stage's gradients are averaged over its dp group (``ParallelTrainer``'s);
- only the last stage computes the losses: each step's is broadcast along the pipeline, so every rank
  returns it and rank 0 records it (as under DDP, the loss of its own replica's data).
"""
from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn

from accel_kit.engine.layout import stage_blocks
from accel_kit.engine.parallel import ParallelTrainer, device_mesh
from accel_kit.models.family import lm_loss

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import PipelineScheduleSingle

    from accel_kit.devices.types import Batches
    from accel_kit.engine.point import TrainPoint
    from accel_kit.engine.step import OptimConfig
    from accel_kit.models.family import Family


class StageModule(nn.Module):
    """One pipeline stage of a model: the model holding only the stage's parts, run by its family."""

    def __init__(self, model: nn.Module, family: Family, *, first: bool, last: bool):
        super().__init__()
        self.model, self.family, self.first, self.last = model, family, first, last

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.family.stage_forward(self.model, x, first=self.first, last=self.last)


def tied_parameters(model: nn.Module, family: Family) -> list[nn.Parameter]:
    """The parameters the embedding and the head share (found by identity, so no family has to say which),
    in the embedding's order: after the split the first and the last stage each hold a copy."""
    parts = family.pipeline_stages(model)
    embedding = {id(p): p for name in parts.embedding for p in getattr(model, name).parameters()}
    head = {id(p) for name in parts.head for p in getattr(model, name).parameters()}
    return [p for key, p in embedding.items() if key in head]


def split_stage(model: nn.Module, family: Family, stage: int, pp: int) -> StageModule:
    """Keep ``stage``'s part of ``model`` (in place: the other parts are set to None and freed) and return
    it as a module."""
    parts = family.pipeline_stages(model)
    first, last = stage == 0, stage == pp - 1
    blocks = getattr(model, parts.blocks)
    setattr(model, parts.blocks, nn.ModuleList(blocks[i] for i in stage_blocks(len(blocks), pp)[stage]))
    for name in (() if first else parts.embedding) + (() if last else parts.head):
        setattr(model, name, None)  # another stage's (a tied weight lives on in the part this stage keeps)
    return StageModule(model, family, first=first, last=last)


def scaled_loss(logits: torch.Tensor, targets: torch.Tensor, *, scale: float) -> torch.Tensor:
    """One chunk's loss times ``scale`` = 1 / (chunks x gas), so that its gradients sum to the mean over the
    step's micro-batches, as ``Trainer``'s do. The schedule runs with ``scale_grads=False``: its own scaling
    divides every gradient the stage holds at the end of each ``step``, which under gradient accumulation
    would divide the earlier micro-batches' share again."""
    return lm_loss(logits, targets) * scale


def _ends_group(mesh: DeviceMesh, pp: int) -> ProcessGroup | None:
    """The process group of this rank's pipeline's first and last stage (where a tied weight's copies live).

    pp 2: the pipeline's own group. Otherwise one new group per pipeline (every rank creates every one,
    in the same order, as ``new_group`` requires); None on a rank whose stage is neither end."""
    if pp == 2:
        return mesh["pp"].get_group()
    ranks, mine = mesh.mesh.reshape(pp, -1), None  # global ranks: a row per stage, a column per pipeline
    for pipeline in range(ranks.shape[1]):
        ends = [int(ranks[0, pipeline]), int(ranks[-1, pipeline])]
        group = dist.new_group(ends)
        if dist.get_rank() in ends:
            mine = group
    return mine


class PipelineTrainer(ParallelTrainer):
    """``ParallelTrainer`` over one pipeline stage: the schedule runs each micro-batch's forward and backward.

    Args (beyond ``Trainer``'s): ``stage``: this rank's ``PipelineStage``; ``schedule``: torch's schedule over it (its
    loss function scaled as ``scaled_loss``); ``pp_group``: this rank's pipeline;
    ``tied``: this stage's copies of weights tied across stages, summed over ``ends_group``;
    ``dp_group``: as ``ParallelTrainer``'s (None: dp 1).
    """

    def __init__(self, *args: object, stage: PipelineStage, schedule: PipelineScheduleSingle, pp_group: ProcessGroup,
                 tied: list[nn.Parameter], ends_group: ProcessGroup | None, **kwargs: object):
        self.stage, self.schedule = stage, schedule
        self.pp_group, self.tied, self.ends_group = pp_group, tied, ends_group
        self.last_rank = dist.get_global_rank(pp_group, dist.get_world_size(pp_group) - 1)
        super().__init__(*args, fsdp=False, **kwargs)
        # A tied weight's norm is counted on the first stage only: the last stage's copy is the same weight.
        tied_ids = {id(p) for p in tied}
        self.in_norm = [self.stage.is_first or id(p) not in tied_ids for p in self.params]

    def accumulate(self) -> torch.Tensor:
        """The schedule over ``gas`` micro-batches; returns the mean micro-batch loss on every rank of the pipeline.

        fp16 (a loss scaler and autocast) is refused under pp by the layout check, so nothing here scales.
        """
        total = torch.zeros((), device=self.device)
        for _ in range(self.gas):
            x, y = next(self.batches)  # every stage reads its replica's batch: the first uses x, the last y
            if self.stage.is_first:
                self.schedule.step(x.to(self.device, non_blocking=True), return_outputs=False)
            elif self.stage.is_last:
                losses: list[torch.Tensor] = []
                self.schedule.step(target=y.to(self.device, non_blocking=True), losses=losses, return_outputs=False)
                total += torch.stack(losses).detach().sum()  # each chunk's share of the mean (``scaled_loss``)
            else:
                self.schedule.step(return_outputs=False)
            self._graph_break()
        dist.broadcast(total, src=self.last_rank, group=self.pp_group)  # one scalar a step, for the record
        return total

    def squared_grad_norm(self, params: list[torch.Tensor]) -> torch.Tensor:
        """The whole model's squared gradient norm: this stage's (a tied weight once), summed over the pipeline."""
        squares = super().squared_grad_norm([p for p, counted in zip(params, self.in_norm) if counted])
        dist.all_reduce(squares, group=self.pp_group)
        return squares

    def optimizer_step(self) -> None:
        # Sum a tied weight's two gradients (embedding's on the first stage, output projection's on the
        # last): each copy then has the one weight's gradient, and the same update keeps them equal.
        if self.tied:
            with self.grad_sync.region():
                for p in self.tied:
                    dist.all_reduce(p.grad, group=self.ends_group)
        super().optimizer_step()  # the dp average, then clipping and AdamW


SCHEDULES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B"}  # pp_schedule -> torch.distributed.pipelining's


def pipeline_trainer(point: TrainPoint, model: nn.Module, batches: Batches, device: torch.device, optim: OptimConfig,
                     family: Family, **kwargs: object) -> PipelineTrainer:
    """The trainer of a point with pp above 1: its mesh, this rank's stage of ``model``, the schedule."""
    import torch.distributed.pipelining as pipelining

    mesh = device_mesh(point, device)
    stage_index, pp = mesh.get_local_rank("pp"), point.pp
    tied = tied_parameters(model, family)  # found in the whole model, before the split
    stage_module = split_stage(model, family, stage_index, pp)
    # (every rank knows the model's tied weights, so all agree on creating the ends' group)
    ends_group = _ends_group(mesh, pp) if tied else None
    if stage_index not in (0, pp - 1):
        tied = []  # a middle stage holds no copy (and keeps no reference to the embedding's)
    pp_group = mesh["pp"].get_group()
    dp_group = mesh["dp"].get_group() if point.dp > 1 else None
    stage = pipelining.PipelineStage(stage_module, stage_index, pp, device, group=pp_group)
    loss_fn = functools.partial(scaled_loss, scale=1 / (point.microbatches * point.gas))
    schedule = getattr(pipelining, SCHEDULES[point.pp_schedule])(stage, point.microbatches, loss_fn=loss_fn,
                                                                   scale_grads=False)
    return PipelineTrainer(stage_module, iter(batches), device, point.precision, point.gas, optim,
                           stage=stage, schedule=schedule, pp_group=pp_group, tied=tied, ends_group=ends_group,
                           dp_group=dp_group, **kwargs)
