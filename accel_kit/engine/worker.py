"""Runs one point in this process (or, in a group of ranks, in each of them).

    python -m accel_kit.engine.worker --point point.json --out result.json

The sweep runner starts one worker (or one group of ranks for several devices) per point, so
an out-of-memory, a crash or a hang costs that point only. The point file names its kind (a
training step, a block of the microbenchmark, a matmul peak; ``accel_kit.engine.point``); the
kind's check and measurement come from its registration (``accel_kit.engine.kinds``), run with one adapter for the whole
process (``accel_kit.engine.measurement.Context``). Rank 0 writes the ``Result`` (``accel_kit.engine.result``) as JSON atomically
and the sweep runner turns it into a record. Outcomes that are the point's own (OOM, a
non-finite loss, a model that cannot fit, a time budget that cannot be met) are written as
statuses, not raised; anything unexpected keeps its traceback.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import traceback
from pathlib import Path

import torch.distributed as dist

from accel_kit.engine.point import Point
from accel_kit.engine.result import Result, failed, is_oom


def run_point(point: Point, rank: int, world: int, local_rank: int) -> Result:
    """The point's result in this process: one adapter, its device, the kind's check and measurement."""
    from accel_kit.engine.kinds import kind_of
    from accel_kit.engine.measurement import Context
    from accel_kit.systems import load_system

    try:
        kind = kind_of(point)
        adapter = load_system(point.system).adapter_instance()
        why = kind.unsupported(adapter, point)
        if why:
            return failed("unsupported", why)
        # The device is chosen before the process group binds to it.
        ctx = Context(adapter, adapter.prepare(local_rank), rank, world, local_rank)
        if point.needs_group:
            dist.init_process_group(backend=adapter.distributed_backend(), rank=rank, world_size=world)
        return kind.measure(point, ctx)
    except Exception as exc:  # the point's failure is its result; the traceback goes into the record
        text = str(exc).strip().splitlines()
        return failed("oom" if is_oom(exc) else "error", f"{type(exc).__name__}: {text[0] if text else ''}",
                      traceback=traceback.format_exc())


def main(argv: list[str] | None = None) -> int:
    from accel_kit.atomic import write_json_atomic
    from accel_kit.engine.kinds import load_point
    from accel_kit.engine.launch import distributed_env

    from accel_kit.errors import AccelKitError
    from accel_kit.paths import writable_file

    ap = argparse.ArgumentParser(prog="accel_kit.engine.worker", description="run one accel-kit point")
    ap.add_argument("--point", required=True, type=Path, help="the point's JSON (its fields, with its kind)")
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args(argv)  # a usage error: argparse's one line and status 2
    try:  # a point file missing, not JSON or not a point, or an unwritable result: one line, status 2
        point = load_point(json.loads(args.point.read_text()))
        writable_file(args.out, "result file")
    except (OSError, ValueError, KeyError, AccelKitError) as exc:  # (pydantic's ValidationError is a ValueError)
        print(f"accel_kit.engine.worker: error: --point {args.point}: {exc}".splitlines()[0], file=sys.stderr)
        return 2

    rank, world, local_rank = distributed_env()
    # torch reads these names; mpiexec/srun set their own, mapped here.
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(local_rank))
    result = run_point(point, rank, world, local_rank)
    if rank == 0:
        try:
            write_json_atomic(args.out, result.model_dump(), what="result file")
        except AccelKitError as exc:  # a full disk: the one line, which the sweep records as the point's reason
            print(f"accel_kit.engine.worker: error: {exc}", file=sys.stderr)
            return 2
    if world > 1 and dist.is_initialized():
        end_group()
    # A rank that failed (its group not formed, a crash, out of memory) exits non-zero in a group: its launcher then
    # ends the ranks that may still wait for it (srun --kill-on-bad-exit, mpiexec, torchrun); its result is written.
    return 1 if world > 1 and result.status in ("error", "oom") else 0


def end_group() -> None:
    """Destroy the process group once nothing else holds it.

    A DDP model's reducer keeps the group alive; freed after the group was destroyed, the reducer's
    destructor (a pybind11 binding that keeps the GIL) ends gloo's group and joins its threads, and a
    thread still freeing a finished work waits for the GIL it holds: the rank hangs (seen in a two-rank
    test, pytorch/pytorch#56297). Collected first, the reducer lets go while the group is still
    registered, and the group's own binding releases the GIL as it ends it.
    """
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
