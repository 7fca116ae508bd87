"""What an adapter answers, as plain values (availability, precisions, placement, launch, description), and the
shapes of what the engine hands it (a point's fields, the eager programming model, a trainer), as protocols.

The values are data, not behaviour: records, the sweep runner and the job-script writer read them
without importing an adapter (``accel_kit.devices.base`` holds the adapter itself). The protocols name only
what devices/ reads of the engine's objects, since ``accel_kit.devices`` imports nothing of the engine
(``tests/test_device_guard.py``): ``accel_kit.engine.point.TrainPoint`` is a ``TrainPointFields``,
``accel_kit.engine.eager.EagerModel`` an ``EagerRuntime``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterator, Protocol

from accel_kit.json_types import JSONObject

if TYPE_CHECKING:
    import torch
    from torch import nn


@dataclass
class Availability:
    """Whether an adapter can run here; ``reason`` says why not."""

    ok: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok


@dataclass
class DeviceDescription:
    """What a result record says about the hardware it ran on."""

    adapter: str
    device_model: str
    device_count: int
    versions: dict[str, str] = field(default_factory=dict)  # driver / SDK / runtime versions
    extra: JSONObject = field(default_factory=dict)


@dataclass(frozen=True)
class PrecisionSupport:
    """How one precision runs on this device: natively at speed, or emulated (slow), and why.

    ``gflops`` is the probe's measured matmul rate where the adapter measured one.
    """

    precision: str
    native: bool
    reason: str
    gflops: float | None = None


@dataclass(frozen=True)
class PrecisionChoice:
    """A requested precision resolved on a device: what runs, and the reason recorded with it."""

    requested: str
    precision: str
    reason: str
    emulated: bool = False


@dataclass(frozen=True)
class Placement:
    """Where a training point's ranks run: on how many worker processes, as how many data-parallel replicas, and
    how many optimizer steps per call (the point's parallel layout itself is ``accel_kit.mesh.ParallelLayout``).

    torch's data parallelism (the default) is one process and one replica per device and one
    optimizer step per trainer call. A vendor runtime may hold every replica in one process (a
    replication factor), spread one replica over several devices (a pipeline), place several
    replicas on one device, or run several optimizer steps per host call (device iterations).
    """

    processes: int  # worker processes the point runs as
    # data-parallel replicas before the point's tp x pp x cp split them: the global batch is micro-batch x gas x
    # replicas / (tp x pp x cp) (``ParallelLayout.dp``, over ``TrainPoint.data_ranks``)
    replicas: int
    steps_per_call: int = 1  # optimizer steps one ``trainer.step()`` runs


@dataclass(frozen=True)
class JobLaunch:
    """What a system's job script needs beyond the scheduler's defaults (``accel-kit jobscript``)."""

    launcher: str | None = None  # -p launcher of the sweep; None: the scheduler's (mpiexec under PBS, srun under Slurm)
    setup: tuple[str, ...] = ()  # shell lines before ``accel-kit run`` (the vendor stack's environment)
    directives: tuple[str, ...] = ()  # extra scheduler lines (written as given, e.g. "##SBATCH --gres=...")
    params: tuple[tuple[str, str], ...] = ()  # -p overrides the launch needs (the user's own come after and win)
    # The adapter's own script where no batch scheduler applies (a Cerebras cluster's appliance), with the
    # ``str.format`` fields of ``accel_kit.engine.launch.render_jobscript``'s; None: the scheduler's template.
    template: str | None = None
    # The devices of the node the script is written on, where the system's figure is nominal (a CPU system's 8
    # gloo processes, on a node of 2 cores): the job's default --devices-per-node. None: the system's figure.
    devices_per_node: int | None = None


# --- what the engine hands an adapter (structural: devices/ imports no engine)

#: A training point's micro-batches: ``(x, y)`` token ids and targets (``EagerRuntime.point_batches``).
Batches = Iterator[tuple["torch.Tensor", "torch.Tensor"]]
#: One microbenchmark iteration (``make_block_step``); its return value is ignored.
BlockStep = Callable[[], object]


class PointFields(Protocol):
    """What an adapter reads of any point (``accel_kit.engine.point.Point``)."""

    kind: str
    precision: str


class TrainPointFields(PointFields, Protocol):
    """What an adapter and a vendor's programming model read of a training point (``engine.point.TrainPoint``)
    beyond its layout: a training point is also an ``accel_kit.mesh.ParallelLayout``, whose fields (``devices``,
    ``engine``, ``tp``, ``pp``, ``cp``, ``ep``, ``micro_batch_size``, ``gas``) and ``dp`` they read too, declared
    there alone (``tests/test_layout_guard.py``)."""

    preset: str
    seq_len: int
    steps: int
    warmup_steps: int
    seed: int
    data: str
    data_path: str | None
    activation_checkpointing: bool
    torch_compile: bool
    attention_kernel: str
    sparsity: float
    sparsity_pattern: str
    sparse_kernels: str
    dense_finetune_steps: int
    steps_per_call: int


class BlockPointFields(PointFields, Protocol):
    """What an adapter reads of a microbenchmark point (``engine.point.BlockPoint``)."""

    preset: str
    torch_compile: bool
    warmup: int
    trials: int


class OptimSettings(Protocol):
    """A training point's AdamW and schedule settings (``accel_kit.engine.step.OptimConfig``)."""

    lr: float
    min_lr: float
    weight_decay: float
    beta1: float
    beta2: float
    grad_clip: float
    warmup_steps: int
    decay_steps: int


class PointTrainer(Protocol):
    """What a point's measurement calls of its trainer: ``step()`` runs one call's optimizer steps, returns the loss;
    ``after_step`` runs after each (re-applying a sparsity mask), None for none."""

    after_step: Callable[[], None] | None

    def step(self) -> float: ...


class PointSparsity(Protocol):
    """The object that prunes a training point's model and keeps its masks through training (``make_sparsity``)."""

    @property
    def active(self) -> bool: ...

    def apply_masks(self) -> None: ...

    def metrics(self) -> JSONObject: ...

    def release(self) -> None: ...


class EagerRuntime(Protocol):
    """The engine's eager programming model as an adapter's ``programming_model(eager)`` receives it (and as a
    vendor's ``ProgrammingModel`` answers it): the methods a kind's measurement calls, and the engine's building
    blocks a vendor trainer reuses (``accel_kit.engine.eager.EagerModel``)."""

    Trainer: type  # the engine's trainer class, for a vendor's subclass (``PointTrainer`` instances)
    NotMeasured: type[Exception]
    NonFiniteLoss: type[Exception]

    @staticmethod
    def optim_for_point(point: TrainPointFields) -> OptimSettings: ...

    @staticmethod
    def param_groups(model: nn.Module | list[torch.Tensor], weight_decay: float) -> list[dict]: ...

    @staticmethod
    def learning_rate(step: int, cfg: OptimSettings) -> float: ...

    @staticmethod
    def point_batches(point: TrainPointFields, vocab_size: int, rank: int) -> Batches: ...

    def build_model(self, point: TrainPointFields, device: torch.device, **overrides: object) -> nn.Module: ...

    def prepare_model(self, model: nn.Module, point: TrainPointFields, device: torch.device) -> nn.Module: ...

    def make_sparsity(self, model: nn.Module, point: TrainPointFields, device: torch.device) -> PointSparsity: ...

    def make_trainer(self, point: TrainPointFields, model: nn.Module, batches: Batches, device: torch.device,
                     world: int, *, after_step: Callable[[], None] | None = None,
                     trainer: Callable[..., PointTrainer] | None = None, compile_backend: str | None = None,
                     graph_break: Callable[[], None] | None = None) -> PointTrainer: ...

    def make_block_step(self, point: BlockPointFields, module: nn.Module, x: torch.Tensor,
                        grad_out: torch.Tensor | None) -> BlockStep: ...
