"""A training step's parallel layout, declared once (``ParallelLayout``): its fields, the sizes derived from
them, the checks that need no model, the device mesh it makes and how records name it.

The training point (``accel_kit.engine.point.TrainSpec``), the what-if's parameters
(``accel_kit.predict.WhatIfParams``), the predictor's step shape (``accel_kit.predict.shape.StepShape``) and the
memory model (``accel_kit.models.memory``) hold or inherit a ``ParallelLayout`` rather than declaring the fields
again. Below them all, and below the records (``accel_kit.results``), which fill an older record's layout from its
defaults; what the model allows (its heads, blocks, experts) is checked a layer up, with the model at hand
(``accel_kit.engine.layout.check_layout``).
"""
from __future__ import annotations

from typing import Literal, Mapping

from pydantic import BaseModel, ConfigDict, PositiveInt

from accel_kit.errors import ParameterError

# ddp: torch's DDP (or, with tp or pp above 1, the gradients all-reduced over the data-parallel group);
# fsdp: FSDP2's fully_shard per block then the root; deepspeed: DeepSpeed ZeRO-1 (accel_kit.engine.parallel).
Engine = Literal["ddp", "fsdp", "deepspeed"]
# The device mesh's dimensions, outermost first (torchtitan's order): tp innermost, as its all-reduces run
# in every block, then cp, whose ring exchanges keys and values once per block.
MESH_DIMS = ("pp", "dp", "cp", "tp")


class ParallelLayout(BaseModel):
    """How a training step's devices split the work: ``devices`` = dp x tp x pp x cp ranks under a data-parallel
    ``engine``, a pipeline's chunks and schedule, the ep ranks (within dp) a MoE model's routed experts are sharded
    over, and one replica's micro-batch and gradient accumulation steps."""

    model_config = ConfigDict(extra="forbid")

    devices: PositiveInt = 1  # ranks in all (one per device): data x tensor x pipeline x context parallel
    engine: Engine = "ddp"
    tp: PositiveInt = 1  # tensor-parallel degree: each block's heads and MLP width split over tp ranks
    pp: PositiveInt = 1  # pipeline-parallel degree: the blocks split into pp stages, one per rank
    pp_microbatches: PositiveInt | None = None  # chunks each micro-batch splits into in the pipeline; None: pp
    pp_schedule: Literal["gpipe", "1f1b"] = "gpipe"
    # context-parallel degree: each micro-batch's sequence split over cp ranks (torch's context_parallel,
    # ring attention), which train on it together; where the device's SDPA kernels allow it (the adapter says)
    cp: PositiveInt = 1
    # expert-parallel degree: each MoE layer's routed experts sharded over ep ranks, their tokens exchanged by
    # all-to-all; carved out of the data-parallel ranks (ep divides dp), as torchtitan carves it out of dp_shard
    ep: PositiveInt = 1
    micro_batch_size: PositiveInt | None = None  # one replica's samples per forward; None: the system's
    gas: PositiveInt = 1  # micro-batches accumulated per optimizer step

    @classmethod
    def of(cls, fields: Mapping[str, object]) -> ParallelLayout:
        """The layout in ``fields`` (a record's params, say): a field absent or None holds its default, which is
        what a record from before the field existed ran."""
        return cls.model_validate({k: fields[k] for k in cls.model_fields if fields.get(k) is not None})

    @property
    def data_ranks(self) -> int:
        """The ranks the data-parallel replicas are counted over: every device (a point whose adapter runs
        several replicas on one device counts those, ``TrainPoint``)."""
        return self.devices

    @property
    def replica_devices(self) -> int:
        """Devices one replica spans, computing its micro-batches together: tp x pp x cp."""
        return self.tp * self.pp * self.cp

    @property
    def dp(self) -> int:
        """The data-parallel degree: model replicas, devices / (tp x pp x cp) (the ranks of one context-parallel
        group train on one micro-batch, each on its sequence shard)."""
        return self.data_ranks // self.replica_devices

    @property
    def microbatches(self) -> int:
        """Chunks of a micro-batch in flight in the pipeline: ``pp_microbatches``, by default pp; 1 without one."""
        return (self.pp_microbatches or self.pp) if self.pp > 1 else 1

    @property
    def global_batch_size(self) -> int:
        """Samples per optimizer step over all replicas (of a layout whose micro-batch is resolved)."""
        return self.micro_batch_size * self.gas * self.dp

    @property
    def mesh_shape(self) -> tuple[int, ...]:
        """The mesh's size along each of ``MESH_DIMS``."""
        return self.pp, self.dp, self.cp, self.tp

    def mesh_label(self) -> str:
        """The mesh as a record's ``mesh`` shows it: ``pp 1 x dp 2 x cp 1 x tp 1``."""
        return mesh_label(ep=self.ep, **dict(zip(MESH_DIMS, self.mesh_shape)))

    def validate_layout(self) -> None:
        """Refuse a layout that does not divide, or that the engine here has not built, whatever the model.

        Raises:
            ParameterError: the first problem, in one line.
        """
        tp, pp, cp, ep = self.tp, self.pp, self.cp, self.ep
        if self.data_ranks % self.replica_devices:
            raise ParameterError(f"{self.data_ranks} devices do not split into tp {tp} x pp {pp} x cp {cp} "
                                 f"(dp = devices / (tp x pp x cp) must be a whole number)")
        if self.dp % ep:
            raise ParameterError(f"ep {ep} does not divide dp {self.dp}: the expert-parallel ranks are carved out of "
                                 "the data-parallel ones (dp = devices / (tp x pp x cp))")
        split = [f"{name} {degree}" for name, degree in (("tp", tp), ("pp", pp), ("cp", cp), ("ep", ep)) if degree > 1]
        if self.engine == "deepspeed" and split:
            raise ParameterError(f"engine deepspeed runs data parallelism only here ({', '.join(split)}); "
                                 "use engine ddp or fsdp")
        if self.pp_microbatches is not None and pp == 1:
            raise ParameterError("pp_microbatches needs pp above 1")
        if pp > 1:
            self._validate_pipeline()
        for name, degree in (("cp", cp), ("ep", ep)):
            if degree > 1 and pp > 1:
                raise ParameterError(f"{name} and pp together are not built here; use one of them")
        if ep > 1 and cp > 1:
            raise ParameterError("ep and cp together are not built here; use one of them")

    def _validate_pipeline(self) -> None:
        # Pipeline stages train under engine ddp: their gradients averaged over dp after each step
        # (accel_kit.engine.pipeline). FSDP2 inside a stage and a tensor-parallel stage are not built.
        if self.micro_batch_size is not None and self.micro_batch_size % self.microbatches:
            raise ParameterError(f"micro_batch_size {self.micro_batch_size} does not split into "
                                 f"pp_microbatches {self.microbatches}")
        if self.engine == "fsdp":
            raise ParameterError("engine fsdp with pp above 1 is not built here; use engine ddp with pp")
        if self.tp > 1:
            raise ParameterError("tp and pp together are not built here; use one of them")
        if self.pp_schedule == "1f1b" and self.microbatches < self.pp:
            # torch's Schedule1F1B: its warm-up runs one forward per later stage before the first backward
            raise ParameterError(f"pp_schedule 1f1b needs pp_microbatches of at least pp {self.pp}, "
                                 f"got {self.microbatches}")


# The layout's fields a record names it by (``layout_label`` in ``accel_kit.studies.training``), in that order.
LAYOUT_FIELDS: tuple[str, ...] = ("engine", "tp", "pp", "cp", "ep")
# Their values where a record predates them: one model replica per device, under the engine it names (ddp where
# it names none), no context or expert parallelism.
LAYOUT_DEFAULTS: dict[str, object] = {f: ParallelLayout.model_fields[f].default for f in LAYOUT_FIELDS}


def mesh_label(ep: int = 1, **sizes: int) -> str:
    """The mesh as a record's ``mesh`` shows it, ``pp 1 x dp 2 x cp 1 x tp 1``, from each of ``MESH_DIMS``' sizes;
    with expert parallelism, the ep ranks carved out of dp after it: ``dp 4 (ep 2)``."""
    return " x ".join(f"{name} {sizes[name]}" + (f" (ep {ep})" if name == "dp" and ep > 1 else "")
                      for name in MESH_DIMS)
