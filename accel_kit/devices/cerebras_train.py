"""accel-kit's points in the Cerebras programming model (cerebras-pytorch 2.x, ``cstorch``).

Imported by ``accel_kit.devices.cerebras`` when a point runs, never by ``import accel_kit``:
it imports cerebras-pytorch at module level.

- ``open_backend``: the process's one cstorch backend (a second ``cstorch.backend(...)`` raises,
  so an existing one is reused), CPU or CSX with its ``ClusterConfig``.
- ``CstorchTrainer``: a training point as Cerebras writes one. The model is
  ``cstorch.compile``-d; one ``@cstorch.trace`` step runs forward and backward (over the GAS
  micro-batches, unrolled in the trace, on the CPU backend; on CSX the compiler accumulates),
  clips the gradient norm and steps
  ``cstorch.optim.AdamW`` and its schedulers; the loss is read in a ``@cstorch.step_closure``;
  batches come from ``cstorch.utils.data.DataLoader(point_input_fn, ...)`` through a
  ``DataExecutor``, whose profiler's rate tracker gives cstorch's own samples/s.
- ``CstorchSparsity``: weight sparsity through ``cstorch.sparse`` (Static, magnitude masks),
  on the same block linears as ``accel_kit.sparsity``.
- ``BlockStep``: the microbenchmark's block, compiled and traced the same way.

``step()`` follows the executor's rhythm: a step's closures run when the executor is asked for
the next batch, so each ``step()`` runs the traced step, then advances the executor (which runs
the closures: the loss is known) and holds the next batch for the following call.
"""
from __future__ import annotations

import atexit
import contextlib
import math
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import cerebras.pytorch as cstorch
import torch

from accel_kit.devices._vendor import package_version
from accel_kit.devices.cerebras import CerebrasOptions
from accel_kit.models.hf import block_output
from accel_kit.sparsity.execution import SparseExecution
from accel_kit.sparsity.prune import prunable_layers
from accel_kit.engine.step import NotMeasured

# AdamW's epsilon: torch's default, which every other system's step uses (cstorch's own default is 1e-6).
ADAMW_EPS = 1e-8


def _current_backend():
    """The process's cstorch backend, or None (``cstorch.backend()`` raises when there is none)."""
    try:
        return cstorch.backend()
    except RuntimeError:
        return None


def open_backend(options: CerebrasOptions, point: Any):
    """The cstorch backend of ``options`` for ``point``: the existing one when this process has one.

    Only one backend may exist per process (a notebook cell run twice, or two points in one
    worker): a second ``cstorch.backend(...)`` raises, so the existing one is returned when
    its type matches, and a mismatch is an error saying so.
    """
    existing = _current_backend()
    if existing is not None:
        if existing.backend_type.name != options.backend:
            raise RuntimeError(f"this process already has a cstorch {existing.backend_type.name} backend; "
                               f"backend {options.backend} needs a fresh process")
        return existing
    artifact_dir = options.artifact_dir
    if artifact_dir is None:
        artifact_dir = tempfile.mkdtemp(prefix="accel-kit-cstorch-")
        atexit.register(shutil.rmtree, artifact_dir, ignore_errors=True)
    if options.backend == "CPU":
        return cstorch.backend("CPU", artifact_dir=artifact_dir)
    # cstorch lowers the traced step with a tool installed next to this Python (torch-cirh-opt), which it
    # finds on PATH: a run started as .venv-cerebras/bin/accel-kit, without activating the venv, has it too.
    tools = str(Path(sys.executable).parent)
    if shutil.which("torch-cirh-opt") is None and (Path(tools) / "torch-cirh-opt").exists():
        os.environ["PATH"] = tools + os.pathsep + os.environ.get("PATH", "")
    from accel_kit.paths import project_root

    root = str(project_root())
    data = [str(Path(point.data_path).parent)] if getattr(point, "data_path", None) else []
    cluster = {name: getattr(options, name) for name in ("mgmt_address", "mgmt_namespace", "credentials_path",
                                                         "job_time_sec", "max_wgt_servers", "max_act_per_csx",
                                                         "num_workers_per_csx")
               if getattr(options, name) is not None}
    # The cluster's input workers run point_input_fn: they import accel_kit from this checkout and
    # read the prepared data, so both are mounted unless the options say otherwise.
    cluster |= {"num_csx": getattr(point, "devices", 1), "mount_dirs": options.mount_dirs or [root, *data],
                "python_paths": options.python_paths or [root]}
    cstorch.backends.csx.performance.micro_batch_size = compiler_micro_batch(options, point)
    kwargs = {"artifact_dir": artifact_dir, "compile_only": options.compile_only,
              "validate_only": options.validate_only,
              "cluster_config": cstorch.distributed.ClusterConfig(**cluster)}
    if options.compile_dir:
        kwargs["compile_dir"] = options.compile_dir
    return cstorch.backend("CSX", **kwargs)


def compiler_micro_batch(options: CerebrasOptions, point: Any):
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


def set_precision(precision: str) -> None:
    """cstorch's mixed-precision state for ``precision``: fp32 off; bf16 / fp16 as its 16-bit type."""
    if precision == "fp32":
        cstorch.amp.enable_mixed_precision(False)
        return
    cstorch.amp.set_half_dtype({"bf16": torch.bfloat16, "fp16": torch.float16}[precision])
    cstorch.amp.enable_mixed_precision(True)


def _autocast(precision: str):
    # On CPU this is torch.autocast in the half dtype (bf16 only there); on CSX a no-op (the compiler casts).
    return contextlib.nullcontext() if precision == "fp32" else cstorch.amp.autocast()


# --------------------------------------------------------------------------- data

class _StepBatches(torch.utils.data.IterableDataset):
    """Each item is one optimizer step's batch: ``micro`` micro-batches of the point's source, stacked."""

    def __init__(self, point_fields: dict, vocab_size: int, micro: int):
        super().__init__()
        self.point_fields, self.vocab_size, self.micro = point_fields, vocab_size, micro

    def __iter__(self):
        from accel_kit.engine.point import TrainPoint
        from accel_kit.engine.worker import point_batches

        source = point_batches(TrainPoint.model_validate(self.point_fields), self.vocab_size, rank=0)
        while True:
            parts = [next(source) for _ in range(self.micro)]
            yield torch.cat([x for x, _ in parts]), torch.cat([y for _, y in parts])


def point_input_fn(point_fields: dict, vocab_size: int, micro: int) -> torch.utils.data.DataLoader:
    """The ``input_fn`` of ``cstorch.utils.data.DataLoader``: a torch DataLoader of the point's step batches.

    Module-level, with plain arguments: on a cluster it is shipped to the input workers, which
    rebuild the point's batch source from its fields (``accel_kit.engine.worker.point_batches``).
    """
    return torch.utils.data.DataLoader(_StepBatches(point_fields, vocab_size, micro), batch_size=None)


# --------------------------------------------------------------------------- sparsity

class CstorchSparsity:
    """Weight sparsity through ``cstorch.sparse``: Static, magnitude (``topk``) masks on every block linear.

    The same layers and the same rule as ``accel_kit.sparsity.WeightSparsity`` (the fraction of
    each block linear's weights with the smallest magnitude is pruned; cstorch keeps
    floor((1 - s) n) weights where accel-kit keeps n - round(s n), at most one fewer), but kept by cstorch:
    it prunes the weights before each forward, the gradients in a hook and AdamW's state in
    an optimizer hook, and on a CS-2 the compiler is told the sparsity level. ``attach`` (in
    the trainer, after ``cstorch.compile`` and the optimizer, as cstorch requires) applies it.
    """

    def __init__(self, model: torch.nn.Module, point: Any, backend_type: str):
        self.model, self.level, self.backend_type = model, float(point.sparsity), backend_type
        self.layers = prunable_layers(model) if self.level > 0 else []
        self.algorithm = None
        if not self.layers:
            self.execution = SparseExecution("dense-model")
        elif backend_type == "CSX":
            self.execution = SparseExecution("csx", "every pruned layer (cstorch.sparse Static)",
                                             kernel="CS-2 sparse weight streaming")
        else:
            self.execution = SparseExecution("dense-zeros", "cstorch.sparse Static masks; the cstorch CPU "
                                                            "backend multiplies the masked weights in dense matmuls")

    @property
    def active(self) -> bool:
        return bool(self.layers)

    def apply_masks(self) -> None:
        """Nothing to do after a step: cstorch keeps the masks itself."""

    def attach(self, optimizer) -> None:
        if not self.active:
            return
        self.algorithm = cstorch.sparse.configure({
            "algorithm": "static", "sparsity": self.level, "init_method": "topk",
            "param_filter": [f"{name}.weight" for name, _ in self.layers]})
        self.algorithm.apply(self.model)
        self.algorithm.apply(optimizer)

    def _host(self, tensor: torch.Tensor) -> torch.Tensor:
        return cstorch.backend().to_cpu(tensor.detach())

    def masks(self) -> dict[str, torch.Tensor]:
        """Each pruned layer's cstorch mask (True: kept), on the host."""
        return {name: self._host(linear.weight_mask).bool() for name, linear in self.layers}

    def metrics(self) -> dict[str, Any]:
        """What a record says about the sparsity, measured from the weights and masks now."""
        fractions, zeros, total, kept, masked_nonzero = {}, 0, 0, 0, 0
        layers = self.layers or prunable_layers(self.model)
        masks = self.masks() if self.layers else {}
        for name, linear in layers:
            weight = self._host(linear.weight)
            n_zero = int((weight == 0).sum())
            fractions[name] = n_zero / weight.numel()
            zeros, total = zeros + n_zero, total + weight.numel()
            if name in masks:
                kept += int(masks[name].sum())
                masked_nonzero += int(((weight != 0) & ~masks[name]).sum())
        out = {
            "sparsity_measured": zeros / total,
            "sparsity_layer_min": min(fractions.values()) if self.layers else None,
            "sparsity_layer_max": max(fractions.values()) if self.layers else None,
            "pruned_layers": len(self.layers),
            "nonzero_block_weights": kept if self.layers else total,
            "sparse_execution": self.execution.describe(),
            "sparse_execution_kind": self.execution.kind,
            "sparse_kernel": self.execution.kernel,
            "sparse_kernel_layers": len(self.layers) if self.execution.kernel else 0,
            "sparse_kernel_timing": [],
        }
        if self.layers:
            out |= {"sparsity_algorithm": "cstorch.sparse Static, init topk (magnitude)",
                    "sparsity_mask_density": kept / total,
                    # Pruned weights that are not zero: 0 when the masks held through training.
                    "sparsity_masked_nonzero": masked_nonzero}
        return out

    def release(self) -> None:
        """Every weight trains again (dense fine-tuning): the masks become all-ones.

        cstorch prunes with the mask buffers on every forward, gradient and optimizer step, so
        filling them is enough on the CPU backend (on CSX the level is compiled in; the adapter
        records such a point as unsupported).
        """
        with torch.no_grad():
            for _, linear in self.layers:
                linear.weight_mask.fill_(True)
        self.layers = []


# --------------------------------------------------------------------------- training

class _Executor:
    """A DataExecutor driven one step at a time: ``step(fn)`` runs ``fn(batch)``, hands its output to
    ``record`` (a ``cstorch.step_closure``), and ends the step, which runs the closures."""

    def __init__(self, dataloader, num_steps: int, record):
        self.record = record
        self.executor = cstorch.utils.data.DataExecutor(dataloader, num_steps=num_steps, checkpoint_steps=0)
        self._it = iter(self.executor)
        self._batch = next(self._it)  # starts the run: the model to the device, sparsity masks initialised

    def step(self, fn) -> None:
        if self._batch is None:
            raise RuntimeError("the cstorch executor has run all its steps")
        out = fn(self._batch)
        self.record(out)
        self._batch = next(self._it, None)  # the step's end: its closures run (record has its value)

    def rate_tracker(self) -> dict[str, Any]:
        """cstorch's own throughput: the executor profiler's rate tracker, now."""
        tracker = self.executor.profiler.rate_tracker
        return {"samples_per_s_cstorch": tracker.global_rate, "samples_per_s_cstorch_smoothed": tracker.rate,
                "cstorch_total_samples": tracker.total_samples, "cstorch_elapsed_s": tracker.total_time,
                "cstorch_flops_utilization_pct": tracker.flops_utilization}


class CstorchTrainer:
    """A training point on a cstorch backend; ``step()`` runs one optimizer step and returns its loss.

    Args:
        point: the ``TrainPoint``.
        model: the fp32 model (``CerebrasAdapter.prepare_model`` opened the backend and set the precision).
        options: the system's Cerebras options.
        sparsity: the point's ``CstorchSparsity`` (``make_sparsity``), attached after the optimizer.
    """

    def __init__(self, point: Any, model: torch.nn.Module, options: CerebrasOptions, *,
                 sparsity: CstorchSparsity | None = None):
        from accel_kit.engine.step import optim_for_point, param_groups

        self.point, self.options = point, options
        self.after_step = None  # (the worker clears it before dense fine-tuning; cstorch needs none)
        backend = cstorch.backend()
        self.backend_type = backend.backend_type.name
        self.compiled = cstorch.compile(model, backend)
        cfg = optim_for_point(point)
        self.optimizer = cstorch.optim.AdamW(param_groups(model, cfg.weight_decay), lr=cfg.lr,
                                             betas=(cfg.beta1, cfg.beta2), eps=ADAMW_EPS, correct_bias=True)
        if sparsity is not None:
            sparsity.attach(self.optimizer)
        # The schedule of every system's step (accel_kit.engine.step.learning_rate): linear warm-up
        # to lr, then cosine decay to min_lr, as cstorch schedulers (stepped inside the trace).
        warmup = cstorch.optim.lr_scheduler.LinearLR(self.optimizer, initial_learning_rate=cfg.lr / cfg.warmup_steps,
                                                     end_learning_rate=cfg.lr, total_iters=cfg.warmup_steps)
        decay = cstorch.optim.lr_scheduler.CosineDecayLR(self.optimizer, initial_learning_rate=cfg.lr,
                                                         end_learning_rate=cfg.min_lr, total_iters=cfg.decay_steps)
        self.scheduler = cstorch.optim.lr_scheduler.SequentialLR(self.optimizer, [warmup, decay],
                                                                 milestones=[cfg.warmup_steps])
        self.scaler = cstorch.amp.GradScaler(loss_scale="dynamic") if point.precision == "fp16" else None
        self.losses: list[float] = []
        self.step_count = 0
        # Gradient accumulation. On the CPU backend the traced step runs the GAS micro-batches itself
        # (a Python loop, unrolled in the trace: real accumulation on the host). On CSX the step takes
        # the whole batch and the compiler accumulates over micro-batches (compiler_micro_batch: the
        # point's, by default), as Cerebras code does; an unrolled loop there would also prune each
        # sparse weight once per forward, which the CSX lowering rejects.
        unrolled = self.backend_type == "CPU"
        gas = point.gas if unrolled else 1
        rows = point.micro_batch_size * point.devices * (1 if unrolled else point.gas)
        self.gas_in = ("the traced step (GAS micro-batches unrolled)" if unrolled else
                       f"the CS-2 compiler (micro_batch_size {compiler_micro_batch(options, point)!r})")
        precision, clip = point.precision, cfg.grad_clip
        params = [p for group in self.optimizer.param_groups for p in group["params"]]

        @cstorch.trace
        def train_step(batch):
            x, y = batch
            total = None
            for k in range(gas):  # unrolled in the trace: the step's graph holds every micro-batch
                with _autocast(precision):
                    _, loss = self.compiled(x[k * rows:(k + 1) * rows], y[k * rows:(k + 1) * rows])
                loss = loss / gas  # the mean over the accumulated micro-batches
                (self.scaler.scale(loss) if self.scaler else loss).backward()
                total = loss.detach() if total is None else total + loss.detach()
            if self.scaler:
                self.scaler.unscale_(self.optimizer)
            if clip > 0:
                torch.nn.utils.clip_grad_norm_(params, clip)
            if self.scaler:
                self.scaler.step(self.optimizer)
                self.scaler.update()
            else:
                self.optimizer.step()
            self.optimizer.zero_grad()
            self.scheduler.step()
            return total

        @cstorch.step_closure
        def record(loss):
            self.losses.append(float(loss.item()))

        self._train_step = train_step
        self.timed_steps = point.warmup_steps + point.steps
        self._rate: dict[str, Any] = {}
        self._times_s: list[float] = []
        vocab = model.cfg.vocab_size
        dataloader = cstorch.utils.data.DataLoader(point_input_fn, point.model_dump(), vocab,
                                                   point.gas * point.devices)
        self.executor = _Executor(dataloader, point.warmup_steps + point.steps + point.dense_finetune_steps, record)

    def step(self) -> float:
        from accel_kit.engine.step import NonFiniteLoss

        before = len(self.losses)
        self.executor.step(self._train_step)
        self.step_count += 1
        if self.options.compile_only or self.options.validate_only:
            # cstorch runs one step in these modes: the trace, lowered and compiled (compile_only, on the
            # cluster) or validated (validate_only); nothing executes, so there is nothing to measure.
            what = ("compile_only: the step was traced and compiled, not run" if self.options.compile_only
                    else "validate_only: the step was traced and validated, not compiled or run")
            raise NotMeasured("skipped", f"{what}, so nothing was measured "
                                         f"(artifacts: {cstorch.backend().artifact_dir})")
        if len(self.losses) != before + 1:
            raise RuntimeError(f"the step closure gave {len(self.losses) - before} losses for one step")
        if self.step_count == self.timed_steps:
            self._rate = self.executor.rate_tracker()  # the end of the timed steps: cstorch's figure now
        value = self.losses[-1]
        if not math.isfinite(value):
            raise NonFiniteLoss(self.step_count, value)
        return value

    def extra_metrics(self, timing=None) -> dict[str, Any]:
        """cstorch's own figures beside ours, for the record.

        cstorch's rate tracker (``samples_per_s_cstorch``, read at the end of the timed steps)
        counts the samples of every step so far but starts its clock in a step closure, i.e. at
        the end of the first step (to leave compilation out): its figure includes one step's
        samples that its clock did not see. ``samples_per_s_same_window`` is the same count over
        our clock's time for the same steps (every step but the first), so the two differ only
        by the clocks; ``samples_per_s`` (the median step, warm-up excluded) is what every
        system reports.
        """
        out: dict[str, Any] = {
            "cstorch_backend": self.backend_type,
            "cerebras_pytorch_version": package_version("cerebras-pytorch"),
            "torch_version": torch.__version__,
            "cstorch_mixed_precision": self.point.precision != "fp32",
            "cstorch_half_dtype": cstorch.amp.get_half_dtype_str() if self.point.precision != "fp32" else None,
            "optimizer": f"cstorch.optim.AdamW (eps {ADAMW_EPS:g})",
            "gas_in": self.gas_in,
        } | self._rate
        if self.backend_type == "CSX":
            # The worker's host-side probes say nothing about a CS-2: the compiler lowers attention
            # itself, and no eager matmul peak exists there (the adapter marks peak points unsupported).
            out |= {"attention_kernel_ran": None, "attention_op": None,
                    "attention_kernel_reason": "the CS-2 compiler lowers attention itself; the host probe does not apply",
                    "mfu_measured_reason": "no measured matmul peak on a CS-2: every computation is a compiled step"}
        if timing is not None and self._rate:
            seconds = sum((list(timing.warmup_times_s) + list(timing.times_s))[1:])
            out["samples_per_s_same_window"] = self._rate["cstorch_total_samples"] / seconds if seconds else None
        return out


# --------------------------------------------------------------------------- the microbenchmark's block

class BlockStep:
    """One microbenchmark iteration of a block on the cstorch backend: forward, or forward and backward.

    The block (already cast to the point's precision, as the microbenchmark defines it) is
    compiled; each call runs the traced step on the input and advances the executor, whose
    step closure fetches a scalar of the output (forward) or of the weight gradients
    (forward and backward), so that the compiled step has outputs a CS-2 would keep.
    """

    def __init__(self, point: Any, module: torch.nn.Module, x: torch.Tensor, grad_out: torch.Tensor | None):
        backend = cstorch.backend()
        self.compiled = cstorch.compile(module, backend)
        self.values: list[float] = []
        params = [p for p in module.parameters() if p.requires_grad]
        backward = grad_out is not None

        @cstorch.trace
        def block_step(batch):
            inp = batch[0]
            if not backward:
                with torch.no_grad():
                    out = block_output(self.compiled(inp))
                return out.float().mean()
            for p in params:
                p.grad = None
            block_output(self.compiled(inp)).backward(batch[1])
            return sum(p.grad.float().sum() for p in params)

        @cstorch.step_closure
        def record(value):
            self.values.append(float(value.item()))

        self._step = block_step
        # Batch tensors only: cstorch infers the batch size from every tensor of a batch.
        items = (x.detach(), grad_out) if backward else (x.detach(),)
        dataloader = cstorch.utils.data.DataLoader(_repeat_input_fn, items)
        self.executor = _Executor(dataloader, point.warmup + point.trials, record)

    def __call__(self) -> None:
        self.executor.step(self._step)


class _Repeat(torch.utils.data.IterableDataset):
    def __init__(self, item):
        super().__init__()
        self.item = item

    def __iter__(self):
        while True:
            yield self.item


def _repeat_input_fn(item) -> torch.utils.data.DataLoader:
    """The block's input, the same tensors every step (as the eager microbenchmark reuses them)."""
    return torch.utils.data.DataLoader(_Repeat(item), batch_size=None)
