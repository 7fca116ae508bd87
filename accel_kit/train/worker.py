"""Runs one training point in this process (or, under torchrun, in each of its ranks).

    python -m accel_kit.train.worker --point point.json --out result.json

The sweep runner starts one worker (or one torchrun group) per point, so an out-of-memory,
a crash or a hang costs that point only. Rank 0 writes the result JSON atomically; the
sweep runner turns it into a record. Exceptions that are the point's own outcome (OOM, a
non-finite loss, a model that cannot fit) are written as statuses, not raised.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

GiB = 2**30


def _is_oom(exc: BaseException) -> bool:
    text = str(exc)
    return isinstance(exc, torch.OutOfMemoryError) or "can't allocate memory" in text or "out of memory" in text.lower()


def write_json_atomic(path: Path, data: dict) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, default=str))
    os.replace(tmp, path)


def measure_point(point, rank: int, world: int) -> dict:
    """Build, warm up and time the point; returns {status, reason?, metrics, times_s, warmup_times_s, env}."""
    from accel_kit import flops as F
    from accel_kit import peaks, results
    from accel_kit.data import SyntheticBatches, open_batches
    from accel_kit.devices import dtype_of
    from accel_kit.models import build_model, count_params, estimate_training_memory, fits, get_config
    from accel_kit.systems import load_system
    from accel_kit.train.attention import AttentionKernelUnavailable, attention_context, probe_attention_kernel
    from accel_kit.train.step import NonFiniteLoss, OptimConfig, cast_for_precision

    system = load_system(point.system)
    adapter = system.adapter_instance()
    device = adapter.torch_device(int(os.environ.get("LOCAL_RANK", 0)))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    adapter.set_tf32(False)
    env = results.environment(adapter)
    device_model = env["device"]["model"]

    overrides = {"seq_len": point.seq_len, "pad_vocab_multiple": point.pad_vocab_multiple}
    if point.vocab_size:
        overrides["vocab_size"] = point.vocab_size
    cfg = get_config(point.preset, **overrides)
    n_params = count_params(point.preset, **overrides)
    flops_per_token = F.gpt_flops_per_token(cfg.n_layers, cfg.hidden_size, point.seq_len, cfg.padded_vocab_size,
                                            mlp_ratio=cfg.mlp_ratio)
    tokens_per_step_per_device = point.micro_batch_size * point.gas * point.seq_len
    flops_per_step_per_device = flops_per_token * tokens_per_step_per_device
    base = {"n_params": n_params, "flops": flops_per_step_per_device, "flops_per_token": flops_per_token,
            "global_batch_size": point.global_batch_size, "data_parallel_size": world,
            "tokens_per_step": tokens_per_step_per_device * world}

    # Which attention kernel runs (recorded); a forced kernel the device lacks makes the point unsupported.
    try:
        base |= probe_attention_kernel(point.attention_kernel, n_heads=cfg.n_heads,
                                       head_dim=cfg.hidden_size // cfg.n_heads, seq_len=point.seq_len,
                                       device=device, dtype=None if point.precision == "fp32" else
                                       dtype_of(point.precision))
    except AttentionKernelUnavailable as exc:
        return {"status": "unsupported", "reason": str(exc), "metrics": base, "env": env}

    zero_shards = world if point.engine == "deepspeed" else 1
    estimate = estimate_training_memory(cfg, n_params, point.micro_batch_size, point.seq_len, point.precision,
                                        activation_checkpointing=point.activation_checkpointing,
                                        zero_shards=zero_shards,
                                        flash_attention=base["attention_kernel_ran"] != "math")
    base["mem_estimate_gib"] = estimate.total_bytes / GiB
    device_bytes = adapter.total_memory_bytes()
    if not fits(estimate, device_bytes):
        return {"status": "unsupported", "metrics": base, "env": env,
                "reason": f"does not fit: needs about {estimate.describe()}, device has {device_bytes / GiB:.1f} GiB"}

    torch.manual_seed(point.seed)
    model = build_model(point.preset, activation_checkpointing=point.activation_checkpointing, **overrides).to(device)
    if point.engine != "deepspeed":  # DeepSpeed takes the fp32 model and applies its own bf16/fp16 mode
        model = cast_for_precision(model, point.precision)
    # Weight sparsity: prune, keep the masks (re-applied after every step), pick the execution path.
    from accel_kit.sparsity import WeightSparsity

    if point.sparsity > 0 and point.engine == "deepspeed":
        return {"status": "unsupported", "metrics": base, "env": env,
                "reason": "weight sparsity re-applies its masks after each optimizer step (Trainer.after_step); "
                          "the DeepSpeed engine here has no such hook"}
    sparse = WeightSparsity(model, point.sparsity, point.sparsity_pattern)
    sparse.select_kernels(point.sparse_kernels, adapter, point.precision, point.micro_batch_size * point.seq_len)
    if point.data == "synthetic":
        batches = SyntheticBatches(cfg.vocab_size, point.seq_len, point.micro_batch_size, seed=point.seed, rank=rank)
    else:
        batches = open_batches(point.data, point.micro_batch_size, point.seq_len, seed=point.seed, rank=rank)
    optim = OptimConfig(lr=point.lr, weight_decay=point.weight_decay, grad_clip=point.grad_clip,
                        warmup_steps=max(1, point.warmup_steps),
                        # one schedule over the sparse steps and any dense fine-tuning after them
                        decay_steps=max(1, point.steps + point.dense_finetune_steps))
    trainer = _make_trainer(point, model, batches, device, optim, world,
                            after_step=sparse.apply_masks if sparse.active else None)

    losses: list[float] = []
    warmup_times: list[float] = []
    times: list[float] = []
    try:
        adapter.reset_peak_memory()
        with attention_context(point.attention_kernel):  # also covers checkpointed recomputation in backward
            for i in range(point.warmup_steps + point.steps):
                adapter.synchronize()
                start = time.perf_counter()
                losses.append(trainer.step())  # .item() inside syncs the device
                adapter.synchronize()
                (warmup_times if i < point.warmup_steps else times).append(time.perf_counter() - start)
            sparse_metrics = sparse.metrics()  # measured after the last step: the masks held
            finetune_losses: list[float] = []
            if point.dense_finetune_steps:  # "sparse pre-train, dense fine-tune": every weight trains again
                sparse.release()
                trainer.after_step = None
                finetune_losses = [trainer.step() for _ in range(point.dense_finetune_steps)]
        mem = adapter.peak_memory_bytes()
    except NonFiniteLoss as exc:
        return {"status": "error", "reason": str(exc), "metrics": base | {"nonfinite_step": exc.step}, "env": env}

    # The slowest rank sets the pace of a synchronous data-parallel step.
    times = _reduce_max(times, device, world)
    mem = int(_reduce_max([float(mem or 0)], device, world)[0]) if mem is not None else None

    from accel_kit.timing import Timing

    timing = Timing(times_s=times, warmup_times_s=warmup_times)
    step_s = timing.median_s
    achieved = F.tflops(flops_per_step_per_device, step_s)
    peak, source = peaks.datasheet_peak_tflops(device_model, point.precision)
    metrics = base | timing.summary() | {
        "step_time_s": step_s,
        "tokens_per_s": tokens_per_step_per_device * world / step_s,
        "tokens_per_s_per_device": tokens_per_step_per_device / step_s,
        "samples_per_s": point.global_batch_size / step_s,
        # GenSLM's own measure: global batch over the *mean* step time, warm-up excluded.
        "samples_per_s_mean": point.global_batch_size / timing.mean_s,
        "tflops_per_device": achieved,
        "peak_tflops_datasheet": peak,
        "mfu_pct": peaks.mfu_pct(achieved, peak),
        "peak_tflops_measured": point.peak_tflops_measured,
        "mfu_measured_pct": peaks.mfu_pct(achieved, point.peak_tflops_measured),
        "mem_peak_gib": mem / GiB if mem is not None else None,
        "loss_first": losses[0],
        "loss_last": losses[-1],
        "losses": losses,
    }
    from accel_kit.sparsity import record_metrics

    metrics |= record_metrics(sparse_metrics, cfg, point.seq_len, flops_per_step_per_device,
                              tokens_per_step_per_device, step_s, finetune_losses)
    metrics["datasheet_source" if peak is not None else "mfu_reason"] = source
    return {"status": "ok", "metrics": metrics, "times_s": times, "warmup_times_s": warmup_times, "env": env}


def _make_trainer(point, model, batches, device, optim, world, after_step=None):
    from accel_kit.train.step import Trainer

    if point.engine == "deepspeed":
        from accel_kit.train.deepspeed_engine import DeepSpeedTrainer

        return DeepSpeedTrainer(point, model, batches, device, optim, world)
    if world > 1:
        from torch.nn.parallel import DistributedDataParallel as DDP

        model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    if point.torch_compile:
        model = torch.compile(model)
    return Trainer(model, iter(batches), device, point.precision, point.gas, optim, after_step=after_step)


def _reduce_max(values: list[float], device: torch.device, world: int) -> list[float]:
    if world == 1:
        return values
    t = torch.tensor(values, dtype=torch.float64, device=device if device.type == "cuda" else "cpu")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def main(argv: list[str] | None = None) -> int:
    from accel_kit.train.launch import distributed_env
    from accel_kit.train.point import TrainPoint

    ap = argparse.ArgumentParser(description="run one accel-kit training point")
    ap.add_argument("--point", type=Path, help="the point's JSON (a TrainPoint)")
    ap.add_argument("--peak", nargs=2, metavar=("SYSTEM", "PRECISION"), help="measure the matmul peak instead")
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args(argv)
    if args.peak:
        from accel_kit.peaks import measure_matmul_peak
        from accel_kit.systems import load_system

        write_json_atomic(args.out, measure_matmul_peak(load_system(args.peak[0]).adapter_instance(),
                                                        args.peak[1]).to_dict())
        return 0
    point = TrainPoint.model_validate_json(args.point.read_text())

    rank, world, local_rank = distributed_env()
    # torch reads these names; mpiexec/srun set their own, mapped here.
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(local_rank))
    if world > 1 or point.engine == "deepspeed":
        from accel_kit.devices import get_adapter
        from accel_kit.systems import load_system

        backend = get_adapter(load_system(point.system).adapter).distributed_backend()
        dist.init_process_group(backend=backend, rank=rank, world_size=world)
    try:
        result = measure_point(point, rank, world)
    except Exception as exc:  # the point's failure is its result
        status = "oom" if _is_oom(exc) else "error"
        text = str(exc).strip().splitlines()
        result = {"status": status, "reason": f"{type(exc).__name__}: {text[0] if text else ''}", "metrics": {}}
    if rank == 0:
        write_json_atomic(args.out, result)
    if world > 1 and dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
