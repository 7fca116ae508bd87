"""Runs one point in this process (or, under torchrun, in each of its ranks).

    python -m accel_kit.engine.worker --point point.json --out result.json

The sweep runner starts one worker (or one torchrun group) per point, so an out-of-memory,
a crash or a hang costs that point only. The point file names its kind (a training step, a
block of the microbenchmark, a matmul peak; ``accel_kit.engine.point.POINT_KINDS``); rank 0
writes the result JSON atomically and the sweep runner turns it into a record. Outcomes that
are the point's own (OOM, a non-finite loss, a model that cannot fit, a time budget that
cannot be met) are written as statuses, not raised; anything unexpected keeps its traceback.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from pathlib import Path

import torch
import torch.distributed as dist

GiB = 2**30


def _is_oom(exc: BaseException) -> bool:
    text = str(exc)
    return isinstance(exc, torch.OutOfMemoryError) or "can't allocate memory" in text or "out of memory" in text.lower()


def over_budget_before_start(point, adapter, flops: float) -> str | None:
    """Why the point cannot meet its time budget even at the device's best matmul rate; None if it may.

    ``flops``: everything the point will compute. The rate is the run's measured peak, else the
    adapter's precision probe; at that rate the estimate is a lower bound, so a point skipped
    here could not have finished in time.
    """
    if point.time_budget_s is None:
        return None
    if point.peak:
        tflops, source = point.peak["tflops"], "the measured matmul peak"
    else:
        gflops = adapter.precision_support(point.precision).gflops
        if gflops is None:
            return None
        tflops, source = gflops / 1e3, "the precision probe's matmul rate"
    estimate_s = flops / (tflops * 1e12)
    if estimate_s <= point.time_budget_s:
        return None
    return (f"over the time budget: at least {estimate_s:.0f} s ({flops:.3g} FLOPs at {tflops:.4f} TFLOP/s, "
            f"{source}) against a budget of {point.time_budget_s:.0f} s")


def measure_point(point, rank: int, world: int) -> dict:
    """Build, warm up and time a training point; returns {status, reason?, metrics, times_s, warmup_times_s, env}."""
    from accel_kit import energy
    from accel_kit import flops as F
    from accel_kit import peaks, results
    from accel_kit.engine.eager import programming_model
    from accel_kit.precision import dtype_of
    from accel_kit.models import build_model, count_params, estimate_training_memory, fits, get_config
    from accel_kit.sparsity import record_metrics
    from accel_kit.systems import load_system
    from accel_kit.timing import OverBudget, measure
    from accel_kit.engine.attention import AttentionKernelUnavailable, attention_context, probe_attention_kernel
    from accel_kit.engine.step import NonFiniteLoss, NotMeasured

    adapter = load_system(point.system).adapter_instance()
    device = adapter.prepare(int(os.environ.get("LOCAL_RANK", 0)))
    adapter.set_tf32(False)
    env = results.environment(adapter)
    device_model = env["device"]["model"]
    dtype = dtype_of(point.precision)

    overrides = {"seq_len": point.seq_len, "pad_vocab_multiple": point.pad_vocab_multiple,
                 "narrow_linear_fast_path": adapter.narrow_linear_fast_path(dtype)}
    if point.vocab_size:
        overrides["vocab_size"] = point.vocab_size
    cfg = get_config(point.preset, **overrides)
    n_params = count_params(point.preset, **overrides)
    flops_per_token = F.gpt_flops_per_token(cfg.n_layers, cfg.hidden_size, point.seq_len, cfg.padded_vocab_size,
                                            mlp_ratio=cfg.mlp_ratio)
    # One timed call (trainer.step()) runs ``steps_per_call`` optimizer steps of the global batch
    # (micro-batch x gas x replicas), shared by the point's devices: with torch's data parallelism
    # (one replica per device, one step per call) each device's micro-batch x gas. The adapter's
    # layout says otherwise where replicas and devices differ (a pipeline, a replica per half device).
    samples_per_call = point.global_batch_size * point.steps_per_call
    tokens_per_call = samples_per_call * point.seq_len
    tokens_per_call_per_device = _share(tokens_per_call, point.devices)
    flops_per_call_per_device = _share(flops_per_token * tokens_per_call, point.devices)
    # The shape that ran: presets of one name may differ between vendors (GPT-2 XL: 25 heads here and in
    # transformers, 16 in the Cerebras ModelZoo's gpt2_xl; preset gpt2-xl-16h).
    base = {"n_layers": cfg.n_layers, "n_heads": cfg.n_heads, "hidden_size": cfg.hidden_size,
            "vocab_size_model": cfg.padded_vocab_size,
            "n_params": n_params, "flops": flops_per_call_per_device, "flops_per_token": flops_per_token,
            "global_batch_size": point.global_batch_size, "data_parallel_size": point.data_parallel_size,
            "tokens_per_step": point.global_batch_size * point.seq_len}
    out = {"metrics": base, "env": env, "model": point.preset}

    zero_shards = world if point.engine == "deepspeed" else 1
    device_bytes = adapter.total_memory_bytes()

    def estimate(flash: bool):
        return estimate_training_memory(cfg, n_params, point.micro_batch_size, point.seq_len, point.precision,
                                        activation_checkpointing=point.activation_checkpointing,
                                        zero_shards=zero_shards, flash_attention=flash)

    def not_fit(est) -> dict:
        return out | {"status": "unsupported", "metrics": base | {"mem_estimate_gib": est.total_bytes / GiB},
                      "reason": f"does not fit: needs about {est.describe()}, device has {device_bytes / GiB:.1f} GiB"}

    # Before anything is allocated (the attention probe below allocates the point's shape): the
    # estimate with fused attention is the least the point needs.
    least = estimate(flash=True)
    if not fits(least, device_bytes):
        return not_fit(least)
    steps_total = point.warmup_steps + point.steps + point.dense_finetune_steps
    why = over_budget_before_start(point, adapter, flops_per_call_per_device * steps_total)
    if why:
        return out | {"status": "skipped", "reason": why}

    # Which attention kernel runs (recorded); a forced kernel the device lacks makes the point unsupported.
    # A device whose graph compiler lowers attention itself says so instead of a probe of torch's dispatch.
    known = adapter.attention_kernel(point)
    try:
        base |= known if known is not None else probe_attention_kernel(
            point.attention_kernel, n_heads=cfg.n_heads, head_dim=cfg.hidden_size // cfg.n_heads,
            seq_len=point.seq_len, device=device, dtype=None if point.precision == "fp32" else dtype)
    except AttentionKernelUnavailable as exc:
        return out | {"status": "unsupported", "reason": str(exc)}
    full = estimate(flash=base["attention_kernel_ran"] != "math")
    base["mem_estimate_gib"] = full.total_bytes / GiB
    if not fits(full, device_bytes):
        return not_fit(full)

    if point.sparsity > 0 and point.engine == "deepspeed":
        return out | {"status": "unsupported",
                      "reason": "weight sparsity re-applies its masks after each optimizer step (Trainer.after_step); "
                                "the DeepSpeed engine here has no such hook"}
    torch.manual_seed(point.seed)
    runtime = programming_model(adapter)  # eager PyTorch, or the vendor's own
    model = runtime.prepare_model(build_model(point.preset, activation_checkpointing=point.activation_checkpointing,
                                              **overrides), point, device)
    # Weight sparsity: prune, keep the masks through training, pick the execution path (the adapter's way).
    sparse = runtime.make_sparsity(model, point, device)
    batches = point_batches(point, cfg.vocab_size, rank)
    trainer = runtime.make_trainer(point, model, batches, device, world,
                                   after_step=sparse.apply_masks if sparse.active else None)

    losses: list[float] = []
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    meter = adapter.energy_meter(local_rank)  # opened now: its setup (a library, a driver handle) is not timed
    try:
        adapter.reset_peak_memory()
        with attention_context(point.attention_kernel):  # also covers checkpointed recomputation in backward
            # trainer.step() returns the loss as a float, which syncs the device; measure syncs around it too.
            timing = measure(lambda: losses.append(trainer.step()), adapter.synchronize,
                             warmup=point.warmup_steps, trials=point.steps, budget_s=point.time_budget_s,
                             extra_iterations=point.dense_finetune_steps, meter=meter)
            sparse_metrics = sparse.metrics()  # measured after the last step: the masks held
            finetune_losses: list[float] = []
            if point.dense_finetune_steps:  # "sparse pre-train, dense fine-tune": every weight trains again
                sparse.release()
                trainer.after_step = None
                finetune_losses = [trainer.step() for _ in range(point.dense_finetune_steps)]
        mem = adapter.peak_memory_bytes()
    except NonFiniteLoss as exc:
        return out | {"status": "error", "reason": str(exc), "metrics": base | {"nonfinite_step": exc.step}}
    except NotMeasured as exc:  # ran as asked (e.g. compile only) but measured nothing
        return out | {"status": exc.status, "reason": exc.reason}
    except OverBudget as exc:
        return out | {"status": "skipped", "reason": f"over the time budget: {exc}",
                      "metrics": base | {"time_estimate_s": exc.estimate_s}}

    # The slowest rank sets the pace of a synchronous data-parallel step.
    from accel_kit.timing import Timing

    window = _reduce_energy(timing.energy, adapter.collective_device(device), world, local_rank)
    times = _reduce_max(timing.times_s, adapter.collective_device(device), world)
    mem = int(_reduce_max([float(mem or 0)], adapter.collective_device(device), world)[0]) if mem is not None else None
    timing = Timing(times_s=times, warmup_times_s=timing.warmup_times_s)
    step_s = timing.median_s  # one trainer call
    achieved = F.tflops(flops_per_call_per_device, step_s)
    metrics = base | timing.summary() | {
        "step_time_s": step_s / point.steps_per_call,  # one optimizer step
        "tokens_per_s": tokens_per_call / step_s,
        "tokens_per_s_per_device": tokens_per_call_per_device / step_s,
        "samples_per_s": samples_per_call / step_s,
        # GenSLM's own measure: global batch over the *mean* step time, warm-up excluded.
        "samples_per_s_mean": samples_per_call / timing.mean_s,
        "tflops_per_device": achieved,
        **peaks.mfu_metrics(achieved, device_model, point.precision, point.peak),
        "mem_peak_gib": mem / GiB if mem is not None else None,
        "loss_first": losses[0],
        "loss_last": losses[-1],
        "losses": losses,
    }
    metrics |= record_metrics(sparse_metrics, cfg, point.seq_len, flops_per_call_per_device,
                              tokens_per_call_per_device, step_s, finetune_losses)
    extra = getattr(trainer, "extra_metrics", None)  # a runtime's own figures (e.g. cstorch's rate tracker)
    if extra is not None:
        metrics |= extra(timing)
    timed = {"times_s": times, "warmup_times_s": timing.warmup_times_s}
    try:  # every device's energy over the timed steps, against every token they trained on
        metrics |= energy.energy_fields(window, work="tokens", amount=tokens_per_call * point.steps)
    except energy.ImplausibleEnergy as exc:
        return out | timed | {"status": "error", "reason": f"implausible energy reading: {exc}",
                              "metrics": metrics | energy.null_fields(str(exc), "tokens")}
    return out | timed | {"status": "ok", "metrics": metrics, "summary": f"{metrics['tokens_per_s']:.0f} tok/s"}


def _reduce_energy(window, device: torch.device, world: int, local_rank: int):
    """The point's energy over all ranks: each device's counted once (a host's shared counter by its local rank 0)."""
    if world == 1 or window is None:
        return window
    import dataclasses
    import math

    source = window.source
    shared = source is not None and source.scope == "host"
    counts = not (shared and local_rank != 0)  # a host counter is summed once per host
    nan = float("nan")
    mine = [window.energy_j if window.energy_j is not None else nan,
            (source.rated_power_w or nan) if source is not None else nan]
    t = torch.tensor(mine if counts else [0.0, 0.0], dtype=torch.float32, device=device)  # float32: Gaudi has no float64
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    total_j, rated_w = t.tolist()
    window_s = _reduce_max([window.window_s], device, world)[0]
    if source is not None:
        where = "hosts" if shared else "ranks"
        source = dataclasses.replace(source, counter=f"{source.counter}, summed over the point's {where}",
                                     rated_power_w=None if math.isnan(rated_w) else rated_w)
    if math.isnan(total_j):
        reason = window.reason if window.energy_j is None else "another rank had no energy reading"
        return dataclasses.replace(window, energy_j=None, window_s=window_s, source=source,
                                   reason=reason or "a rank had no energy reading")
    return dataclasses.replace(window, energy_j=total_j, window_s=window_s, source=source)


def _share(total: int, devices: int) -> int | float:
    """``total`` per device: an integer where it divides evenly (FLOPs and tokens stay exact)."""
    return total // devices if total % devices == 0 else total / devices


def point_batches(point, vocab_size: int, rank: int):
    """The batch source of a training point: synthetic tokens, or its prepared data (windows or padded rows)."""
    from accel_kit.data import SyntheticBatches, open_batches

    if point.data == "synthetic":
        return SyntheticBatches(vocab_size, point.seq_len, point.micro_batch_size, seed=point.seed, rank=rank)
    return open_batches(point.data_path, point.micro_batch_size, point.seq_len, seed=point.seed, rank=rank)


def _reduce_max(values: list[float], device: torch.device, world: int) -> list[float]:
    if world == 1:
        return values
    # float32: not every accelerator has float64 (seconds and bytes keep 7 significant digits).
    t = torch.tensor(values, dtype=torch.float32, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def main(argv: list[str] | None = None) -> int:
    from accel_kit.atomic import write_json_atomic
    from accel_kit.engine.launch import distributed_env
    from accel_kit.engine.point import load_point

    ap = argparse.ArgumentParser(description="run one accel-kit point")
    ap.add_argument("--point", required=True, type=Path, help="the point's JSON (its fields, with its kind)")
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args(argv)
    point = load_point(json.loads(args.point.read_text()))

    rank, world, local_rank = distributed_env()
    # torch reads these names; mpiexec/srun set their own, mapped here.
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(local_rank))
    from accel_kit.systems import load_system

    adapter = None
    if point.needs_group:
        adapter = load_system(point.system).adapter_instance()
        adapter.prepare(local_rank)  # the device is chosen before the process group binds to it
        dist.init_process_group(backend=adapter.distributed_backend(), rank=rank, world_size=world)
    try:
        adapter = adapter or load_system(point.system).adapter_instance()
        why = adapter.unsupported_reason(point)
        result = {"status": "unsupported", "reason": why, "metrics": {}} if why else point.measure(rank, world)
    except Exception as exc:  # the point's failure is its result; the traceback goes into the record
        text = str(exc).strip().splitlines()
        result = {"status": "oom" if _is_oom(exc) else "error", "metrics": {},
                  "reason": f"{type(exc).__name__}: {text[0] if text else ''}", "traceback": traceback.format_exc()}
    if rank == 0:
        write_json_atomic(args.out, result)
    if world > 1 and dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
