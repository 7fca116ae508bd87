"""SambaNova SN30 RDUs through SambaFlow (``sambaflow.samba``).

SambaFlow trains in two phases, as SambaNova's own scripts do (its tutorials' ``compile`` and
``run`` commands, and the GPT-2 1.5B scripts ALCF published for its SN30):

- compile: the model, converted with ``samba.from_torch_model_``, its optimizers
  (``samba.optim.AdamW``, one per weight-decay setting, clipping inside) and inputs of fixed
  shape are traced and compiled into a PEF by ``samba.session.compile``. Here the compile
  runs once per shape (model, micro-batch, sequence, data parallel or not, tiles) in a child
  process, ``python -m accel_kit.devices.sambanova compile SPEC``, the first time a point
  needs it; the PEF is kept under ``pef_dir`` and reused.
- run: ``sambaflow.samba.utils.trace_graph`` loads the PEF and places weights and optimizer
  state on the RDU; then each optimizer step is one ``samba.session.run`` of the sections
  forward, backward, gradient norm and optimizer, the learning rate passed with each call.

One instance uses ``tiles_per_instance`` of an RDU's 8 tiles (GPT-2 1.5B fits in 4, the
paper's setting), so an RDU holds 8 / tiles instances; each instance is one worker process
and one data-parallel replica (its ``placement``), and with several instances the gradients are
reduced on the RDUs (``data_parallel=True, reduce_on_rdu=True``, compiled with
``--data-parallel -ws 2`` as in ALCF's scripts). A ``session.run`` returns host tensors:
timing is the host clock around it. SambaFlow documents no memory or device-count query.

Unsupported here, with the reason in the record: the one-block microbenchmark and the matmul
peak (eager PyTorch on a torch device: SN30 needs a PEF for each), gradient accumulation
(not part of the documented SambaFlow API we could read), DeepSpeed, ``torch.compile``,
weight sparsity, forced SDPA kernels and ``activation_checkpointing`` (recomputation is a
compiler decision on SambaFlow).

Nothing here has run on an RDU. ``tests/test_vendor_adapters.py`` checks the order of these
calls against small recording stand-ins of ``sambaflow``: the order, not the hardware.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Literal

import torch
from pydantic import BaseModel, ConfigDict
from torch import nn

from accel_kit.devices._vendor import first_line, missing, missing_reason, parse_options
from accel_kit.devices.base import (Availability, BaseAdapter, DeviceDescription, JobLaunch, Placement,
                                    PrecisionSupport, ProgrammingModel)
from accel_kit.devices.types import Batches, BlockPointFields, EagerRuntime, PointFields, PointTrainer, TrainPointFields
from accel_kit.json_types import JSONObject

SOURCE = "SambaNova's SambaFlow (installed with the SambaNova software stack, under /opt/sambaflow)"
TILES_PER_RDU = 8  # docs/study.md, Table I
DEFAULT_PEF_DIR = "~/.cache/accel-kit/sambaflow-pef"
SECTIONS = ["FWD", "BCKWD", "GRADNORM", "OPT"]  # one training step (SambaNova's GPT-2 tutorial)
COMPILED_ATTENTION = {
    "attention_kernel_ran": None, "attention_op": None,
    "attention_kernel_reason": "SambaFlow compiles the model into a PEF: its compiler lowers attention, torch's "
                               "SDPA dispatch does not choose a kernel"}


class SambaFlowOptions(BaseModel):
    """``options:`` of an SN30 system (params/systems/sn30.yaml)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tiles_per_instance: Literal[1, 2, 4, 8] = 4  # compile --num-tiles: one instance's share of an RDU
    pef_dir: str | None = None  # where compiled PEFs are kept; None: ~/.cache/accel-kit/sambaflow-pef
    compiler_args: list[str] = []  # more words for the compile command (e.g. --mac-v2)


class SambaFlowAdapter(BaseAdapter):
    name = "sambaflow"

    def __init__(self) -> None:
        self.options = SambaFlowOptions()

    def configure(self, options: JSONObject) -> None:
        self.options = parse_options(self.name, SambaFlowOptions, options)

    def availability(self) -> Availability:
        if missing("sambaflow"):
            return Availability(False, missing_reason("sambaflow", SOURCE))
        try:
            from sambaflow import samba  # noqa: F401
        except Exception as exc:
            return Availability(False, f"sambaflow failed to import: {first_line(exc)}")
        # No documented query for the RDUs: a missing or busy one shows when the PEF is loaded.
        return Availability(True)

    def torch_device(self, index: int = 0) -> torch.device:
        return torch.device("cpu")  # the host: the model is built here; SambaFlow places it on the RDU

    def synchronize(self) -> None:
        pass  # session.run returns host tensors, i.e. only when the RDU has finished the step

    def supported_precisions(self) -> tuple[str, ...]:
        return ("bf16",)

    def precision_support(self, precision: str) -> PrecisionSupport:
        return PrecisionSupport(precision, True, "bf16 multiplies with fp32 accumulation on the RDU (docs/study.md)")

    def energy_meter(self, index: int = 0):
        from accel_kit.devices.power import UnavailableMeter

        return UnavailableMeter("SambaFlow exposes no energy or power counter for an RDU to a training process; the SN30 node's power is read outside it (its management tools)")

    def describe(self) -> DeviceDescription:
        import sambaflow

        return DeviceDescription(adapter=self.name, device_model="SambaNova RDU (SN30)", device_count=0,
                                 versions={"torch": torch.__version__,
                                           "sambaflow": getattr(sambaflow, "__version__", "unknown")},
                                 extra={"device_count": "not queried: SambaFlow documents no device query",
                                        **self.options.model_dump(exclude={"pef_dir"})})

    # --- the programming model

    @property
    def instances_per_rdu(self) -> int:
        return TILES_PER_RDU // self.options.tiles_per_instance

    def placement(self, devices: int) -> Placement:
        instances = devices * self.instances_per_rdu
        return Placement(processes=instances, replicas=instances)

    def attention_kernel(self, point: TrainPointFields) -> dict[str, str | None] | None:
        return dict(COMPILED_ATTENTION)

    def programming_model(self, eager: EagerRuntime) -> EagerRuntime:
        return SambaFlowModel(self, eager)

    def unsupported_block(self, point: BlockPointFields) -> str | None:
        return ("the microbenchmark times one block with eager PyTorch on a torch device; on SN30 a block needs "
                "a PEF of its own and a session.run per pass, a path not written here")

    def unsupported_peak(self, point: PointFields) -> str | None:
        return "the matmul peak is timed with torch.mm on a torch device; an RDU runs compiled PEFs only"

    def engine_layouts(self) -> bool:
        return False  # SambaFlow compiles the model into a PEF and places it over the RDU's tiles itself

    def unsupported_train(self, point: TrainPointFields) -> str | None:
        if point.engine == "fsdp":
            return ("FSDP shards with torch.distributed collectives in eager PyTorch; SambaFlow runs a compiled PEF "
                    "per instance, data parallel over MPI")
        if point.tp * point.pp > 1:
            return (f"tp {point.tp}, pp {point.pp}: SambaFlow places a model over an RDU's tiles at compile time "
                    f"(tiles_per_instance {self.options.tiles_per_instance}); torch's tensor and pipeline plans "
                    "do not reach a PEF, and SambaFlow's own model-parallel compile options are not passed here")
        if point.gas > 1:
            return ("gradient accumulation on SN30 is not part of the documented SambaFlow API accel-kit follows "
                    "(one session.run per optimizer step); only gas 1 runs")
        if point.engine == "deepspeed":
            return "DeepSpeed has no RDU backend: data parallelism on SN30 is SambaFlow's (one instance per rank)"
        if point.torch_compile:
            return "torch.compile does not apply: SambaFlow compiles the model into a PEF"
        if point.sparsity > 0:
            return ("weight sparsity re-applies its masks on the host after each optimizer step; on SN30 the "
                    "weights live on the RDU")
        if point.attention_kernel != "auto":
            return f"attention_kernel {point.attention_kernel!r} picks a torch SDPA kernel; SambaFlow lowers attention itself"
        if point.activation_checkpointing:
            return "recomputation is a SambaFlow compiler decision, not torch.utils.checkpoint in the traced model"
        return None

    def pef_dir(self) -> Path:
        return Path(self.options.pef_dir or DEFAULT_PEF_DIR).expanduser()

    def job_launch(self, scheduler: str) -> JobLaunch:
        slurm = scheduler == "slurm"
        setup = [
            "# SambaNova SambaFlow: installed with the SambaNova software stack on the host (/opt/sambaflow), not",
            "# from PyPI; activate the Python environment that has sambaflow and accel-kit.",
            f"# One rank per instance ({self.options.tiles_per_instance} of an RDU's {TILES_PER_RDU} tiles). A point "
            "first compiles its PEF (the compile phase,",
            f"# kept under {self.options.pef_dir or DEFAULT_PEF_DIR}), then runs it: one session.run per optimizer step.",
        ]
        if slurm:
            setup.append("export SLURM_MPI_TYPE=pmi2  # srun --mpi=pmi2, as SambaNova's GPT-2 scripts at ALCF start "
                         "their instances")
        return JobLaunch(
            launcher="srun" if slurm else "mpiexec",  # SambaFlow's data parallelism runs over MPI (MPICH)
            setup=tuple(setup),
            directives=("##SBATCH --gres=rdu:<n>  # where RDUs are a Slurm resource, as at ALCF; uncomment and set",)
            if slurm else (),
            # A point's compile happens inside its worker: six hours each (accel-kit's choice, not a measured time).
            params=(("timeout_s", "21600"),))


class SambaFlowModel(ProgrammingModel):
    """SambaFlow's programming model: the model converted for the RDU, and one ``session.run`` per ``step()``
    of a PEF compiled for the point's shape. (Sparsity and the block step are unsupported here.)"""

    adapter: SambaFlowAdapter

    def prepare_model(self, model: nn.Module, point: TrainPointFields, device: torch.device) -> nn.Module:
        from sambaflow import samba

        return samba_model(samba, model)

    def make_trainer(self, point: TrainPointFields, model: nn.Module, batches: Batches, device: torch.device,
                     world: int, *, after_step: Callable[[], None] | None = None) -> PointTrainer:
        from sambaflow import samba
        from sambaflow.samba import utils

        return SambaFlowTrainer(samba, utils, point, model, iter(batches), world, self.adapter, self.eager)


class _LossOnly(nn.Module):
    """The model's loss as its one output: SambaFlow treats every traced output as a loss."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.model(x, y)[1]


def samba_model(samba, model: nn.Module) -> nn.Module:
    """The model as SambaFlow trains it: bf16, the loss as its only output, converted in place."""
    wrapped = _LossOnly(model.to(torch.bfloat16)).train()
    samba.from_torch_model_(wrapped)  # before both compile and trace_graph
    return wrapped


def samba_optimizers(samba, model: nn.Module, spec: JSONObject) -> list:
    """``samba.optim.AdamW`` per weight-decay group of the PEF's ``spec`` (the engine's AdamW groups, by
    parameter name), gradient clipping inside (as SambaNova's GPT-2 tutorial)."""
    params, optim = dict(model.named_parameters()), spec["optim"]
    return [samba.optim.AdamW([params[name] for name in group["names"]], lr=optim["lr"],
                              betas=(optim["beta1"], optim["beta2"]), weight_decay=group["weight_decay"],
                              max_grad_norm=optim["grad_clip"] or None)
            for group in spec["param_groups"]]


def samba_inputs(samba, x: torch.Tensor, y: torch.Tensor) -> list:
    """Token ids and targets as named SambaTensors (int32, batch first), the same names at compile and run."""
    return [samba.from_torch_tensor(x.int(), name="input_ids", batch_dim=0),
            samba.from_torch_tensor(y.int(), name="labels", batch_dim=0)]


def pef_spec(model: nn.Module, point: TrainPointFields, world: int, adapter: SambaFlowAdapter,
             eager: EagerRuntime) -> JSONObject:
    """Everything a PEF depends on; its hash names the PEF. ``eager``: the engine's eager programming model
    (the point's optimizer settings and AdamW groups, which the compile process cannot ask the engine for)."""
    optim = eager.optim_for_point(point)
    from accel_kit.models import family_of

    family = family_of(model.model.cfg)
    spec = {"family": family.name, "config": family.config_dict(model.model.cfg),
            "micro_batch_size": point.micro_batch_size, "seq_len": point.seq_len,
            "data_parallel": world > 1, "tiles": adapter.options.tiles_per_instance,
            "compiler_args": list(adapter.options.compiler_args),
            "optim": {"lr": optim.lr, "weight_decay": optim.weight_decay, "grad_clip": optim.grad_clip,
                      "beta1": optim.beta1, "beta2": optim.beta2}}
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]
    # The groups follow from the config and the weight decay (hashed above), so they do not rename the PEF.
    names = {id(p): name for name, p in model.named_parameters()}
    groups = [{"names": [names[id(p)] for p in group["params"]], "weight_decay": group["weight_decay"]}
              for group in eager.param_groups(model, optim.weight_decay)]
    return spec | {"name": f"accel_kit_{digest}", "out": str(adapter.pef_dir()), "param_groups": groups}


def pef_path(spec: JSONObject) -> Path:
    return Path(spec["out"]) / spec["name"] / f"{spec['name']}.pef"  # where the compiler writes it


def compile_argv(spec: JSONObject) -> list[str]:
    """The compile command's arguments, as SambaFlow's argument parser takes them."""
    argv = ["compile", "-b", str(spec["micro_batch_size"]), "--pef-name", spec["name"], "--output-folder",
            spec["out"], "--num-tiles", str(spec["tiles"])]
    if spec["data_parallel"]:
        argv += ["--data-parallel", "-ws", "2"]  # as ALCF's GPT-2 1.5B compile
    return argv + list(spec["compiler_args"])


def compile_pef(spec: JSONObject) -> None:
    """The compile phase: trace the model with its optimizers and fixed-shape inputs, write the PEF."""
    from sambaflow import samba
    from sambaflow.samba.utils.argparser import parse_app_args

    from accel_kit.models import FAMILIES

    family = FAMILIES[spec["family"]]
    # the graph, not the weights, is compiled
    model = samba_model(samba, family.build(family.config_from_dict(spec["config"])))
    optims = samba_optimizers(samba, model, spec)
    shape = (spec["micro_batch_size"], spec["seq_len"])
    inputs = samba_inputs(samba, torch.zeros(shape, dtype=torch.int32), torch.zeros(shape, dtype=torch.int32))
    args = parse_app_args(argv=compile_argv(spec))
    samba.session.compile(model, inputs, optims, name=spec["name"], config_dict=vars(args), init_output_grads=True)


def compile_command(spec_file: Path) -> list[str]:
    return [sys.executable, "-m", "accel_kit.devices.sambanova", "compile", str(spec_file)]


def ensure_pef(spec: JSONObject, rank: int, *, poll_s: float = 10.0) -> Path:
    """The PEF of ``spec``: compiled now in a child process by rank 0 when missing (other ranks wait for it)."""
    pef = pef_path(spec)
    failed = pef.with_suffix(".failed")
    if pef.is_file():
        return pef
    if rank != 0:
        while not pef.is_file():
            if failed.is_file():
                raise RuntimeError(f"the compile of {pef.name} failed on rank 0: {failed.read_text()[:300]}")
            time.sleep(poll_s)
        return pef
    pef.parent.mkdir(parents=True, exist_ok=True)
    failed.unlink(missing_ok=True)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(spec, f)
    try:
        proc = subprocess.run(compile_command(Path(f.name)), capture_output=True, text=True)
    finally:
        os.unlink(f.name)
    if proc.returncode != 0 or not pef.is_file():
        tail = " | ".join((proc.stdout + proc.stderr).strip().splitlines()[-3:])
        failed.write_text(tail)
        raise RuntimeError(f"SambaFlow compile of {pef.name} failed (exit {proc.returncode}): {tail[-300:]}")
    return pef


class SambaFlowTrainer:
    """``step()`` is one ``samba.session.run``: forward, backward, gradient norm and optimizer on the RDU.

    Args:
        samba, utils: ``sambaflow.samba`` and ``sambaflow.samba.utils``.
        point: the training point (micro-batch, sequence, optimizer settings).
        model: the prepared model (``samba_model``).
        batches: yields ``(x, y)`` micro-batches of this rank.
        world: instances in all (data parallel when above 1).
        adapter: the SambaFlow adapter (options, PEF folder).
        eager: the engine's eager programming model, for its schedule, AdamW groups and loss check.
    """

    def __init__(self, samba, utils, point, model: nn.Module, batches, world: int, adapter: SambaFlowAdapter,
                 eager: EagerRuntime):
        self.samba, self.batches, self.data_parallel, self.eager = samba, batches, world > 1, eager
        self.optim_cfg = eager.optim_for_point(point)
        self.step_count = 0
        spec = pef_spec(model, point, world, adapter, eager)
        optims = samba_optimizers(samba, model, spec)
        shape = (point.micro_batch_size, point.seq_len)
        inputs = samba_inputs(samba, torch.zeros(shape, dtype=torch.int32), torch.zeros(shape, dtype=torch.int32))
        pef = ensure_pef(spec, int(os.environ.get("RANK", 0)))
        # The run phase: the PEF loaded, weights and optimizer state placed on the RDU.
        self.outputs = utils.trace_graph(model, inputs, optims, pef=str(pef), init_output_grads=True)

    def step(self) -> float:
        x, y = next(self.batches)
        extra = {"data_parallel": True, "reduce_on_rdu": True} if self.data_parallel else {}
        lr = self.eager.learning_rate(self.step_count, self.optim_cfg)
        outputs = self.samba.session.run(input_tensors=samba_inputs(self.samba, x, y), output_tensors=self.outputs,
                                         hyperparam_dict={"lr": lr}, section_types=SECTIONS, **extra)
        value = self.samba.to_torch(outputs[0]).float().mean().item()
        self.step_count += 1
        if not math.isfinite(value):
            raise self.eager.NonFiniteLoss(self.step_count, value)
        return value


def main(argv: list[str] | None = None) -> int:
    """``python -m accel_kit.devices.sambanova compile SPEC``: the compile phase in a process of its own."""
    import argparse

    ap = argparse.ArgumentParser(description="compile an accel-kit training point's PEF with SambaFlow")
    ap.add_argument("command", choices=["compile"])
    ap.add_argument("spec", type=Path, help="the PEF's spec (JSON, written by ensure_pef)")
    args = ap.parse_args(argv)
    compile_pef(json.loads(args.spec.read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
