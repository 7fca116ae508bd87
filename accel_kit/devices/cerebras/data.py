"""The input functions ``cstorch.utils.data.DataLoader`` calls: a point's step batches, or a block's input.

Module-level, with picklable arguments: on a cluster they are shipped to the input workers, which
call them there (the CPU backend calls them in this process). They need no cerebras-pytorch.
"""
from __future__ import annotations

from typing import Callable

import torch

from accel_kit.devices.types import Batches, TrainPointFields

# (point, vocab_size, rank) -> the point's (x, y) micro-batches: the engine's batch source of a training
# point, handed in through the eager model (``eager.point_batches``), a module-level function that
# pickles by its name.
BatchSource = Callable[[TrainPointFields, int, int], Batches]


class _StepBatches(torch.utils.data.IterableDataset):
    """Each item is one optimizer step's batch: ``micro`` micro-batches of the point's source, stacked."""

    def __init__(self, batch_source: BatchSource, point: TrainPointFields, vocab_size: int, micro: int):
        super().__init__()
        self.batch_source, self.point, self.vocab_size, self.micro = batch_source, point, vocab_size, micro

    def __iter__(self):
        source = self.batch_source(self.point, self.vocab_size, 0)
        while True:
            parts = [next(source) for _ in range(self.micro)]
            yield torch.cat([x for x, _ in parts]), torch.cat([y for _, y in parts])


def point_input_fn(batch_source: BatchSource, point: TrainPointFields, vocab_size: int,
                   micro: int) -> torch.utils.data.DataLoader:
    """A torch DataLoader of the point's step batches: ``micro`` micro-batches of ``batch_source`` each.

    Args:
        batch_source: the engine's batch source of a point (``eager.point_batches``).
        point: the training point (a pydantic model: it pickles, and the workers rebuild its source).
        vocab_size: the model's vocabulary (synthetic tokens are drawn below it).
        micro: micro-batches per step (GAS x data-parallel replicas).
    """
    return torch.utils.data.DataLoader(_StepBatches(batch_source, point, vocab_size, micro), batch_size=None)


class _Repeat(torch.utils.data.IterableDataset):
    def __init__(self, item):
        super().__init__()
        self.item = item

    def __iter__(self):
        while True:
            yield self.item


def repeat_input_fn(item) -> torch.utils.data.DataLoader:
    """The block's input, the same tensors every step (as the eager microbenchmark reuses them)."""
    return torch.utils.data.DataLoader(_Repeat(item), batch_size=None)
