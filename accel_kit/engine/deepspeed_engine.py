"""DeepSpeed ZeRO stage 1 as the data-parallel engine (optional extra: ``pip install accel-kit[deepspeed]``).

The config is generated from the point's parameters, so DeepSpeed and DDP runs of the same
point differ only in the engine. On CPU, DeepSpeed needs ``DS_ACCELERATOR=cpu`` and the
plain torch AdamW (``torch_adam``), which avoids a 45 s JIT build of its fused CPU Adam.
"""
from __future__ import annotations

import os

import torch

from accel_kit.engine.step import NonFiniteLoss, OptimConfig, learning_rate


def deepspeed_config(point, optim: OptimConfig, world: int, optimizer_params: dict | None = None) -> dict:
    """The DeepSpeed JSON config for ``point`` (ZeRO-1, AdamW, precision, GAS, clipping)."""
    return {
        "train_micro_batch_size_per_gpu": point.micro_batch_size,
        "gradient_accumulation_steps": point.gas,
        "train_batch_size": point.micro_batch_size * point.gas * world,
        "gradient_clipping": optim.grad_clip,
        "zero_optimization": {"stage": 1},
        "bf16": {"enabled": point.precision == "bf16"},
        "fp16": {"enabled": point.precision == "fp16", "initial_scale_power": 16},
        "optimizer": {
            "type": "AdamW",
            # plus what the device adapter adds (on CPU: torch_adam)
            "params": {"lr": optim.lr, "betas": [optim.beta1, optim.beta2], "weight_decay": optim.weight_decay,
                       **(optimizer_params or {})},
        },
        "steps_per_print": 10**9,  # our records, not DeepSpeed's log lines
        "wall_clock_breakdown": False,
    }


def _skip_shared_memory_all_reduce() -> None:
    """Tell DeepSpeed its shared-memory all-reduce cannot be built, so it reduces through the process group.

    On a CPU, DeepSpeed's communication backend JIT-compiles that C++ op the first time it starts in an
    environment (about 70 s on 2 cores, before the point's first step, inside its timeout). One rank has
    nothing to reduce, so it is skipped there; several ranks keep DeepSpeed's own choice. DeepSpeed keeps its
    compatibility table as one dict in ``deepspeed.ops`` so that edits to it hold; a version without it
    simply builds the op.
    """
    try:
        import deepspeed.ops
        from deepspeed.ops.op_builder.cpu.comm import ShareMemCommBuilder

        deepspeed.ops.__compatible_ops__[ShareMemCommBuilder.NAME] = False
    except (ImportError, AttributeError, TypeError):
        pass


class DeepSpeedTrainer:
    """Same interface as ``accel_kit.engine.step.Trainer``: ``step()`` runs one optimizer step.

    ``graph_break``: called after each backward and each engine step, where a device that records
    operations into a lazy graph must cut it (the adapter's choice; None elsewhere).
    """

    def __init__(self, point, model, batches, device: torch.device, optim: OptimConfig, world: int, adapter, *,
                 graph_break=None):
        environ, optimizer_params = adapter.deepspeed_settings()
        for name, value in environ.items():  # read when deepspeed is imported
            os.environ.setdefault(name, value)
        try:
            import deepspeed
        except ImportError:
            from accel_kit.errors import UnavailableError

            raise UnavailableError("engine 'deepspeed' needs the deepspeed package: "
                                   "pip install 'accel-kit[deepspeed]'") from None
        if world == 1:
            _skip_shared_memory_all_reduce()
        config = deepspeed_config(point, optim, world, optimizer_params)
        self.engine, self.optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                                                 config=config)
        self.batches, self.device, self.gas, self.optim_cfg = iter(batches), device, point.gas, optim
        self.graph_break = graph_break or (lambda: None)
        self.step_count = 0

    def step(self) -> float:
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate(self.step_count, self.optim_cfg)
        total = 0.0
        for _ in range(self.gas):
            x, y = next(self.batches)
            _, loss = self.engine(x.to(self.device), y.to(self.device))
            self.engine.backward(loss)  # scales by 1/gas and skips the all-reduce until the boundary
            self.graph_break()
            self.engine.step()  # an optimizer step only at the accumulation boundary
            self.graph_break()
            total += loss.item() / self.gas
        self.step_count += 1
        if not torch.isfinite(torch.tensor(total)):
            raise NonFiniteLoss(self.step_count, total)
        return total
