"""Points: plain typed data, one class per kind (a training step, one block, a matmul peak).

A point is what one measurement *is*; how it is measured lives elsewhere (each kind registers
its point type with its measurement in ``accel_kit.engine.kinds``), so this module imports no
measurement code and names no upper layer.

Training: every field that determines one is declared once, in ``TrainSpec`` (its parallel layout and
batch in the ``accel_kit.mesh.ParallelLayout`` it inherits, with the sizes derived from them). A study's
parameters inherit ``TrainSpec`` (with None meaning "the system's default" for the few fields
a system sets); ``TrainPoint`` is the same spec fully resolved for one point, plus what the run
resolved for it (the system, where its data was prepared, the measured peak). The worker, the
record and the resume key all derive from ``TrainPoint``, so a new training parameter is one
line here.
"""
from __future__ import annotations

import hashlib
import json
from typing import ClassVar, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, model_validator

from accel_kit.engine.attention import AttentionKernel
from accel_kit.json_types import JSONObject
from accel_kit.mesh import ParallelLayout
from accel_kit.precision import Precision, PrecisionRequest


class TrainSpec(ParallelLayout):
    """What one training measurement is: model, precision, its layout and batch (``ParallelLayout``, whose
    ``micro_batch_size`` None is the system's: the paper's per-device batch), schedule, data, sparsity."""

    preset: str = "gpt2-xl"
    vocab_size: PositiveInt | None = None  # None: the preset's
    pad_vocab_multiple: PositiveInt = 1
    precision: PrecisionRequest | None = None  # None: the system's default; auto: the device's fastest native
    seq_len: PositiveInt | None = None  # None: the system's
    steps: PositiveInt = 5  # timed optimizer steps
    warmup_steps: int = Field(default=2, ge=0)  # optimizer steps run first, timed apart
    data: str = "synthetic"  # synthetic | text (the embedded corpus) | a prepared data folder
    seed: int = 0
    activation_checkpointing: bool = False
    torch_compile: bool = False
    # SDPA kernel: "auto" lets PyTorch choose; the others force one (accel_kit.engine.attention).
    attention_kernel: AttentionKernel = "auto"
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
    # A point estimated (from its FLOPs, then from its first step) to take longer is recorded as skipped.
    time_budget_s: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _check_sparsity(self):
        if self.sparsity_pattern == "2:4" and self.sparsity != 0.5:
            raise ValueError(f"sparsity_pattern '2:4' keeps 2 of every 4 weights, so sparsity must be 0.5 "
                             f"(got {self.sparsity})")
        return self


# Fields added after records existed, left out of the key at these defaults so that every earlier
# record's key is what it was (a point at the defaults is the point those records measured).
KEY_DEFAULTS: JSONObject = {f: ParallelLayout.model_fields[f].default
                               for f in ("tp", "pp", "pp_microbatches", "pp_schedule", "cp", "ep")}


def key_fields(fields: JSONObject) -> JSONObject:
    """``fields`` without those of ``KEY_DEFAULTS`` that hold their default."""
    return {k: v for k, v in fields.items() if k not in KEY_DEFAULTS or v != KEY_DEFAULTS[k]}


# Resolved per run, not part of what a point *is*: moving outputs/ (data_path), a new peak
# measurement or another time budget must not make a recorded point run again.
NOT_IN_KEY = {"data_path", "peak", "bandwidth", "time_budget_s", "precision_reason",
              # the adapter's layout: a function of the system (in the key) and its options
              "processes", "replicas", "steps_per_call"}


class Frontier(NamedTuple):
    """Where a point stands on a memory frontier: its configuration without the length (``key``), the
    length's name (``axis``, as a record's reason says it) and its value."""

    key: str
    axis: str
    length: int


class Point(BaseModel):
    """What the sweep runner needs of any point kind (a training step, one block, ...)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: str
    system: str
    precision: Precision
    precision_reason: str = ""  # why this precision (auto's choice, or emulated)
    memory_limit_gib: float | None = Field(default=None, gt=0)  # cap on the point's process
    time_budget_s: float | None = Field(default=None, gt=0)
    peak: JSONObject | None = None  # the run's measured matmul peak for this precision (peaks.MeasuredPeak)
    # The work its records' energy figure counts per joule: "tokens" (tokens_per_j), "flops"; None: none.
    ENERGY_WORK: ClassVar[str | None] = None
    # The metric holding the point's achieved TFLOP/s per device (its MFU's numerator); None: none.
    RATE_METRIC: ClassVar[str | None] = None

    @property
    def nodes(self) -> int:
        return 1

    @property
    def ranks(self) -> int:
        """Worker processes the point runs as."""
        return 1

    @property
    def needs_group(self) -> bool:
        """Several ranks in a process group (forked together from the fork server, or under torchrun, mpiexec or
        srun) rather than one process."""
        return False

    def label(self) -> str:
        return self.kind

    def key(self) -> str:
        """Identity for resume: a hash of every field that determines the measurement (and, for a model
        preset that is a file, ``hf:PATH``, of the file's contents: an edited config.json runs again)."""
        fields = key_fields(self.model_dump(exclude=NOT_IN_KEY))
        if isinstance(fields.get("preset"), str):
            from accel_kit.models import preset_digest

            digest = preset_digest(fields["preset"])
            if digest:  # (a named preset has none, so its key is what it always was)
                fields["preset_digest"] = digest
        return _hash(fields)

    def frontier(self) -> Frontier | None:
        """Points sharing its key skip greater lengths once one fails for memory (the sweep's memory frontier,
        ``accel_kit.engine.sweep``); None: the point is on no frontier."""
        return None

    def preload_modules(self) -> tuple[str, ...]:
        """Modules this point imports beyond every point's (the fork server's ``PRELOAD``): its ranks fork from
        a server that imported them too, started once, for every later point as well."""
        return ()

    def record_params(self) -> JSONObject:
        """What a record stores of the point: the system is the record's own field, the peak goes to the metrics."""
        return self.model_dump(exclude={"peak", "system"})


class TrainPoint(Point, TrainSpec):
    """One training point, fully resolved; the worker runs exactly this."""

    kind: Literal["train"] = "train"
    ENERGY_WORK: ClassVar[str | None] = "tokens"
    RATE_METRIC: ClassVar[str | None] = "tflops_per_device"
    devices_per_node: PositiveInt = 1  # from the system: how the ranks spread over nodes
    micro_batch_size: PositiveInt
    seq_len: PositiveInt
    data_path: str | None = None  # where ``data`` was prepared (None: synthetic)
    # How the devices run (the adapter's ``placement``): worker processes and data-parallel replicas
    # (None: one of each per device), and optimizer steps per trainer call.
    processes: PositiveInt | None = None
    replicas: PositiveInt | None = None
    steps_per_call: PositiveInt = 1

    @property
    def nodes(self) -> int:
        if self.processes == 1:  # one client process drives every device (an IPU pipeline, a Cerebras cluster)
            return 1
        return -(-self.devices // self.devices_per_node)

    @property
    def ranks(self) -> int:
        return self.processes or self.devices

    @property
    def needs_group(self) -> bool:
        """Several ranks, DeepSpeed (which initialises torch.distributed itself) or FSDP (whose device mesh
        needs a process group, even of one rank): run under a launcher."""
        return self.ranks > 1 or self.engine in ("deepspeed", "fsdp")

    @property
    def data_ranks(self) -> int:
        """The adapter's replicas where it runs other than one per device (several on one device), else the devices."""
        return self.replicas or self.devices

    def label(self) -> str:
        # The progress bar shows it: words a reader knows, not the fields' abbreviations.
        return (f"{self.preset} {self.precision}, {self.devices} device{'s' if self.devices > 1 else ''}, "
                f"micro-batch {self.micro_batch_size}, GAS {self.gas}, sequence {self.seq_len}")

    def preload_modules(self) -> tuple[str, ...]:
        from accel_kit.models import family_of

        return family_of(self.preset).preload_modules(self.preset)  # an hf: model's transformers modules

    def frontier_key(self) -> str:
        """The configuration without its length: once it fails for memory, longer lengths are skipped.

        The data is left out too, because it may depend on the length (GenSLM's padded rows
        are prepared once per block size).
        """
        return _hash(key_fields(self.model_dump(exclude=NOT_IN_KEY | {"seq_len", "data"})))

    def frontier(self) -> Frontier:
        return Frontier(self.frontier_key(), "seq_len", self.seq_len)


def _hash(fields: JSONObject) -> str:
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[:16]



Direction = Literal["forward", "forward_backward"]
# native: our layer; hf: transformers' layer of the same shape; compiled: ours under torch.compile.
Impl = Literal["native", "hf", "compiled"]


class BlockPoint(Point):
    """One microbenchmark point: one layer of a model preset, in this precision, timed in one direction."""

    kind: Literal["block"] = "block"
    ENERGY_WORK: ClassVar[str | None] = "flops"  # its records' energy figure is FLOPs per joule
    RATE_METRIC: ClassVar[str | None] = "tflops"  # one device: the block's TFLOP/s is per device
    impl: Impl
    preset: str  # the model whose layer is timed (any family's)
    seq_len: PositiveInt
    batch_size: PositiveInt
    direction: Direction
    warmup: int
    trials: PositiveInt
    tf32: bool
    torch_compile: bool
    noisy_cv: float
    seed: int

    def label(self) -> str:
        return f"{self.impl} {self.precision}, batch {self.batch_size}, {self.direction}"

    def preload_modules(self) -> tuple[str, ...]:
        if self.impl != "hf":
            return ()
        from accel_kit.models import family_of

        return family_of(self.preset).hf_modules  # transformers' layer: seconds to import


class PeakPoint(Point):
    """A matmul-peak measurement (``accel_kit.peaks.measure_matmul_peak``) in a worker process of its own."""

    kind: Literal["peak"] = "peak"
    shapes: list[tuple[int, int, int]] = []


class BandwidthPoint(Point):
    """A memory-bandwidth measurement (``accel_kit.peaks.measure_memory_bandwidth``) in a worker process of its own:
    the measured figure a decode's MBU is read against. ``precision`` is the run's; the kernels move fp32 arrays
    (bandwidth does not depend on the element type)."""

    kind: Literal["bandwidth"] = "bandwidth"
    sizes_mib: list[PositiveInt] = [512]
