"""The sweep runner: each training point in its own process, recorded whatever happens.

- Isolation: a worker process (or a torchrun group for several devices) per point; a crash,
  an out-of-memory or a hang (``timeout_s``) becomes that point's record (status and reason).
- Resume: a point already recorded with identical resolved parameters and a final status
  (ok, oom, unsupported) is skipped; ``error`` and ``skipped`` points are tried again.
- OOM frontier: once a configuration runs out of memory (or cannot fit) at some sequence
  length, its longer sequences are recorded as ``skipped`` with that reason, not attempted.
- Durability: only this process appends records (``results.append_record``), so a SIGKILL
  loses nothing recorded before it and leaves no half-written record.
"""
from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Callable

from tqdm.auto import tqdm

from accel_kit import results
from accel_kit.train.launch import worker_command
from accel_kit.train.point import TrainPoint

FINAL_STATUSES = ("ok", "oom", "unsupported")
#: How the worker starts the reason of a point estimated not to fit (``accel_kit.train.worker``).
NOT_FIT_REASON = "does not fit"


def is_memory_failure(status: str, reason: str | None) -> bool:
    """Out of memory, or unsupported because it does not fit: the failures that move the frontier.

    Other unsupported points (a forced attention kernel the device lacks, too many nodes) say
    nothing about longer lengths' memory, so those are still tried.
    """
    return status == "oom" or (status == "unsupported" and (reason or "").startswith(NOT_FIT_REASON))


def recorded(records_path: Path) -> dict[str, dict]:
    """point key -> its last record with a final status."""
    done: dict[str, dict] = {}
    if records_path.exists():
        for rec in results.iter_records(records_path):
            key = rec.get("params", {}).get("point_key")
            if key and rec["status"] in FINAL_STATUSES:
                done[key] = rec
    return done


def _frontier_key(point: TrainPoint) -> str:
    # The configuration without its length; the data folder is left out too, because it may
    # depend on the length (GenSLM's padded rows are prepared once per block size).
    return point.model_copy(update={"seq_len": 1, "data": ""}).key()


def _limit_memory(gib: float | None) -> Callable[[], None] | None:
    if gib is None:
        return None
    limit = int(gib * 2**30)

    def apply() -> None:
        # RLIMIT_DATA caps heap and private anonymous mappings (Linux >= 4.7), i.e. tensor
        # storage, without capping the address space torch reserves for threads and libraries.
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    return apply


def run_worker(point: TrainPoint, *, timeout_s: float, launcher: str = "local", max_nodes: int = 1,
               cpu_threads: int | None = None) -> dict:
    """Run one point in a fresh process group; returns the worker's result or a failure result."""
    if point.nodes > max_nodes:
        return {"status": "unsupported", "metrics": {},
                "reason": f"{point.devices} devices need {point.nodes} nodes; this run may use {max_nodes} "
                          "(write a job script with `accel-kit jobscript`)"}
    # DeepSpeed initialises torch.distributed itself, so it always runs under a launcher.
    local_multi = launcher == "local" and (point.devices > 1 or point.engine == "deepspeed")
    try:
        cmd, extra_env = worker_command(launcher, point.devices, point.nodes, force_group=local_multi)
    except ValueError as exc:
        return {"status": "unsupported", "reason": str(exc), "metrics": {}}
    # The results folder may be on a shared filesystem that every node sees; the temp dir is for
    # single-node runs, where it is as good and always writable.
    with tempfile.TemporaryDirectory(prefix="accel-kit-point-", dir=os.environ.get("ACCEL_KIT_POINT_DIR")) as tmp:
        point_file, out_file = Path(tmp) / "point.json", Path(tmp) / "result.json"
        point_file.write_text(point.model_dump_json())
        env = dict(os.environ) | extra_env
        if cpu_threads:
            env["OMP_NUM_THREADS"] = str(cpu_threads)
        cmd = cmd + ["--point", str(point_file), "--out", str(out_file)]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True, preexec_fn=_limit_memory(point.memory_limit_gib))
        try:
            output, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return {"status": "error", "reason": f"timeout: no result after {timeout_s:.0f} s", "metrics": {}}
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        if out_file.exists():
            return json.loads(out_file.read_text())
        tail = [line for line in output.decode(errors="replace").splitlines() if line.strip()][-3:]
        text = " | ".join(tail) or "no output"
        oom = "can't allocate memory" in text or "out of memory" in text.lower() or proc.returncode == -9
        return {"status": "oom" if oom else "error",
                "reason": f"worker exited with status {proc.returncode}: {text[-300:]}", "metrics": {}}


def run_sweep(study: str, points: list[TrainPoint], *, records_path: Path, run_id: str, extra_params: dict,
              timeout_s: float, launcher: str = "local", max_nodes: int = 1, progress: bool = True,
              cpu_threads: int | None = None) -> list[dict]:
    """Run (or resume) ``points`` in order; returns one record per point (earlier runs' for resumed points)."""
    done = recorded(records_path)
    frontier: dict[str, tuple[int, str]] = {}  # configuration -> (shortest seq that failed for memory, why)
    for rec in done.values():
        if is_memory_failure(rec["status"], rec.get("reason")):
            point = TrainPoint.model_validate(rec["params"]["point"])
            _update_frontier(frontier, point, rec["status"])
    records = []
    bar = tqdm(points, desc=f"{study} on {points[0].system if points else '?'}", disable=not progress)
    for point in bar:
        key = point.key()
        label = f"{point.preset} n={point.devices} mb={point.micro_batch_size} gas={point.gas} seq={point.seq_len}"
        bar.set_postfix_str(label)
        if key in done:  # recorded by an earlier run with identical parameters
            records.append(done[key])
            continue
        limit = frontier.get(_frontier_key(point))
        if limit and point.seq_len > limit[0]:
            result = {"status": "skipped", "metrics": {},
                      "reason": f"beyond the memory frontier: {limit[1]} at seq_len {limit[0]}"}
        else:
            result = run_worker(point, timeout_s=timeout_s, launcher=launcher, max_nodes=max_nodes,
                                cpu_threads=cpu_threads)
        record = results.make_record(
            study=study, system=point.system, status=result["status"], reason=result.get("reason"),
            device=result.get("env", {}).get("device", {}).get("model"), model=point.preset, run_id=run_id,
            params=extra_params | point.model_dump() | {"point_key": key, "point": point.model_dump()},
            metrics=result.get("metrics", {}), times_s=result.get("times_s"),
            warmup_times_s=result.get("warmup_times_s"), env=result.get("env") or results.environment())
        results.append_record(records_path, record)
        records.append(record)
        if is_memory_failure(result["status"], result.get("reason")):
            _update_frontier(frontier, point, result["status"])
        if result["status"] == "ok":
            bar.set_postfix_str(f"{label}: {result['metrics']['tokens_per_s']:.0f} tok/s")
    return records


def _update_frontier(frontier: dict, point: TrainPoint, status: str) -> None:
    fkey = _frontier_key(point)
    why = "out of memory" if status == "oom" else "does not fit"
    if fkey not in frontier or point.seq_len < frontier[fkey][0]:
        frontier[fkey] = (point.seq_len, why)
