"""The link a data-parallel ring crosses on a system: from its YAML (datasheet figures, with their
source) or measured here by an all-reduce probe over ``torch.distributed``.

A ring within one node runs at the intra-node link's rate per device. A ring spanning nodes
is limited by the inter-node links, whose bandwidth per node is shared by the node's
devices (each device's ring crosses the node boundary), so it runs at that share.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from accel_kit.engine.launch import SCHEDULER_LAUNCHER
from accel_kit.errors import AccelKitError
from accel_kit.predict.comm import Link, fit_link

PROBE_SIZES_BYTES = (2**14, 2**18, 2**21, 2**23)  # 16 KiB .. 8 MiB: latency- to bandwidth-bound
PROBE_REPEATS = 5
# The call cost on a host whose ranks outnumber its cores (``busy_call_s``): each rank computes a burst, then
# all-reduces a few numbers, CALL_ROUNDS times, against the same bursts without the calls; CALL_REPEATS pairs,
# the median difference counts. A burst of about 5 ms (at the rank's contended pace) is the order of a small
# model's work between two of its collectives, and longer than the scheduler's time slice.
CALL_BURST_S, CALL_ROUNDS, CALL_REPEATS = 5e-3, 30, 3


def link_cache_path(system_id: str, root: str | Path | None = None, *, inter_node: bool = False,
                    ranks: int | None = None) -> Path:
    """Where a measured link is kept: beside the records it serves (``root``, else the outputs folder); the
    inter-node link (measured across nodes) in a file of its own, apart from the link within a node; ``ranks``:
    the ring of that many ranks on a host whose ranks share its cores (``shared_host_ring``)."""
    from accel_kit.paths import output_dir

    name = f"link-{system_id}{'-inter-node' if inter_node else ''}{f'-{ranks}-ranks' if ranks else ''}.json"
    return Path(root or output_dir()) / "what_if" / name


def oversubscribed(system_id: str, ranks: int) -> bool:
    """Whether ``ranks`` ranks on one host of ``system_id`` outnumber its cores (a CPU's gloo processes)."""
    from accel_kit.systems import load_system

    cores = load_system(system_id).device_adapter().threads_per_rank(1)
    return cores is not None and ranks > cores


def shared_host_ring(system_id: str, devices: int) -> bool:
    """Whether a ring of ``devices`` on ``system_id`` is measured at its own size: where the ranks share the host's
    cores (a CPU's gloo processes), a ring of more ranks than the 2-rank probe waits on ranks the scheduler has not
    run yet (4 ranks on 2 cores: 0.36 ms a ring step, against 2 ranks' next to none), so one probe does not
    describe every size."""
    from accel_kit.systems import load_system

    system = load_system(system_id)
    return devices > 2 and system.interconnect is None and system.device_adapter().threads_per_rank(1) is not None


def system_link(system_id: str, devices: int, *, probe: bool = True, root: str | Path | None = None,
                devices_per_node: int | None = None, own_size: bool = False) -> Link:
    """The link for a ring of ``devices`` on ``system_id``: measured here if probed, else its datasheet
    figures; a system without either is probed now (``probe``) when its device is available here.

    ``devices_per_node``: how many of the devices share a node (None: the system's); a ring of more spans
    nodes and runs at the inter-node link's per-device share. ``own_size``: a ring on a host whose ranks share
    its cores is measured (and kept) at its own size (``shared_host_ring``); tune asks for it, where the 2-rank
    link stands in for every size otherwise.
    """
    from accel_kit.devices import get_adapter
    from accel_kit.systems import load_system

    system = load_system(system_id)
    per_node = devices_per_node or system.devices_per_node
    within = devices <= per_node
    cached = link_cache_path(system_id, root, inter_node=not within)
    if own_size and within and shared_host_ring(system_id, devices):
        own = link_cache_path(system_id, root, ranks=devices)
        # (a ring kept before the call cost was measured is probed again where its ranks outnumber the cores)
        stale = own.is_file() and oversubscribed(system_id, devices) and "call_us" not in json.loads(own.read_text())
        if (stale or not own.is_file()) and probe and get_adapter(system.adapter, system.options).availability():
            return probe_link(system_id, devices, root=root, own_size=True)
        if own.is_file():
            cached = own
    if cached.is_file():
        data = json.loads(cached.read_text())
        if within:
            return Link(data["bandwidth_GBps"], data["latency_us"], data["source"], data.get("call_us", 0.0))
        return Link(data["node_bandwidth_GBps"] / per_node, data["latency_us"],
                    f"{data['source']}; the node's share over its {per_node} devices")
    net = system.interconnect
    if net is None and probe and within and get_adapter(system.adapter, system.options).availability():
        return probe_link(system_id, root=root)
    if net is None:
        how = (f"accel-kit predict --system {system_id} --probe-link" if within else
               f"accel-kit link --system {system_id} --nodes {-(-devices // per_node)} inside a batch job of "
               "that many nodes")
        raise AccelKitError(f"system {system_id!r} has no interconnect figures in its YAML and no measured "
                            f"{'link' if within else 'inter-node link'}; measure one where it runs: {how}")
    if within:
        return Link(net.intra_node_GBps, net.intra_node_latency_us, f"datasheet: {net.source}")
    if net.inter_node_GBps is None:
        raise AccelKitError(f"system {system_id!r} gives no inter-node bandwidth; {devices} devices need "
                            f"{-(-devices // per_node)} nodes")
    return Link(net.inter_node_GBps / per_node, net.inter_node_latency_us or net.intra_node_latency_us,
                f"datasheet: {net.source}; the node's inter-node bandwidth shared by its {per_node} devices")


def probe_link(system_id: str, ranks: int = 2, *, nodes: int = 1, launcher: str | None = None, save: bool = True,
               root: str | Path | None = None, own_size: bool = False) -> Link:
    """Measure all-reduce times across ``ranks`` processes on this system's device and fit alpha-beta.

    ``nodes`` 1: local processes, the link within a node. More: the ranks spread evenly over that many nodes
    of the batch job this runs in, started by ``launcher`` (None: the scheduler's own, srun or mpiexec), as a
    point's ranks are (``accel_kit.engine.launch``); the ring crosses the nodes, and what it measured is kept
    as the inter-node link, apart from the one within a node. Each size runs ``PROBE_REPEATS`` times after one
    warm-up; the fastest counts (the link's capability, not the noise of a shared machine). ``own_size``: kept
    as the ring of ``ranks`` alone (``system_link``'s ``own_size``), not as the link within a node that
    ``accel-kit predict --probe-link`` keeps for every size; where those ranks outnumber the host's cores it also
    measures what a call waits while they compute (``busy_call_s``), the link's ``call_us``.
    """
    from accel_kit.engine.launch import job_scheduler
    from accel_kit.paths import output_dir
    from accel_kit.systems import load_system

    load_system(system_id).adapter_instance()  # a one-line error when the device is missing
    if nodes > 1 and ranks % nodes:
        raise AccelKitError(f"{ranks} probe ranks do not spread evenly over {nodes} nodes")
    launcher = launcher or ("local" if nodes == 1 else SCHEDULER_LAUNCHER.get(job_scheduler() or "", "local"))
    # The ranks' folder: on the shared file system beside the records (rank 0 may run on another host).
    shared = Path(root or output_dir()) / "what_if"
    shared.mkdir(parents=True, exist_ok=True)
    busy = own_size and nodes == 1 and oversubscribed(system_id, ranks)
    with tempfile.TemporaryDirectory(dir=shared, prefix=".probe-") as tmp:
        entry = ("-m", "accel_kit.predict.links", system_id, tmp, *(["busy"] if busy else []))
        proc = _run_ranks(launcher, ranks, nodes, entry)
        result = Path(tmp) / "times.json"
        if proc.returncode or not result.is_file():
            last = [line for line in proc.stderr.strip().splitlines() if line.strip()]
            raise AccelKitError(f"the all-reduce probe on {system_id!r} ({launcher}, {ranks} ranks) failed: "
                                f"{last[-1] if last else 'no output'}")
        data = json.loads(result.read_text())
    times, hosts = data["times_s"], data["hosts"]
    if nodes > 1 and len(set(hosts)) < 2:
        raise AccelKitError(f"the inter-node probe's {ranks} ranks all ran on {hosts[0]}: run it inside a batch job "
                            f"of {nodes} nodes")
    sizes = [float(s) for s in times]
    where = f"on {nodes} nodes ({', '.join(dict.fromkeys(hosts))})" if nodes > 1 else f"on {hosts[0]}"
    link = fit_link(sizes, [times[s] for s in times], ranks,
                    source=f"measured: all-reduce probe over {ranks} processes {where}, "
                           f"{int(min(sizes))}-{int(max(sizes))} bytes, {time.strftime('%Y-%m-%d')}"
                           + (", and each call's wait while they compute" if busy else ""))
    if busy:
        link = replace(link, call_us=data["call_s"] * 1e6)
    if save:
        from accel_kit.atomic import write_json_atomic

        kept = {"bandwidth_GBps": link.bandwidth_GBps, "latency_us": link.latency_us, "source": link.source,
                "ranks": ranks, "launcher": launcher, "hosts": hosts, "times_s": times}
        if busy:
            kept |= {"call_us": link.call_us, "call_diffs_s": data["call_diffs_s"]}
        if nodes > 1:
            # Each rank's ring bandwidth is its share of its node's links; the node's whole is what a layout with
            # another number of ranks per node divides (system_link).
            kept |= {"nodes": nodes, "node_bandwidth_GBps": link.bandwidth_GBps * (ranks // nodes)}
        path = link_cache_path(system_id, root, inter_node=nodes > 1, ranks=ranks if own_size else None)
        write_json_atomic(path, kept)
    return link


PROBE_TIMEOUT_S = 300  # the whole probe: process starts, the rendezvous, 4 sizes x 6 all-reduces


def _run_ranks(launcher: str, ranks: int, nodes: int, entry: tuple[str, ...]) -> subprocess.CompletedProcess:
    """The probe's ranks, run to their end: local ones as fresh interpreters meeting at a store held here
    (not torchrun, whose agent costs each probe a second start; not multiprocessing's spawn, which re-runs the
    caller's ``__main__``), a batch job's through its launcher, as a point's ranks start."""
    from accel_kit.engine.launch import job_scheduler, local_rendezvous, worker_command

    if nodes > 1 and job_scheduler() is None:
        raise AccelKitError(f"the link probe over {nodes} nodes runs inside a batch job of that many nodes "
                            "(Slurm's or PBS's), whose launcher starts its ranks")
    if launcher != "local":
        try:
            cmd, env = worker_command(launcher, ranks, nodes, entry=entry)
        except ValueError as exc:  # (an unknown launcher)
            raise AccelKitError(f"the link probe: {exc}") from None
        try:
            return subprocess.run(cmd, env=os.environ | env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                  text=True, timeout=PROBE_TIMEOUT_S)
        except FileNotFoundError:
            raise AccelKitError(f"the link probe's launcher {cmd[0]!r} is not on PATH") from None
        except subprocess.TimeoutExpired:
            raise AccelKitError(f"the link probe ({launcher}, {ranks} ranks) did not end in {PROBE_TIMEOUT_S} s") \
                from None
    if nodes > 1:
        raise AccelKitError(f"the link probe over {nodes} nodes starts its ranks with a batch job's launcher: srun, "
                            "mpiexec, mpirun or torchrun")
    with local_rendezvous() as rendezvous:
        procs = [subprocess.Popen([sys.executable, *entry], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                  text=True, env=os.environ | rendezvous | {"RANK": str(rank), "WORLD_SIZE": str(ranks),
                                                                            "LOCAL_RANK": str(rank)})
                 for rank in range(ranks)]
        try:
            errors = [p.communicate(timeout=PROBE_TIMEOUT_S)[1] for p in procs]
        except subprocess.TimeoutExpired:
            for p in procs:  # (a rank stuck at the rendezvous: none is left behind)
                p.kill()
                p.wait()
            raise AccelKitError(f"the link probe ({ranks} local ranks) did not end in {PROBE_TIMEOUT_S} s") from None
    failed = next((i for i, p in enumerate(procs) if p.returncode), 0)
    return subprocess.CompletedProcess(procs[failed].args, procs[failed].returncode, None, errors[failed])


def busy_call_s(device, synchronize) -> tuple[float, list[float]]:
    """What one collective call costs a rank while every rank computes between calls (the process group is up):
    the seconds ``CALL_ROUNDS`` bursts of matmuls take with a small all-reduce after each, less what the same
    bursts take without, per call (the median of ``CALL_REPEATS`` pairs, and each pair's difference). An idle
    ring's latency misses it: on a host with fewer cores than ranks a rank that waits is woken only when a core
    frees up."""
    import torch
    import torch.distributed as dist

    a = torch.randn(128, 128, device=device)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(20):
        torch.mm(a, a)
    synchronize()
    per = (time.perf_counter() - start) / 20
    count = torch.tensor([max(1, round(CALL_BURST_S / per))], device=device)
    dist.broadcast(count, 0)  # every rank the same work: rank 0's count
    n, small = int(count), torch.ones(256, device=device)

    def rounds(calls: bool) -> float:
        dist.barrier()
        start = time.perf_counter()
        for _ in range(CALL_ROUNDS):
            for _ in range(n):
                torch.mm(a, a)
            if calls:
                dist.all_reduce(small)
        synchronize()
        dist.barrier()
        return time.perf_counter() - start

    diffs = []
    for _ in range(CALL_REPEATS):
        alone = rounds(False)
        diffs.append((rounds(True) - alone) / CALL_ROUNDS)
    return max(0.0, sorted(diffs)[len(diffs) // 2]), diffs


def _probe_rank(system_id: str, out_dir: str, busy: str = "") -> None:
    import socket

    import torch
    import torch.distributed as dist

    from accel_kit.engine.launch import distributed_env
    from accel_kit.systems import load_system

    rank, world, local_rank = distributed_env()
    adapter = load_system(system_id).adapter_instance()
    threads = adapter.threads_per_rank(world)
    if threads:
        torch.set_num_threads(threads)
    device = adapter.collective_device(adapter.prepare(local_rank))
    dist.init_process_group(adapter.distributed_backend(), rank=rank, world_size=world)
    best: dict[int, float] = {}
    try:
        hosts: list[str] = [""] * world
        dist.all_gather_object(hosts, socket.gethostname())
        for size in PROBE_SIZES_BYTES:
            buf = torch.ones(size // 4, dtype=torch.float32, device=device)
            dist.all_reduce(buf)  # warm-up: connection set-up, buffers
            for _ in range(PROBE_REPEATS):
                dist.barrier()
                adapter.synchronize()
                start = time.perf_counter()
                dist.all_reduce(buf)
                adapter.synchronize()
                elapsed = time.perf_counter() - start
                best[size] = min(best.get(size, float("inf")), elapsed)
        # The slowest rank's time is the collective's.
        t = torch.tensor([best[s] for s in PROBE_SIZES_BYTES], dtype=torch.float64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        calls = {}
        if busy:
            call_s, diffs = busy_call_s(device, adapter.synchronize)
            calls = {"call_s": call_s, "call_diffs_s": diffs}
        if rank == 0:
            Path(out_dir, "times.json").write_text(json.dumps(
                {"times_s": dict(zip(map(str, PROBE_SIZES_BYTES), t.tolist())), "hosts": hosts} | calls))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":  # one rank of the probe: SYSTEM OUT_DIR [busy] (its rank and rendezvous from its launcher)
    _probe_rank(*sys.argv[1:4])
