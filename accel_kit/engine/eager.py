"""The engine's default programming model: eager PyTorch, as a CPU, a CUDA or ROCm GPU runs it.

Building and stepping a point's model is the engine's business, not the device's: the
adapter says what the device is (its dtype support, its collective, its DDP wrapper, its
fused optimizer, its sparse kernels), and this module turns that into a placed and cast
model, a pruned model, a trainer and a microbenchmark step. A vendor whose programming model
differs (PopTorch's compiled pipeline, cstorch's traced step, Habana's lazy mode, SambaFlow)
replaces any of its methods through one hook, ``adapter.programming_model(eager)``, which gets
this default (and through it the engine's building blocks) and returns the object the worker
calls. So ``accel_kit.devices`` never imports the engine.

A training point's measurement calls, in order and on one instance per point: ``prepare_model``,
``make_sparsity``, ``make_trainer`` (so a vendor's model may hand state from one to the next); a
microbenchmark point calls ``make_block_step``. A new kind adds its own method here; a vendor's
``ProgrammingModel`` answers it as this one does until it overrides it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import torch
from torch import nn

import accel_kit.engine.step as step_module  # not the package face, which imports points and through them the worker

if TYPE_CHECKING:
    from accel_kit.devices import BaseAdapter
    from accel_kit.devices.types import Batches, BlockStep, EagerRuntime, PointTrainer
    from accel_kit.engine.deepspeed_engine import DeepSpeedTrainer
    from accel_kit.engine.point import BlockPoint, TrainPoint
    from accel_kit.sparsity import WeightSparsity


def point_batches(point: TrainPoint, vocab_size: int, rank: int) -> Batches:
    """The batch source of a training point: synthetic tokens, or its prepared data (windows or padded rows).

    A module-level function, so that a vendor's input workers can be handed it by name (it pickles).
    """
    from accel_kit.data import SyntheticBatches, open_batches

    if point.data == "synthetic":
        return SyntheticBatches(vocab_size, point.seq_len, point.micro_batch_size, seed=point.seed, rank=rank)
    return open_batches(point.data_path, point.micro_batch_size, point.seq_len, seed=point.seed, rank=rank)


def shards_before_allocating(point: TrainPoint) -> bool:
    """Whether a training point's model is built on the meta device and sharded before it is allocated: FSDP2 or
    tensor parallelism (not within pipeline stages, whose split renames the blocks, nor with expert parallelism,
    whose shards are cut from a whole model), for a family drawn by parameter name."""
    from accel_kit.models import family_of

    return ((point.engine == "fsdp" or point.tp > 1) and point.pp == 1 and point.ep == 1
            and family_of(point.preset).init_by_name)


class EagerModel:
    """Eager PyTorch on ``adapter``'s torch device: DDP (or DeepSpeed) across ranks.

    The engine's building blocks a vendor's programming model may reuse are attributes, so that
    devices/ code reaches them through the object it is handed instead of importing the engine:
    ``Trainer`` (the optimizer step: a ``graph_break`` keyword, and ``precision_spec``,
    ``make_optimizer``, ``autocast``, ``clip_gradients`` and ``optimizer_step`` for a subclass to
    override), ``OptimConfig``, ``optim_for_point``, ``param_groups``, ``learning_rate``,
    ``cast_for_precision``, ``point_batches``, ``deepspeed_trainer``, ``NonFiniteLoss`` and ``NotMeasured``.
    """

    Trainer = step_module.Trainer
    NotMeasured = step_module.NotMeasured
    NonFiniteLoss = step_module.NonFiniteLoss
    OptimConfig = step_module.OptimConfig
    optim_for_point = staticmethod(step_module.optim_for_point)
    param_groups = staticmethod(step_module.param_groups)
    learning_rate = staticmethod(step_module.learning_rate)
    cast_for_precision = staticmethod(step_module.cast_for_precision)
    point_batches = staticmethod(point_batches)

    def __init__(self, adapter: BaseAdapter):
        self.adapter = adapter

    @staticmethod
    def deepspeed_trainer(point: TrainPoint, model: nn.Module, batches: Batches, device: torch.device,
                          optim: step_module.OptimConfig, world: int, adapter: BaseAdapter,
                          **kwargs: object) -> DeepSpeedTrainer:
        """DeepSpeed's engine as a trainer (imported only when a point asks for it)."""
        from accel_kit.engine.deepspeed_engine import DeepSpeedTrainer

        return DeepSpeedTrainer(point, model, batches, device, optim, world, adapter, **kwargs)

    def build_model(self, point: TrainPoint, device: torch.device, **overrides: object) -> nn.Module:
        """The point's freshly built fp32 model (seed the generator first) on ``device``; for a layout that shards
        it first (``shards_before_allocating``), on the meta device with its initialisation pending:
        ``make_trainer`` shards it, then allocates and draws each rank's part (``materialize_deferred``), so no
        rank holds the whole model."""
        from accel_kit.models import build_deferred, build_model

        kwargs = {"activation_checkpointing": point.activation_checkpointing, **overrides}
        if shards_before_allocating(point):
            return build_deferred(point.preset, **kwargs)
        return build_model(point.preset, device=device, **kwargs)

    def prepare_model(self, model: nn.Module, point: TrainPoint, device: torch.device) -> nn.Module:
        """The freshly built fp32 model, placed and cast as this device trains it (before sparsity and trainer).
        ``build_model`` builds it on ``device`` already; ``.to`` places one built elsewhere. A model still on the
        meta device (``build_deferred``) is cast there and placed when ``make_trainer`` has sharded it."""
        from accel_kit.models import is_deferred

        if not is_deferred(model):
            model = model.to(device)
        if point.engine in ("deepspeed", "fsdp"):
            return model  # DeepSpeed and FSDP2 take the fp32 model and apply their own bf16/fp16 mode
        return step_module.cast_for_precision(model, point.precision)

    def make_sparsity(self, model: nn.Module, point: TrainPoint, device: torch.device) -> WeightSparsity:
        """Prune ``model`` for ``point.sparsity``: the object that keeps the masks through training (``active``,
        ``apply_masks()``, ``metrics()``, ``release()``), made before ``make_trainer``."""
        from accel_kit.sparsity import WeightSparsity

        # Magnitude pruning with masks re-applied after each step (the trainer's after_step), and the
        # execution path: a sparse kernel where this device has one that beats dense.
        sparse = WeightSparsity(model, point.sparsity, point.sparsity_pattern)
        sparse.select_kernels(point.sparse_kernels, self.adapter, point.precision,
                              point.micro_batch_size * point.seq_len)
        return sparse

    def make_trainer(self, point: TrainPoint, model: nn.Module, batches: Batches, device: torch.device, world: int, *,
                     after_step: Callable[[], None] | None = None, trainer: Callable[..., PointTrainer] | None = None,
                     compile_backend: str | None = None,
                     graph_break: Callable[[], None] | None = None) -> PointTrainer:
        """The object whose ``step()`` runs the point's optimizer steps of one call and returns the loss.

        The worker passes ``after_step`` only; a vendor's programming model that keeps this eager path
        passes its parts: ``trainer`` (a ``Trainer`` subclass, or a callable taking its arguments),
        ``compile_backend`` (``torch.compile``'s backend for ``-p torch_compile true``) and
        ``graph_break`` (where a lazy graph is cut: given to the trainer, DeepSpeed's included).
        """
        optim = step_module.optim_for_point(point)
        if point.engine == "deepspeed":
            return self.deepspeed_trainer(point, model, batches, device, optim, world, self.adapter,
                                          graph_break=graph_break)
        if point.engine == "fsdp" or point.tp * point.pp * point.cp * point.ep > 1:
            from accel_kit.models import family_of

            if point.pp > 1:
                from accel_kit.engine.pipeline import pipeline_trainer as layout_trainer
            else:
                from accel_kit.engine.parallel import parallel_trainer as layout_trainer
            return layout_trainer(point, model, batches, device, optim, family_of(point.preset),
                                  after_step=after_step, fused_optimizer=self.adapter.fused_optimizer(),
                                  graph_break=graph_break, synchronize=self.adapter.synchronize)
        if world > 1:
            model = self.adapter.wrap_ddp(model, device)
        if point.torch_compile:
            model = torch.compile(model, **({"backend": compile_backend} if compile_backend else {}))
        return (trainer or step_module.Trainer)(model, iter(batches), device, point.precision, point.gas, optim,
                                                after_step=after_step, fused_optimizer=self.adapter.fused_optimizer(),
                                                graph_break=graph_break)

    def make_block_step(self, point: BlockPoint, module: nn.Module, x: torch.Tensor,
                        grad_out: torch.Tensor | None) -> BlockStep:
        """One microbenchmark iteration of ``module`` on ``x`` as a callable: forward, or forward and backward
        (``grad_out`` given)."""
        from accel_kit.models.family import layer_output as block_output

        if grad_out is None:
            def step():
                with torch.no_grad():
                    module(x)
        else:
            def step():
                module.zero_grad(set_to_none=True)
                x.grad = None
                block_output(module(x)).backward(grad_out)
        return step


def programming_model(adapter: BaseAdapter) -> EagerRuntime:
    """What builds and steps a point on ``adapter``: the eager default, or the vendor's replacement."""
    return adapter.programming_model(EagerModel(adapter))
