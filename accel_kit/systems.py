"""Systems: flat YAML machine descriptions in ``params/systems/<id>.yaml``."""
from __future__ import annotations

import json
from functools import lru_cache
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat, PositiveFloat, PositiveInt, ValidationError

from accel_kit.devices import DeviceAdapter, get_adapter
from accel_kit.errors import ParameterError, UnavailableError
from accel_kit.json_types import JSONObject
from accel_kit.params import Precision, PrecisionRequest
from accel_kit.paths import params_dir


class Interconnect(BaseModel):
    """The links a data-parallel ring crosses (accel_kit.predict.links): per device within a node,
    per node between nodes, each with its source."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    intra_node_GBps: PositiveFloat  # per device, per direction
    intra_node_latency_us: NonNegativeFloat
    inter_node_GBps: PositiveFloat | None = None  # per node, per direction (all its NICs)
    inter_node_latency_us: NonNegativeFloat | None = None
    source: str


class System(BaseModel):
    """One machine the studies run on (docs/study.md, Table I)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    description: str
    adapter: str  # key of accel_kit.devices.ADAPTERS
    device_model: str  # what the vendor calls one device
    devices_per_node: PositiveInt = 1
    # The GPUs a node has, as its batch scheduler counts them: what a job script asks for (Slurm's
    # --gpus-per-node, PBS's ngpus). None: the devices are not GPUs (a CPU, an HPU, an IPU, an RDU, a CS-2),
    # and a job asks for none. It may differ from devices_per_node (an Intel Max GPU's 2 stacks are 2 devices).
    gpus_per_node: PositiveInt | None = None
    precisions: list[Precision]  # the microbenchmark's sweep on this system (the paper's, for its systems)
    default_precision: PrecisionRequest  # auto: the adapter picks the lowest precision native at speed
    micro_batch_size: PositiveInt = 1  # the paper's per-device batch for GPT-2 XL
    seq_len: PositiveInt = 1024
    device_memory_gib: PositiveFloat | None = None  # one device's memory (what-if fit checks)
    interconnect: Interconnect | None = None  # datasheet link figures (what-if communication)
    options: JSONObject = {}  # the adapter's own settings (its ``configure`` validates them)
    # How `accel-kit jobscript` runs studies on it, the default first: batch schedulers, or a Cerebras
    # cluster's appliance (launch.SCHEDULERS).
    schedulers: list[Literal["pbs", "slurm", "appliance"]] = Field(default=["pbs", "slurm"], min_length=1)

    def device_adapter(self) -> DeviceAdapter:
        """The system's device adapter, configured with its options, unchecked; one per process and system
        (an adapter may hold what it measured, e.g. the CPU's precision probe, for every point after)."""
        return _adapter(self.adapter, json.dumps(self.options, sort_keys=True, default=str))

    def adapter_instance(self) -> DeviceAdapter:
        """The device adapter (``device_adapter``), or an UnavailableError naming this system and why."""
        adapter = self.device_adapter()
        avail = adapter.availability()
        if not avail:
            raise UnavailableError(f"system {self.id!r} (adapter {self.adapter}) is not available here: {avail.reason}")
        return adapter


@lru_cache(maxsize=None)
def _adapter(name: str, options_json: str) -> DeviceAdapter:
    return get_adapter(name, json.loads(options_json))


def system_ids() -> list[str]:
    return sorted(p.stem for p in (params_dir() / "systems").glob("*.yaml"))


@lru_cache(maxsize=None)
def load_system(system_id: str) -> System:
    """Parse ``params/systems/<system_id>.yaml``."""
    path = params_dir() / "systems" / f"{system_id}.yaml"
    if not path.is_file():
        raise ParameterError(f"unknown system {system_id!r}; known: {', '.join(system_ids())}")
    try:
        return System.model_validate(yaml.safe_load(path.read_text()))
    except ValidationError as exc:
        err = exc.errors()[0]
        raise ParameterError(f"{path}: field {'.'.join(map(str, err['loc']))!r}: {err['msg']}") from None
