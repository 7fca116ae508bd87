"""One training measurement point: the flat, fully resolved description a worker process runs."""
from __future__ import annotations

import hashlib
import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, model_validator

from accel_kit.params import Precision


class TrainPoint(BaseModel):
    """Everything that determines one measured point (its identity for resume is a hash of this)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    system: str
    preset: str
    vocab_size: PositiveInt | None = None  # None: the preset's
    pad_vocab_multiple: PositiveInt = 1
    precision: Precision
    micro_batch_size: PositiveInt
    gas: PositiveInt = 1
    seq_len: PositiveInt
    devices: PositiveInt = 1  # data-parallel ranks in all (one per device)
    devices_per_node: PositiveInt = 1  # from the system: how the ranks spread over nodes
    engine: Literal["ddp", "deepspeed"] = "ddp"
    steps: PositiveInt = 5  # timed optimizer steps
    warmup_steps: int = Field(default=2, ge=0)  # optimizer steps run first, timed apart
    data: str = "synthetic"  # "synthetic" or a prepared data folder
    seed: int = 0
    activation_checkpointing: bool = False
    torch_compile: bool = False
    # SDPA kernel: "auto" lets PyTorch choose; the others force one (accel_kit.train.attention).
    attention_kernel: Literal["auto", "flash", "efficient", "math"] = "auto"
    lr: float = Field(default=6e-4, gt=0)
    weight_decay: float = Field(default=0.1, ge=0)
    grad_clip: float = Field(default=1.0, ge=0)
    # Weight sparsity (accel_kit.sparsity): fraction of every block linear's weights pruned by magnitude,
    # its pattern (2:4 is always 0.5), how the pruned layers execute, and dense steps after the sparse ones.
    sparsity: float = Field(default=0.0, ge=0, lt=1)
    sparsity_pattern: Literal["unstructured", "2:4"] = "unstructured"
    sparse_kernels: Literal["dense", "auto"] = "dense"
    dense_finetune_steps: int = Field(default=0, ge=0)
    memory_limit_gib: float | None = Field(default=None, gt=0)  # cap on each worker process (CPU OOM tests)
    peak_tflops_measured: float | None = None  # the sweep's measured matmul peak for this precision

    @model_validator(mode="after")
    def _check_sparsity(self) -> "TrainPoint":
        if self.sparsity_pattern == "2:4" and self.sparsity != 0.5:
            raise ValueError(f"sparsity_pattern '2:4' keeps 2 of every 4 weights, so sparsity must be 0.5 "
                             f"(got {self.sparsity})")
        return self

    @property
    def nodes(self) -> int:
        return -(-self.devices // self.devices_per_node)

    @property
    def global_batch_size(self) -> int:
        return self.micro_batch_size * self.gas * self.devices

    def key(self) -> str:
        """Identity for resume: the hash of every field except the measured peak (a property of the run)."""
        fields = self.model_dump(exclude={"peak_tflops_measured"})
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]
