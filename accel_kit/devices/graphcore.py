"""Graphcore IPUs (Bow Pod) through PopTorch, the PyTorch front end of the Poplar SDK.

An IPU is not a torch device. PopTorch compiles the whole training step (forward, backward,
optimizer) into one Poplar program: ``poptorch.trainingModel(model, options, optimizer)``
returns a callable that, per host call, runs ``deviceIterations`` optimizer steps of
``gradientAccumulation`` micro-batches on each of ``replicationFactor`` replicas and returns
host tensors. Here, following Graphcore's GPT-2 example (graphcore/examples,
``nlp/gpt2/pytorch``):

- one process drives all of a point's IPUs: ``replicas = devices / pp``, each replica a pipeline
  over ``pp`` IPUs (``poptorch.BeginBlock`` per stage; the embedding and the tied output
  projection on IPU 0, the blocks spread over the IPUs). The point's ``pp`` is this pipeline:
  ``-p pp N`` asks for N IPUs a replica, and a point that leaves pp at 1 takes the system's
  ``ipus_per_replica`` (the paper's 4), which its record then says (``pp 4 x dp N/4 x tp 1``);
- the global batch is micro-batch x replicas x gradient accumulation, and one host call
  trains that times ``device_iterations`` (the placement's ``steps_per_call``);
- fp16 weights (``model.half()``) with fp16 partials, stochastic rounding and a static loss
  scale in PopTorch's AdamW (fp16 accumulators, fp32 second moment, no bias correction),
  optimizer state off chip;
- timing: the host clock around one whole call (a call returns only when the IPUs are done,
  so ``synchronize`` has nothing to wait for); the learning rate of the next call goes to the
  device with ``setOptimizer`` after each call, as the example's loop does;
- with ``poprun: true`` each point's process is started by ``poprun`` (one instance, the
  point's replicas) and takes its options from ``popdist.poptorch.Options``.

What cannot map is recorded as ``unsupported`` with the reason: the one-block
microbenchmark and the matmul peak (eager PyTorch on a torch device), DeepSpeed, FSDP and
tensor parallelism (torch.distributed's, which a PopTorch program does not run),
``torch.compile``, weight sparsity (masks re-applied on the host after each step), forced
SDPA kernels, and a pipeline without enough gradient accumulation to fill it. There is no
runtime memory statistic (memory is fixed when the program compiles), so peak memory is None.

Nothing here has run on an IPU. ``tests/test_vendor_adapters.py`` checks the order of these
calls against small recording stand-ins of ``poptorch``: the order, not the hardware.
"""
from __future__ import annotations

import math
from typing import Callable

import torch
from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, PositiveInt
from torch import nn

from accel_kit.devices._vendor import first_line, missing, missing_reason, parse_options
from accel_kit.devices.base import (Availability, BaseAdapter, DeviceDescription, JobLaunch, Placement,
                                    PrecisionSupport, ProgrammingModel)
from accel_kit.devices.types import Batches, BlockPointFields, EagerRuntime, PointFields, PointTrainer, TrainPointFields
from accel_kit.json_types import JSONObject

SOURCE = "Graphcore's Poplar SDK (the poptorch wheel in the SDK download)"
COMPILED_ATTENTION = {
    "attention_kernel_ran": None, "attention_op": None,
    "attention_kernel_reason": "PopTorch compiles the model for the IPU: Poplar lowers attention, torch's SDPA "
                               "dispatch does not choose a kernel"}


class PopTorchOptions(BaseModel):
    """``options:`` of an IPU system (params/systems/bow-pod64.yaml)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ipus_per_replica: PositiveInt = 4  # pipeline stages' IPUs per model replica (the paper: 4)
    device_iterations: PositiveInt = 1  # optimizer steps per host call
    layers_per_ipu: list[NonNegativeInt] | None = None  # blocks on each IPU; None: spread evenly
    loss_scaling: float = Field(default=1024.0, gt=0)  # static fp16 loss scale in PopTorch's AdamW
    half_partials: bool = True  # fp16 partials of fp16 matmuls (Graphcore's --enable-half-partials)
    poprun: bool = True  # start each point's process with poprun (one instance holding its replicas)
    vipu_partition: str | None = None  # poprun --vipu-partition; None: poprun's own default
    executable_cache_dir: str | None = None  # PopTorch's executable cache: a recompile is skipped


class PopTorchAdapter(BaseAdapter):
    name = "poptorch"

    def __init__(self) -> None:
        self.options = PopTorchOptions()

    def configure(self, options: JSONObject) -> None:
        self.options = parse_options(self.name, PopTorchOptions, options)

    def availability(self) -> Availability:
        if missing("poptorch"):
            return Availability(False, missing_reason("poptorch", SOURCE))
        try:
            import poptorch

            ok = poptorch.ipuHardwareIsAvailable(self.options.ipus_per_replica)
        except Exception as exc:
            return Availability(False, f"poptorch failed to import or query the IPUs: {first_line(exc)}")
        if not ok:
            return Availability(False, f"no {self.options.ipus_per_replica} IPUs are reachable "
                                       f"(poptorch.ipuHardwareIsAvailable({self.options.ipus_per_replica}) is False)")
        return Availability(True)

    def torch_device(self, index: int = 0) -> torch.device:
        return torch.device("cpu")  # the host: models are built here and PopTorch takes them to the IPUs

    def synchronize(self) -> None:
        pass  # a PopTorch call returns host tensors, i.e. only when the IPUs have finished it

    def supported_precisions(self) -> tuple[str, ...]:
        return ("fp32", "fp16")

    def precision_support(self, precision: str) -> PrecisionSupport:
        reasons = {"fp16": "fp16 native on the IPU's AMP units (fp16 or fp32 partials)", "fp32": "fp32 native"}
        return PrecisionSupport(precision, True, reasons[precision])

    def energy_meter(self, index: int = 0):
        from accel_kit.devices.power import UnavailableMeter

        return UnavailableMeter("Graphcore's PopTorch exposes no energy or power counter for an IPU; the IPU-M2000's board power is read through the BMC/Redfish of the machine, outside a training process")

    def describe(self) -> DeviceDescription:
        import poptorch

        versions = {"torch": torch.__version__, "poptorch": getattr(poptorch, "__version__", "unknown")}
        # PopTorch has no device-count query; the largest power of two it can attach is what a point may use.
        count = max((n for n in (1, 2, 4, 8, 16, 32, 64) if poptorch.ipuHardwareIsAvailable(n)), default=0)
        return DeviceDescription(adapter=self.name, device_model=f"Graphcore IPU (hardware version "
                                                                 f"{poptorch.ipuHardwareVersion()})",
                                 device_count=count, versions=versions,
                                 extra=self.options.model_dump(exclude={"executable_cache_dir"}))

    # --- the programming model

    def placement(self, devices: int) -> Placement:
        # One process drives every replica; the replicas are the devices over the pipeline (ParallelLayout.dp), as
        # for torch's pipelines.
        return Placement(processes=1, replicas=devices, steps_per_call=self.options.device_iterations)

    def pipeline_degree(self, pp: int) -> int:
        # The point's pp (IPUs a replica), or the system's ipus_per_replica where it asks none.
        return pp if pp > 1 else self.options.ipus_per_replica

    def engine_layouts(self) -> bool:
        return False  # PopTorch replicates and pipelines the compiled program itself

    def attention_kernel(self, point: TrainPointFields) -> dict[str, str | None] | None:
        return dict(COMPILED_ATTENTION)

    def layers_per_ipu(self, n_layers: int, ipus: int | None = None) -> list[int]:
        """Blocks on each of a replica's ``ipus`` (None: ``ipus_per_replica``): the option, or spread evenly
        (the first IPUs take the remainder)."""
        k = ipus or self.options.ipus_per_replica
        if self.options.layers_per_ipu is not None:
            return list(self.options.layers_per_ipu)
        return [n_layers // k + (1 if i < n_layers % k else 0) for i in range(k)]

    def stage_starts(self, n_layers: int, ipus: int | None = None) -> dict[int, int]:
        """Block index -> IPU where a new pipeline stage starts (on IPUs after the first that hold blocks)."""
        starts, first = {}, 0
        for ipu, n in enumerate(self.layers_per_ipu(n_layers, ipus)):
            if ipu > 0 and n > 0:
                starts[first] = ipu
            first += n
        return starts

    def pipeline_stages(self, n_layers: int, ipus: int | None = None) -> int:
        """Stages: the embedding's on IPU 0 (with IPU 0's blocks), one per later IPU with blocks, and the
        output projection back on IPU 0 (AutoIncrement gives a block that returns to an IPU a new stage)."""
        if (ipus or self.options.ipus_per_replica) == 1:
            return 1
        return 2 + len(self.stage_starts(n_layers, ipus))

    def programming_model(self, eager: EagerRuntime) -> EagerRuntime:
        return PopTorchModel(self, eager)

    def unsupported_block(self, point: BlockPointFields) -> str | None:
        return ("the microbenchmark times one block with eager PyTorch on a torch device; an IPU has none "
                "(PopTorch compiles whole models), and one block on a "
                f"{self.options.ipus_per_replica}-IPU pipeline has nothing to pipeline")

    def unsupported_peak(self, point: PointFields) -> str | None:
        return "the matmul peak is timed with torch.mm on a torch device; PopTorch has no eager device to time it on"

    def unsupported_train(self, point: TrainPointFields) -> str | None:
        k = point.pp  # IPUs a replica pipelines over (the system's ipus_per_replica where the point asked none)
        if point.devices % k:
            return f"{point.devices} IPUs: a point needs a multiple of {k} (pp, one pipelined replica)"
        if point.engine == "deepspeed":
            return "DeepSpeed has no IPU backend: data parallelism on IPUs is PopTorch's replication factor"
        if point.engine == "fsdp":
            return ("FSDP shards with torch.distributed collectives between processes; PopTorch runs one compiled "
                    "program over replicas it holds itself (its replicated tensor sharding is not written here)")
        if point.tp > 1:
            return (f"tp {point.tp}: PopTorch splits a model over IPUs as a pipeline (pp), not by tensor parallelism "
                    "(Graphcore's tensor-parallel models are written in PopXL, not PopTorch)")
        if point.torch_compile:
            return "torch.compile does not apply: PopTorch compiles the model itself"
        if point.sparsity > 0:
            return ("weight sparsity re-applies its masks on the host after each optimizer step; under PopTorch the "
                    "weights stay on the IPUs for the whole call")
        if point.attention_kernel != "auto":
            return f"attention_kernel {point.attention_kernel!r} picks a torch SDPA kernel; Poplar lowers attention itself"
        from accel_kit.models import family_of, get_config

        cfg = get_config(point.preset)
        n_layers = family_of(cfg).shape(cfg).n_layers
        layers = self.layers_per_ipu(n_layers, k)
        if len(layers) != k or sum(layers) != n_layers:
            return f"layers_per_ipu {layers} must give {k} IPUs {n_layers} blocks in all"
        stages = self.pipeline_stages(n_layers, k)
        if k > 1 and point.gas < stages:
            return (f"a pipeline of {stages} stages over {k} IPUs needs gradient accumulation of at least {stages} "
                    f"to fill it, got gas {point.gas} (the paper used 128 and 1024)")
        return None

    def launch_prefix(self, point: PointFields, launcher: str) -> list[str]:
        # poprun attaches the point's devices as replicas: a point that spans no devices (a block, a
        # peak: unsupported on IPUs, recorded so by a plain worker) or that cannot run here gets none.
        if not self.options.poprun or launcher != "local" or getattr(point, "devices", None) is None \
                or self.unsupported_train(point):
            return []
        words = ["poprun", "--num-instances=1", f"--num-replicas={point.dp}",
                 f"--ipus-per-replica={point.pp}"]
        if self.options.vipu_partition:
            words.append(f"--vipu-partition={self.options.vipu_partition}")
        return words

    def job_launch(self, scheduler: str) -> JobLaunch:
        starter = ("poprun (one instance holding the point's replicas)" if self.options.poprun
                   else "python directly (poprun: false)")
        return JobLaunch(launcher="local", setup=(
            "# Graphcore Poplar SDK: source its enable script and activate a virtualenv with the SDK's poptorch wheel",
            "# (not on PyPI), e.g.: source <sdk>/enable; source <venv>/bin/activate",
            f"# Each point runs as one process started by {starter}:",
            f"# replicas = devices / {self.options.ipus_per_replica} IPUs per replica (the system's options; "
            "-p pp N pipelines over N).",
            "# A pipelined replica needs gradient accumulation to fill it: the paper ran -p gas 128 and 1024.",
        ))


class PopTorchModel(ProgrammingModel):
    """PopTorch's programming model: the model staged over a replica's IPUs and wrapped to return its loss,
    and one ``trainingModel`` call per ``step()``. (Sparsity and the block step are unsupported here.)"""

    adapter: PopTorchAdapter

    def prepare_model(self, model: nn.Module, point: TrainPointFields, device: torch.device) -> nn.Module:
        import poptorch

        from accel_kit.models import family_of_model

        stages = family_of_model(model).pipeline_stages(model)  # where the family splits: attribute names
        blocks = getattr(model, stages.blocks)
        model.train()
        if point.precision == "fp16":
            model.half()  # fp16 weights, as Graphcore's GPT-2 (the optimizer keeps its own accumulators)
        if point.activation_checkpointing:
            # The IPU's form of recomputation: a checkpoint on each block's output (Graphcore's
            # recompute_checkpoint_every_layer) instead of torch.utils.checkpoint, which PopTorch does not trace.
            model.activation_checkpointing = False
            for block in blocks:
                block.register_forward_hook(lambda module, inputs, out: poptorch.recomputationCheckpoint(out))
        if point.pp > 1:
            # A block starts a stage on its IPU; what follows stays there until the next block. The
            # embedding and the output projection (tied to it in GPT-2) on IPU 0, as in Graphcore's GPT-2.
            first, head = stages.embedding[0], stages.head[-1]
            setattr(model, first, poptorch.BeginBlock(getattr(model, first), first, ipu_id=0))
            for i, ipu in self.adapter.stage_starts(len(blocks), point.pp).items():
                blocks[i] = poptorch.BeginBlock(blocks[i], f"block{i}", ipu_id=ipu)
            setattr(model, head, poptorch.BeginBlock(getattr(model, head), head, ipu_id=0))
        return LossOnly(model)

    def make_trainer(self, point: TrainPointFields, model: nn.Module, batches: Batches, device: torch.device,
                     world: int, *, after_step: Callable[[], None] | None = None) -> PointTrainer:
        import poptorch

        # The data-parallel replicas and steps per call the point was made with (its pp IPUs each).
        placement = Placement(processes=1, replicas=point.dp, steps_per_call=point.steps_per_call)
        return PopTorchTrainer(poptorch, point, model, iter(batches), self.adapter.options, placement, self.eager)


def _under_poprun() -> bool:
    """Whether poprun started this process (popdist, which ships with the SDK, says so)."""
    if missing("popdist"):
        return False
    import popdist

    return popdist.isPopdistEnvSet()


class LossOnly(nn.Module):
    """The model's loss as its only output (PopTorch returns outputs to the host; logits would be large)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        import poptorch

        _, loss = self.model(x, y)
        return poptorch.identity_loss(loss, reduction="none")


class PopTorchTrainer:
    """``step()`` is one PopTorch call: ``device_iterations`` optimizer steps on every replica.

    Args:
        poptorch: the imported module.
        point: the training point (micro-batch, gas, precision, optimizer settings, seed).
        model: the prepared model (``LossOnly``, stages placed).
        batches: yields ``(x, y)`` micro-batches; a call takes micro-batch x gas x replicas x device iterations.
        options: the system's PopTorch options.
        placement: replicas and steps per call.
        eager: the engine's eager programming model, for its schedule, AdamW groups and loss check.
    """

    def __init__(self, poptorch, point, model: nn.Module, batches, options: PopTorchOptions, placement: Placement,
                 eager: EagerRuntime):
        self.poptorch, self.batches, self.eager = poptorch, batches, eager
        self.gas, self.replicas, self.iterations = point.gas, placement.replicas, placement.steps_per_call
        self.micro_batches_per_call = point.gas * placement.replicas * placement.steps_per_call
        self.samples_per_call = point.micro_batch_size * self.micro_batches_per_call
        self.optim_cfg = eager.optim_for_point(point)
        self.step_count = 0
        half = point.precision == "fp16"
        accum = torch.float16 if half else torch.float32
        self.optimizer = poptorch.optim.AdamW(
            eager.param_groups(model, self.optim_cfg.weight_decay), lr=eager.learning_rate(0, self.optim_cfg),
            betas=(self.optim_cfg.beta1, self.optim_cfg.beta2),
            eps=1e-6,  # representable in the fp16 accumulators (Graphcore's GPT-2 uses it)
            bias_correction=False, loss_scaling=options.loss_scaling if half else 1.0,
            accum_type=accum, first_order_momentum_accum_type=accum, second_order_momentum_accum_type=torch.float32,
            max_grad_norm=self.optim_cfg.grad_clip or None)
        opts = self._options(point, options, placement, half)
        self.model = poptorch.trainingModel(model, options=opts, optimizer=self.optimizer)
        # Compile before timing (the program for this shape; cached with executable_cache_dir), on the
        # first call's own batch, which that call then uses.
        self._next = self._batch()
        self.model.compile(*self._next)

    def _options(self, point, options: PopTorchOptions, placement: Placement, half: bool):
        poptorch = self.poptorch
        if _under_poprun():  # the replicas are poprun's (--num-replicas), as in Graphcore's examples
            import popdist.poptorch

            opts = popdist.poptorch.Options(ipus_per_replica=point.pp)
        else:
            opts = poptorch.Options()
            opts.replicationFactor(placement.replicas)
        opts.deviceIterations(placement.steps_per_call)
        opts.Training.gradientAccumulation(point.gas)
        opts.Training.accumulationAndReplicationReductionType(poptorch.ReductionType.Mean)
        opts.outputMode(poptorch.OutputMode.Sum)
        opts.TensorLocations.setOptimizerLocation(poptorch.TensorLocationSettings().useOnChipStorage(False))
        opts.randomSeed(point.seed)
        if point.pp > 1:
            opts.setExecutionStrategy(poptorch.PipelinedExecution(poptorch.AutoStage.AutoIncrement))
        if half:
            opts.Precision.enableStochasticRounding(True)
            if options.half_partials:
                opts.Precision.setPartialsType(torch.float16)
        if options.executable_cache_dir:
            opts.enableExecutableCaching(options.executable_cache_dir)
        return opts

    def _batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """One call's input: micro-batches stacked along the batch axis, as PopTorch splits it."""
        pairs = [next(self.batches) for _ in range(self.micro_batches_per_call)]
        return torch.cat([x for x, _ in pairs]), torch.cat([y for _, y in pairs])

    def step(self) -> float:
        x, y = self._next if self._next is not None else self._batch()
        self._next = None
        out = self.model(x, y)  # device_iterations optimizer steps, on every replica
        self.step_count += self.iterations
        # The next call's learning rate, sent to the IPUs (PopTorch never calls optimizer.step()).
        for group in self.optimizer.param_groups:
            group["lr"] = self.eager.learning_rate(self.step_count, self.optim_cfg)
        self.model.setOptimizer(self.optimizer)
        # OutputMode.Sum: each replica's loss summed over its micro-batches and iterations.
        value = out.float().div(self.gas * self.iterations).mean().item()
        if not math.isfinite(value):
            raise self.eager.NonFiniteLoss(self.step_count, value)
        return value
