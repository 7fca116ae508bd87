"""A training point as Cerebras writes one, on the engine's Trainer.

The model is ``cstorch.compile``-d; one ``@cstorch.trace`` step runs forward and backward (over
the GAS micro-batches, unrolled in the trace, on the CPU backend; on CSX the compiler
accumulates), then the engine's optimizer-step tail (unscale, clip, ``cstorch.optim.AdamW`` step,
zero the gradients) and cstorch's schedulers; the loss is read in a ``@cstorch.step_closure``;
batches come from ``cstorch.utils.data.DataLoader(point_input_fn, ...)`` through a
``DataExecutor``, whose profiler's rate tracker gives cstorch's own samples/s.

``CstorchSteps`` holds what differs from the engine's ``Trainer``; ``trainer_class`` puts it on
top of the Trainer the eager model hands over (``eager.Trainer``), since devices/ imports nothing
of the engine.
"""
from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING

import cerebras.pytorch as cstorch
import torch

from accel_kit.devices.cerebras.backend import autocast
from accel_kit.devices.cerebras.data import point_input_fn
from accel_kit.devices.cerebras.executor import StepExecutor
from accel_kit.devices.cerebras.metrics import ADAMW_EPS, run_fields, same_window
from accel_kit.devices.cerebras.options import CerebrasOptions, compiler_micro_batch
from accel_kit.devices.types import EagerRuntime, OptimSettings, TrainPointFields
from accel_kit.json_types import JSONObject
from accel_kit.precision import spec

if TYPE_CHECKING:
    from accel_kit.devices.cerebras.sparsity import CstorchSparsity
    from accel_kit.timing import Timing


def lr_schedule(optimizer, cfg: OptimSettings):
    """The schedule of every system's step (the engine's ``learning_rate``): linear warm-up to lr, then
    cosine decay to min_lr, as cstorch schedulers (stepped inside the trace, so compiled into the step)."""
    sched = cstorch.optim.lr_scheduler
    warmup = sched.LinearLR(optimizer, initial_learning_rate=cfg.lr / cfg.warmup_steps, end_learning_rate=cfg.lr,
                            total_iters=cfg.warmup_steps)
    decay = sched.CosineDecayLR(optimizer, initial_learning_rate=cfg.lr, end_learning_rate=cfg.min_lr,
                                total_iters=cfg.decay_steps)
    return sched.SequentialLR(optimizer, [warmup, decay], milestones=[cfg.warmup_steps])


def accumulation(options: CerebrasOptions, point: TrainPointFields, backend_type: str) -> tuple[int, int, str]:
    """(micro-batches the traced step runs, rows in each, where gradient accumulation happens).

    On the CPU backend the traced step runs the GAS micro-batches itself (a Python loop, unrolled
    in the trace: real accumulation on the host). On CSX the step takes the whole batch and the
    compiler accumulates over micro-batches (``compiler_micro_batch``: the point's, by default), as
    Cerebras code does; an unrolled loop there would also prune each sparse weight once per
    forward, which the CSX lowering rejects.
    """
    rows = point.micro_batch_size * point.devices
    if backend_type == "CPU":
        return point.gas, rows, "the traced step (GAS micro-batches unrolled)"
    return 1, rows * point.gas, f"the CS-2 compiler (micro_batch_size {compiler_micro_batch(options, point)!r})"


class CstorchSteps:
    """A training point on a cstorch backend; ``step()`` runs one optimizer step and returns its loss.

    Args:
        point: the ``TrainPoint``.
        model: the fp32 model (the programming model opened the backend and set the precision).
        options: the system's Cerebras options.
        eager: the engine's eager model: its ``optim_for_point``, ``param_groups``, ``point_batches``,
            ``NotMeasured`` and ``NonFiniteLoss``.
        sparsity: the point's ``CstorchSparsity`` (``make_sparsity``), attached after the optimizer.
    """

    def __init__(self, point: TrainPointFields, model: torch.nn.Module, options: CerebrasOptions,
                 eager: EagerRuntime, *, sparsity: CstorchSparsity | None = None):
        # The engine Trainer's constructor is not called: it builds torch's AdamW, bf16 master weights
        # and torch.autocast, none of which a cstorch step uses. What its optimizer_step reads is set here.
        self.point, self.options, self.eager = point, options, eager
        self.after_step = None  # (the worker clears it before dense fine-tuning; cstorch needs none)
        self.graph_break = None  # the trace is the graph: no marks inside it
        self.master = None  # cstorch's mixed precision keeps the fp32 weights and casts inside the step
        self.precision, self.step_count, self.losses = point.precision, 0, []
        self.backend_type = cstorch.backend().backend_type.name
        self.compiled = cstorch.compile(model, cstorch.backend())
        self.optim_cfg = cfg = eager.optim_for_point(point)
        self.optimizer = cstorch.optim.AdamW(eager.param_groups(model, cfg.weight_decay), lr=cfg.lr,
                                             betas=(cfg.beta1, cfg.beta2), eps=ADAMW_EPS, correct_bias=True)
        self.params = [p for group in self.optimizer.param_groups for p in group["params"]]
        if sparsity is not None:
            sparsity.attach(self.optimizer)
        self.scheduler = lr_schedule(self.optimizer, cfg)
        self.scaler = cstorch.amp.GradScaler(loss_scale="dynamic") if spec(point.precision).loss_scaling else None
        self.gas, rows, self.gas_in = accumulation(options, point, self.backend_type)
        self._train_step = self._traced_step(rows)
        self.timed_steps = point.warmup_steps + point.steps
        self._rate: JSONObject = {}
        from accel_kit.models import family_of

        vocab_size = family_of(model.cfg).shape(model.cfg).vocab_size  # the data's token ids, below it
        dataloader = cstorch.utils.data.DataLoader(point_input_fn, eager.point_batches, point,
                                                   vocab_size, point.gas * point.devices)
        self.executor = StepExecutor(dataloader, self.timed_steps + point.dense_finetune_steps,
                                     cstorch.step_closure(self._record))

    def _record(self, loss) -> None:
        self.losses.append(float(loss.item()))

    def _traced_step(self, rows: int):
        gas, precision = self.gas, self.precision

        @cstorch.trace
        def train_step(batch):
            x, y = batch
            total = None
            for k in range(gas):  # unrolled in the trace: the step's graph holds every micro-batch
                with autocast(precision):
                    _, loss = self.compiled(x[k * rows:(k + 1) * rows], y[k * rows:(k + 1) * rows])
                loss = loss / gas  # the mean over the accumulated micro-batches
                (self.scaler.scale(loss) if self.scaler else loss).backward()
                total = loss.detach() if total is None else total + loss.detach()
            self.optimizer_step()
            return total

        return train_step

    def optimizer_step(self) -> None:
        """The engine's tail (unscale, clip, step, zero the gradients), traced; then cstorch's schedulers,
        which replace the engine setting each group's lr before the step (a Python float the compiled
        step would hold as a constant)."""
        super().optimizer_step()
        self.scheduler.step()

    def step(self) -> float:
        """One optimizer step through the executor; its loss, read by the step closure."""
        before = len(self.losses)
        self.executor.step(self._train_step)
        self.step_count += 1
        if self.options.runs_nothing:
            # cstorch runs one step in these modes: the trace, lowered and compiled (compile_only, on the
            # cluster) or validated (validate_only); nothing executes, so there is nothing to measure.
            what = ("compile_only: the step was traced and compiled, not run" if self.options.compile_only
                    else "validate_only: the step was traced and validated, not compiled or run")
            raise self.eager.NotMeasured("skipped", f"{what}, so nothing was measured "
                                                    f"(artifacts: {cstorch.backend().artifact_dir})")
        if len(self.losses) != before + 1:
            raise RuntimeError(f"the step closure gave {len(self.losses) - before} losses for one step")
        if self.step_count == self.timed_steps:
            self._rate = self.executor.rate_tracker()  # the end of the timed steps: cstorch's figure now
        value = self.losses[-1]
        if not math.isfinite(value):
            raise self.eager.NonFiniteLoss(self.step_count, value)
        return value

    def extra_metrics(self, timing: Timing | None = None) -> JSONObject:
        """cstorch's own figures beside ours, for the record (``same_window`` says how they compare)."""
        return run_fields(self.precision, self.backend_type, self.gas_in) | self._rate | same_window(self._rate, timing)


@functools.cache
def trainer_class(base: type) -> type:
    """``CstorchSteps`` on top of the engine's Trainer ``base`` (``eager.Trainer``), whose optimizer step
    it reuses inside the traced step."""
    return type("CstorchTrainer", (CstorchSteps, base), {"__module__": __name__, "__doc__": CstorchSteps.__doc__})
