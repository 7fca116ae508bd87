"""The sweep runner: each point in its own process, recorded whatever happens.

Every study (the microbenchmark's block points and the training studies' steps) runs here:

- Isolation: a worker process (or a group of ranks for several devices) per point; a crash,
  an out-of-memory or a hang (``timeout_s``) becomes that point's record (status, reason and
  the worker's traceback or output tail). A kind that names a runner of its own (``kinds.PointRunner``:
  the serve kind, whose consecutive points share one server) is measured by it in this process
  instead; the resume, the frontier and the record are the same for every kind.
- Resume: a point already recorded with identical parameters and a final status (ok, oom,
  unsupported) is skipped; ``error`` and ``skipped`` points are tried again. The key holds
  no absolute path, so a moved ``outputs/`` resumes too.
- OOM frontier: once a configuration runs out of memory (or cannot fit) at some length (a
  training point's sequence: ``Point.frontier``), its longer ones are recorded as ``skipped`` with that reason, not attempted.
- The measured peak: measured before the sweep in a child process, and again whenever a
  point runs faster than it (the reference was unlucky); the better one is kept and used.
- Durability: only this process appends records (``results.append_record``), so a SIGKILL
  loses nothing recorded before it and leaves no half-written record.
"""
from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Callable, Iterable, Sequence

from tqdm.auto import tqdm

from accel_kit import energy, peaks, results
from accel_kit.atomic import output_errors
import accel_kit.engine.forkserver as forkserver
from accel_kit.engine import kinds
from accel_kit.engine.launch import rendezvous_endpoint, worker_command
from accel_kit.engine.point import Point
from accel_kit.engine.result import Result, failed, is_oom_text
from accel_kit.results import Record, Status

FINAL_STATUSES: tuple[Status, ...] = ("ok", "oom", "unsupported")
#: How the worker starts the reason of a point estimated not to fit (``accel_kit.engine.worker``).
NOT_FIT_REASON = "does not fit"


def is_memory_failure(status: Status, reason: str | None) -> bool:
    """Out of memory, or unsupported because it does not fit: the failures that move the frontier.

    Other unsupported points (a forced attention kernel the device lacks, too many nodes) say
    nothing about longer lengths' memory, so those are still tried.
    """
    return status == "oom" or (status == "unsupported" and (reason or "").startswith(NOT_FIT_REASON))


def recorded(records_path: Path) -> dict[str, Record]:
    """point key -> its last record with a final status."""
    done: dict[str, Record] = {}
    if records_path.exists():
        for rec in results.iter_records(records_path):
            key = rec.params.get("point_key")
            if key and rec.status in FINAL_STATUSES:
                done[key] = rec
    return done


def _limit_memory(gib: float | None) -> Callable[[], None] | None:
    if gib is None:
        return None
    limit = int(gib * 2**30)

    def apply() -> None:
        # RLIMIT_DATA caps heap and private anonymous mappings (Linux >= 4.7), i.e. tensor
        # storage, without capping the address space torch reserves for threads and libraries.
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    return apply


def run_worker(point: Point, *, timeout_s: float, launcher: str = "local", max_nodes: int = 1,
               cpu_threads: int | None = None, rendezvous_port: int | None = None) -> Result:
    """Run one point in a process (group) of its own; returns the worker's result or a failure result.

    A point whose ranks all run here (one, or a local group that torchrun would start) starts as forks of
    a preloaded interpreter (``accel_kit.engine.forkserver``), other points in a fresh one (mpiexec/srun,
    a vendor's launcher, or torchrun where there is no fork server); the result's ``env.point_start``
    says which (``forkserver`` or ``exec``).
    """
    # The point's layout (make_point fills it from the adapter): one rank per device by default, one client
    # process for a Cerebras point or an IPU pipeline, two per SN30 RDU.
    ranks, nodes, group = point.ranks, point.nodes, point.needs_group
    if nodes > max_nodes:
        return failed("unsupported", f"{ranks} devices need {nodes} nodes; this run may use {max_nodes} "
                                     "(write a job script with `accel-kit jobscript`)")
    try:
        cmd, extra_env = worker_command(launcher, ranks, nodes, force_group=launcher == "local" and group,
                                        port=rendezvous_port)
    except ValueError as exc:
        return failed("unsupported", str(exc))
    adapter = _adapter_of(point.system)
    prefix = adapter.launch_prefix(point, launcher)  # a vendor's own process launcher
    fork = forkserver.enabled() and forkserver.forkable(launcher, nodes, prefix, extra_env)
    # The results folder may be on a shared filesystem that every node sees; the temp dir is for
    # single-node runs, where it is as good and always writable.
    with tempfile.TemporaryDirectory(prefix="accel-kit-point-", dir=os.environ.get("ACCEL_KIT_POINT_DIR")) as tmp:
        point_file, out_file = Path(tmp) / "point.json", Path(tmp) / "result.json"
        with output_errors(point_file, "point file"):  # a full temporary disk: one line, not a traceback
            point_file.write_text(point.model_dump_json())
        env = dict(os.environ) | extra_env | adapter.worker_env()  # e.g. the CPU's allocator settings
        if cpu_threads:
            env["OMP_NUM_THREADS"] = str(cpu_threads)
        argv = ["--point", str(point_file), "--out", str(out_file)]
        # A group of ranks where torchrun would start one (worker_command: several ranks, or a group of one).
        group_ranks = ranks if ranks > 1 or group else 0
        finished = _forked(argv, env, point, timeout_s, Path(tmp) / "output.log", group_ranks) if fork else None
        start = "forkserver" if finished is not None else "exec"
        if finished is None:
            finished = _exec(prefix + cmd + argv, env, point, timeout_s)
        if finished.returncode is None:
            result = failed("error", f"timeout: no result after {timeout_s:.0f} s", traceback=_tail(finished.output, 40))
        elif out_file.exists():
            result = Result.from_json(out_file.read_text())
        else:
            text = " | ".join(_tail(finished.output, 3).splitlines()) or "no output"
            oom = is_oom_text(text) or finished.returncode == -9  # (SIGKILL: the kernel's OOM killer, most often)
            result = failed("oom" if oom else "error", f"worker exited with status {finished.returncode}: {text[-300:]}",
                            traceback=_tail(finished.output, 60))
    # How its ranks started and met (the hosts they ran on are the worker's to say: env.hosts).
    started = {"launcher": launcher}
    if launcher != "local":
        started["rendezvous"] = rendezvous_endpoint(cmd, extra_env)
    result.env = (result.env or results.environment()) | {"point_start": start} | started
    return result


# At a point's timeout its launcher first gets SIGTERM and this long to pass it on: srun and mpiexec then end
# the ranks on the other nodes and free their step; killed outright, srun left them running, holding the
# step's CPUs, and the job's next point waited for them until its own timeout.
TERM_GRACE_S = 10


def _exec(cmd: list[str], env: dict[str, str], point: Point, timeout_s: float) -> forkserver.Finished:
    """Run ``cmd`` in a fresh process group; at the timeout end the whole group (returncode None): SIGTERM, then
    SIGKILL after ``TERM_GRACE_S``."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True, preexec_fn=_limit_memory(point.memory_limit_gib))
    try:
        output, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            output, _ = proc.communicate(timeout=TERM_GRACE_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            output, _ = proc.communicate()
        return forkserver.Finished(None, output)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return forkserver.Finished(proc.returncode, output)


def _forked(argv: list[str], env: dict[str, str], point: Point, timeout_s: float, output: Path,
            group_ranks: int) -> forkserver.Finished | None:
    """Run the worker as forks of the environment's server: one process, or a group of ``group_ranks`` ranks
    (torchrun's variables, a rendezvous of the runner's); None where no server could run it (exec it then)."""
    limit = int(point.memory_limit_gib * 2**30) if point.memory_limit_gib else None
    try:
        # Every built-in kind's module as well as this point's: a study that mixes kinds (a peak, then its blocks
        # or training steps) forks them all from one server instead of replacing it at its first point of a kind.
        server = forkserver.server_for(env, (*kinds.KIND_MODULES.values(), *kinds.kind_of(point).preload_for(point)))
    except forkserver.ServerGone:
        return None
    try:
        with forkserver.local_group(group_ranks, env) if group_ranks else contextlib.nullcontext([env]) as envs:
            return server.run(argv, envs=envs, output=output, timeout_s=timeout_s, memory_limit_bytes=limit)
    except forkserver.ServerGone as exc:  # its points die with it (PR_SET_PDEATHSIG): this one failed
        forkserver.discard(server)
        text = output.read_bytes() if output.exists() else b""
        return forkserver.Finished(1, text + f"\n{exc}".encode())


def _adapter_of(system_id: str):
    """The system's adapter, unchecked (the worker checks availability and says why in the record); the
    process's one instance (``System.device_adapter``)."""
    from accel_kit.systems import load_system

    return load_system(system_id).device_adapter()


def _tail(output: bytes | None, lines: int) -> str:
    kept = [line for line in (output or b"").decode(errors="replace").splitlines() if line.strip()]
    return "\n".join(kept[-lines:])


# How long one matmul peak measurement may run (PeakReference's, before the sweep's points; a job script's wall
# time counts it: accel_kit.engine.launch.job_walltime).
PEAK_TIMEOUT_S = 600


class PeakReference:
    """The measured matmul peak per precision: before the sweep, and again when a point beats it.

    Each measurement runs as a point of its own (``accel_kit.engine.point.PeakPoint``) in a child
    process, so nothing it allocates stays in the runner.
    """

    def __init__(self, system: str, shapes: tuple[tuple[int, int, int], ...] = (), *, timeout_s: float = PEAK_TIMEOUT_S,
                 enabled: bool = True):
        self.system, self.shapes, self.timeout_s, self.enabled = system, shapes, timeout_s, enabled
        self.best: dict[str, peaks.MeasuredPeak | None] = {}

    def measure(self, precision: str) -> peaks.MeasuredPeak | None:
        from accel_kit.engine.point import PeakPoint

        result = run_worker(PeakPoint(system=self.system, precision=precision, shapes=list(self.shapes)),
                            timeout_s=self.timeout_s)
        return peaks.MeasuredPeak(**result.payload) if result.status == "ok" and result.payload else None

    def get(self, precision: str) -> peaks.MeasuredPeak | None:
        if self.enabled and precision not in self.best:
            self.best[precision] = self.measure(precision)
        return self.best.get(precision)

    def remeasure(self, precision: str) -> peaks.MeasuredPeak | None:
        """Measure again, keep the better of the two, return it."""
        again = self.measure(precision)
        current = self.best.get(precision)
        self.best[precision] = current.best_of(again) if current else again
        return self.best[precision]


class BandwidthReference:
    """The measured memory bandwidth (``accel_kit.engine.point.BandwidthPoint``, in a child process of its own),
    measured once per run on first use and kept, as ``PeakReference`` keeps the matmul peak; an inference
    study reads its decode's MBU against it (``accel_kit.peaks.mbu_metrics``)."""

    def __init__(self, system: str, precision: str = "fp32", *, sizes_mib: tuple[int, ...] = peaks.BANDWIDTH_ARRAY_MIB,
                 timeout_s: float = 600, enabled: bool = True):
        self.system, self.precision, self.timeout_s, self.enabled = system, precision, timeout_s, enabled
        self.sizes_mib = sizes_mib
        self.best: peaks.MeasuredBandwidth | None = None
        self._measured = False

    def measure(self) -> peaks.MeasuredBandwidth | None:
        from accel_kit.engine.point import BandwidthPoint

        point = BandwidthPoint(system=self.system, precision=self.precision, sizes_mib=list(self.sizes_mib))
        result = run_worker(point, timeout_s=self.timeout_s)
        return peaks.MeasuredBandwidth(**result.payload) if result.status == "ok" and result.payload else None

    def get(self) -> peaks.MeasuredBandwidth | None:
        if self.enabled and not self._measured:
            self.best, self._measured = self.measure(), True
        return self.best

    def remeasure(self) -> peaks.MeasuredBandwidth | None:
        """Measure again, keep the better of the two, return it."""
        again = self.measure()
        self.best = self.best.best_of(again) if self.best else again
        return self.best


class WorkerRunner:
    """The sweep's runner for every kind that names none of its own (``kinds.PointRunner``): each point in a worker
    process of its own (``run_worker``), measured against the run's matmul peak (``peak``: measured before the first
    such point, and again when a point runs faster than it)."""

    def __init__(self, peak: PeakReference | None, **worker):
        self.peak, self.worker = peak, worker  # worker: run_worker's keywords

    def measure(self, point: Point) -> Result:
        reference = self.peak.get(point.precision) if self.peak else None
        point = point.model_copy(update={"peak": reference.to_dict() if reference else None})
        result = run_worker(point, **self.worker)
        if self.peak and result.metrics.get("mfu_measured_unreliable"):
            _refresh_peak(result, self.peak.remeasure(point.precision), point.RATE_METRIC)
        return result

    def close(self) -> None:
        """Nothing outlives a point: its process ended with it."""


class _Runners:
    """Each kind's runner for one sweep: the worker runner, or the kind's own (made at its first point, closed by
    ``close``)."""

    def __init__(self, worker: WorkerRunner, scratch: Path, timeout_s: float):
        self.worker, self.scratch, self.timeout_s = worker, scratch, timeout_s
        self.own: dict[str, kinds.PointRunner] = {}

    def measure(self, point: Point) -> Result:
        make = kinds.kind_of(point).runner
        if make is None:
            return self.worker.measure(point)
        if point.kind not in self.own:
            self.own[point.kind] = make(self.scratch / point.kind, self.timeout_s)
        return self.own[point.kind].measure(point)

    def close(self) -> None:
        for runner in self.own.values():
            runner.close()


def run_sweep(study: str, points: Sequence[Point], *, records_path: Path, run_id: str, extra_params: dict,
              timeout_s: float, launcher: str = "local", max_nodes: int = 1, progress: bool = True,
              cpu_threads: int | None = None, peak: PeakReference | None = None, rerun: bool = False,
              rendezvous_port: int | None = None) -> list[Record]:
    """Run (or resume) ``points`` (of any kind) in order; returns one record per point (earlier runs' for resumed
    points).

    ``rerun``: measure every point again, whatever was recorded; the new records are appended beside
    the old ones, so a point measured in several runs shows their spread (``accel_kit.noise``).
    """
    done = recorded(records_path) if not rerun else {}
    frontier = _recorded_frontier(done.values())
    records: list[Record] = []
    runners = _Runners(WorkerRunner(peak, timeout_s=timeout_s, launcher=launcher, max_nodes=max_nodes,
                                    cpu_threads=cpu_threads, rendezvous_port=rendezvous_port),
                       records_path.parent, timeout_s)
    bar = tqdm(points, desc=f"{study} on {points[0].system if points else '?'}", unit=" point", disable=not progress)
    try:
        for point in bar:
            key = point.key()
            label = point.label()
            bar.set_postfix_str(label)
            if key in done:  # recorded by an earlier run with identical parameters
                records.append(done[key])
                continue
            on = point.frontier()
            limit = frontier.get(on.key) if on else None
            if on and limit and on.length > limit[0]:
                result = failed("skipped", f"beyond the memory frontier: {limit[1]} at {on.axis} {limit[0]}")
            else:
                result = runners.measure(point)
            record = record_of(study, point, result, run_id=run_id, params=extra_params | {"point_key": key})
            # The folder is made for the first record; one removed during the sweep is an error naming it.
            results.append_record(records_path, record, make_folder=not records)
            records.append(record)
            if is_memory_failure(result.status, result.reason):
                _update_frontier(frontier, point, result.status)
            if result.status == "ok":
                bar.set_postfix_str(f"{label}: {result.summary or 'ok'}")
    finally:
        runners.close()  # a runner's shared state (a server) freed, whatever ended the loop
    return records


def record_of(study: str, point: Point, result: Result, *, run_id: str, params: dict[str, object]) -> Record:
    """The record of ``point``'s ``result`` (``accel_kit.results.make_record``): the one place a record is built.
    ``params``: the study's own settings beside the point's fields."""
    return results.make_record(
        study=study, kind=point.kind, system=point.system, status=result.status, reason=result.reason,
        device=result.env.get("device", {}).get("model"), model=result.model, run_id=run_id,
        params=params | point.record_params(),
        # every record carries the energy fields: a point that measured none says why
        metrics=energy.fill_missing(result.metrics, point.ENERGY_WORK, result.status, result.reason),
        times_s=result.times_s, warmup_times_s=result.warmup_times_s,
        env=(result.env or results.environment()) | {"system": _system_provenance(point.system)},
        traceback=result.traceback)


def _recorded_frontier(done: Iterable[Record]) -> dict[str, tuple[int, str]]:
    """The memory frontier the recorded points already drew: configuration -> (the least length that failed
    for memory, why), from each record's point (its kind's point type, from its params)."""
    frontier: dict[str, tuple[int, str]] = {}
    for rec in done:
        if not is_memory_failure(rec.status, rec.reason):
            continue
        try:
            cls = kinds.spec(rec.kind or "").point_cls
            fields = {k: v for k, v in rec.params.items() if k in cls.model_fields}
            _update_frontier(frontier, cls.model_validate(fields | {"system": rec.system}), rec.status)
        except (ValueError, ImportError):  # a record of a kind or schema no longer known: no frontier from it
            pass
    return frontier


def _system_provenance(system_id: str) -> dict:
    """What the record says of the system it ran on: its YAML's description and device, so that
    a report read on another machine (without that YAML) still tells what the system was."""
    from accel_kit.errors import AccelKitError
    from accel_kit.systems import load_system

    try:
        system = load_system(system_id)
    except AccelKitError as exc:  # a YAML removed or broken since the sweep began: record anyway
        return {"id": system_id, "description": None, "reason": f"no system description: {exc}"}
    return {"id": system.id, "description": system.description, "device_model": system.device_model,
            "devices_per_node": system.devices_per_node}


def _refresh_peak(result: Result, best: peaks.MeasuredPeak | None, rate_metric: str | None) -> None:
    """Recompute a point's measured MFU against a re-measured (better) peak."""
    metrics = result.metrics
    achieved = metrics.get(rate_metric) if rate_metric else None
    if best is None or achieved is None:
        return
    for stale in ("mfu_measured_unreliable", "mfu_measured_reason"):
        metrics.pop(stale, None)
    metrics |= peaks.mfu_measured(achieved, best) | {"peak_remeasured": True}


def _update_frontier(frontier: dict[str, tuple[int, str]], point: Point, status: Status) -> None:
    on = point.frontier()
    if on is None:
        return
    why = "out of memory" if status == "oom" else "does not fit"
    if on.key not in frontier or on.length < frontier[on.key][0]:
        frontier[on.key] = (on.length, why)
