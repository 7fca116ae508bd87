"""The microbenchmark's block on a cstorch backend, compiled and traced as a training step is."""
from __future__ import annotations

import cerebras.pytorch as cstorch
import torch

from accel_kit.devices.cerebras.data import repeat_input_fn
from accel_kit.devices.cerebras.executor import StepExecutor
from accel_kit.devices.types import BlockPointFields
from accel_kit.models.family import layer_output as block_output


class BlockStep:
    """One microbenchmark iteration of a block on the cstorch backend: forward, or forward and backward.

    The block (already cast to the point's precision, as the microbenchmark defines it) is
    compiled; each call runs the traced step on the input and advances the executor, whose
    step closure fetches a scalar of the output (forward) or of the weight gradients
    (forward and backward), so that the compiled step has outputs a CS-2 would keep.
    """

    def __init__(self, point: BlockPointFields, module: torch.nn.Module, x: torch.Tensor,
                 grad_out: torch.Tensor | None):
        self.compiled = cstorch.compile(module, cstorch.backend())
        self.values: list[float] = []
        params = [p for p in module.parameters() if p.requires_grad]
        backward = grad_out is not None

        @cstorch.trace
        def block_step(batch):
            inp = batch[0]
            if not backward:
                with torch.no_grad():
                    out = block_output(self.compiled(inp))
                return out.float().mean()
            for p in params:
                p.grad = None
            block_output(self.compiled(inp)).backward(batch[1])
            return sum(p.grad.float().sum() for p in params)

        @cstorch.step_closure
        def record(value):
            self.values.append(float(value.item()))

        self._step = block_step
        # Batch tensors only: cstorch infers the batch size from every tensor of a batch.
        items = (x.detach(), grad_out) if backward else (x.detach(),)
        dataloader = cstorch.utils.data.DataLoader(repeat_input_fn, items)
        self.executor = StepExecutor(dataloader, point.warmup + point.trials, record)

    def __call__(self) -> None:
        self.executor.step(self._step)
