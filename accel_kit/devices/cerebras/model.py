"""The Cerebras programming model: what the worker and the microbenchmark call instead of eager PyTorch.

``CerebrasAdapter.programming_model(eager)`` returns one per point; the worker calls, in order,
``prepare_model``, ``make_sparsity``, ``make_trainer`` (the sparsity made by the second goes to
the trainer the third makes), and a microbenchmark point ``make_block_step``.
"""
from __future__ import annotations

from typing import Callable

import torch

from accel_kit.devices.base import ProgrammingModel
from accel_kit.devices.cerebras.backend import open_backend, set_precision
from accel_kit.devices.cerebras.block import BlockStep
from accel_kit.devices.cerebras.options import CerebrasOptions
from accel_kit.devices.cerebras.sparsity import CstorchSparsity
from accel_kit.devices.cerebras.trainer import trainer_class
from accel_kit.devices.types import Batches, BlockPointFields, EagerRuntime, PointTrainer, TrainPointFields


class CstorchModel:
    """cstorch's compiled model and traced step on the backend of ``options``.

    Args:
        options: the system's Cerebras options.
        eager: the engine's eager model (``accel_kit.engine.eager.EagerModel``): the engine's building
            blocks (``Trainer``, ``optim_for_point``, ``param_groups``, ``point_batches``, ...) come from it.
    """

    def __init__(self, options: CerebrasOptions, eager: EagerRuntime):
        self.options, self.eager = options, eager
        self._sparsity: CstorchSparsity | None = None  # from make_sparsity to make_trainer

    build_model = ProgrammingModel.build_model  # whole, on the host: cstorch takes the model as it is built

    def prepare_model(self, model: torch.nn.Module, point: TrainPointFields, device: torch.device) -> torch.nn.Module:
        """Opens the backend and sets cstorch's precision; the model stays fp32 (cstorch's mixed precision
        casts inside the compiled step, not the weights)."""
        open_backend(self.options, point)
        set_precision(point.precision)
        return model

    def make_sparsity(self, model: torch.nn.Module, point: TrainPointFields, device: torch.device) -> CstorchSparsity:
        """The point's ``cstorch.sparse`` masks, attached by the trainer once its optimizer exists."""
        self._sparsity = CstorchSparsity(model, point, self.options.backend)
        return self._sparsity

    def make_trainer(self, point: TrainPointFields, model: torch.nn.Module, batches: Batches, device: torch.device,
                     world: int, *, after_step: Callable[[], None] | None = None) -> PointTrainer:
        """The cstorch trainer. ``batches`` is not drawn from: cstorch's DataLoader rebuilds the point's
        source itself (on a cluster, in its input workers). ``after_step`` (re-zeroing pruned weights)
        is not needed: cstorch.sparse prunes the weights before each forward, and the gradients and
        AdamW state through its hooks."""
        sparsity, self._sparsity = self._sparsity, None
        return trainer_class(self.eager.Trainer)(point, model, self.options, self.eager, sparsity=sparsity)

    def make_block_step(self, point: BlockPointFields, module: torch.nn.Module, x: torch.Tensor,
                        grad_out: torch.Tensor | None) -> BlockStep:
        """One microbenchmark iteration of ``module``, compiled and traced on the backend."""
        open_backend(self.options, point)
        return BlockStep(point, module, x, grad_out)
