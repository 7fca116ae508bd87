"""What an adapter answers, as plain values: availability, precisions, placement, launch, description.

These are data, not behaviour: records, the sweep runner and the job-script writer read them
without importing an adapter (``accel_kit.devices.base`` holds the adapter itself).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


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
    extra: dict[str, Any] = field(default_factory=dict)


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
