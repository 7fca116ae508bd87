"""The settings of a Cerebras system: the system YAML's ``options:``, each overridable from the environment.

Imported by the adapter and by every cstorch module, and importing neither: the one place both
sides of the adapter read the settings from. It needs no cerebras-pytorch.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, PositiveInt, model_validator

from accel_kit.devices._vendor import parse_options
from accel_kit.devices.types import TrainPointFields
from accel_kit.json_types import JSONObject

ENV_PREFIX = "ACCEL_KIT_CEREBRAS_"
PACKAGE = "cerebras-pytorch"
PACKAGE_VERSION = "2.10.0"  # what `make cerebras` installs (constraints-cerebras.txt)
# One line for every way of not having it: what to install and with which command.
MISSING = (f"{PACKAGE} is not installed in this Python ({sys.executable}): build the Cerebras environment "
           f"with `make cerebras` ({PACKAGE}=={PACKAGE_VERSION} in .venv-cerebras) and run from it "
           "(.venv-cerebras/bin/accel-kit or papermill, or the Jupyter kernel 'accel-kit-cerebras')")
# The user node's cluster configuration, where cerebras-appliance looks when no address is given
# (cerebras/appliance/cluster/config.py: CSCONFIG_PATH, overridden by $CSCONFIG_PATH).
USERNODE_CONFIG = Path("/opt/cerebras/config_v2")
CSX_ONLY = ("mgmt_address", "mgmt_namespace", "credentials_path", "mount_dirs", "python_paths", "compile_dir",
            "compile_only", "validate_only", "job_time_sec", "max_wgt_servers", "max_act_per_csx",
            "num_workers_per_csx", "compiler_micro_batch_size")


class CerebrasOptions(BaseModel):
    """The ``options:`` of a Cerebras system (``params/systems/cs2.yaml``, ``cerebras-cpu.yaml``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    backend: Literal["CPU", "CSX"] = "CPU"
    # Where cstorch writes its logs and compile artifacts; None: a temporary folder per point.
    artifact_dir: str | None = None
    # CS-2 systems the cluster lends this run: a point of the scaling study may use up to this many (num_csx).
    num_csx: PositiveInt = 1
    # --- backend CSX only: cstorch.distributed.ClusterConfig and the backend's modes.
    mgmt_address: str | None = None  # None: the user node's /opt/cerebras/config_v2
    mgmt_namespace: str | None = None
    credentials_path: str | None = None
    mount_dirs: list[str] = []  # folders the cluster's workers mount: the data and this checkout
    python_paths: list[str] = []  # where the workers import accel_kit from (this checkout)
    compile_dir: str | None = None
    compile_only: bool = False  # compile the step on the cluster, run nothing (records say skipped, why)
    validate_only: bool = False  # trace and validate the step, compile and run nothing (ran here without a cluster)
    job_time_sec: PositiveInt | None = None
    max_wgt_servers: PositiveInt | None = None
    max_act_per_csx: PositiveInt | None = None
    num_workers_per_csx: PositiveInt | None = None
    # The CS-2 compiler's micro-batch (cstorch.backends.csx.performance.micro_batch_size), over which it
    # accumulates gradients: None is the point's micro_batch_size (its GAS as asked); "auto" lets the
    # compiler choose, as the paper's CS-2 runs did ("GAS chosen by the software").
    compiler_micro_batch_size: None | Literal["auto", "explore"] | PositiveInt = None

    @model_validator(mode="after")
    def _consistent(self) -> "CerebrasOptions":
        if self.backend == "CPU":
            given = [name for name in CSX_ONLY if name in self.model_fields_set]
            if given:
                raise ValueError(f"{', '.join(given)} applies to backend CSX only (this system's backend is CPU)")
        if self.compile_only and self.validate_only:
            raise ValueError("compile_only and validate_only exclude each other")
        return self

    @classmethod
    def from_sources(cls, options: JSONObject, environ: dict[str, str] | None = None) -> "CerebrasOptions":
        """The YAML ``options`` with each ``ACCEL_KIT_CEREBRAS_<NAME>`` variable (parsed as YAML) on top."""
        from accel_kit.params import parse_value

        environ = os.environ if environ is None else environ
        values = dict(options)
        for name in cls.model_fields:
            text = environ.get(ENV_PREFIX + name.upper())
            if text is None:
                continue
            value = parse_value(text)
            if name in ("mount_dirs", "python_paths") and isinstance(value, str):
                value = [part for part in value.split(os.pathsep) if part]  # a PATH-like list
            values[name] = value
        return parse_options("cerebras", cls, values, given_in=f"the system YAML, or {ENV_PREFIX}<NAME>")

    @property
    def runs_nothing(self) -> bool:
        """compile_only or validate_only: cstorch runs one step that executes nothing, so nothing is measured."""
        return self.compile_only or self.validate_only


def compiler_micro_batch(options: CerebrasOptions, point: TrainPointFields):
    """The CS-2 compiler's micro-batch (``cstorch.backends.csx.performance.micro_batch_size``).

    On CSX, gradient accumulation is the compiler's: the traced step takes the whole step's batch
    and the compiler splits it into micro-batches. By default those are the point's
    ``micro_batch_size`` (its GAS as asked); ``compiler_micro_batch_size`` (``auto``: the compiler
    chooses, as in the paper's runs) overrides it. A point without a micro-batch (a block) gets None:
    no accumulation.
    """
    if options.compiler_micro_batch_size is not None:
        return options.compiler_micro_batch_size
    return getattr(point, "micro_batch_size", None)
