"""The link a data-parallel ring crosses on a system: from its YAML (datasheet figures, with their
source) or measured here by an all-reduce probe over ``torch.distributed``.

A ring within one node runs at the intra-node link's rate per device. A ring spanning nodes
is limited by the inter-node links, whose bandwidth per node is shared by the node's
devices (each device's ring crosses the node boundary), so it runs at that share.
"""
from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

from accel_kit.engine.launch import local_rendezvous
from accel_kit.errors import AccelKitError
from accel_kit.predict.comm import Link, fit_link

PROBE_SIZES_BYTES = (2**14, 2**18, 2**21, 2**23)  # 16 KiB .. 8 MiB: latency- to bandwidth-bound
PROBE_REPEATS = 5


def link_cache_path(system_id: str, root: str | Path | None = None) -> Path:
    """Where a measured link is kept: beside the records it serves (``root``, else the outputs folder)."""
    from accel_kit.paths import output_dir

    return Path(root or output_dir()) / "what_if" / f"link-{system_id}.json"


def system_link(system_id: str, devices: int, *, probe: bool = True, root: str | Path | None = None) -> Link:
    """The link for a ring of ``devices`` on ``system_id``: measured here if probed, else its datasheet
    figures; a system without either is probed now (``probe``) when its device is available here."""
    from accel_kit.devices import get_adapter
    from accel_kit.systems import load_system

    system = load_system(system_id)
    cached = link_cache_path(system_id, root)
    if cached.is_file() and devices <= system.devices_per_node:
        data = json.loads(cached.read_text())
        return Link(data["bandwidth_GBps"], data["latency_us"], data["source"])
    net = system.interconnect
    if net is None and probe and devices <= system.devices_per_node \
            and get_adapter(system.adapter, system.options).availability():
        return probe_link(system_id, root=root)
    if net is None:
        raise AccelKitError(f"system {system_id!r} has no interconnect figures in its YAML and no measured link; "
                            f"measure one where it runs: accel-kit predict --system {system_id} --probe-link")
    if devices <= system.devices_per_node:
        return Link(net.intra_node_GBps, net.intra_node_latency_us, f"datasheet: {net.source}")
    if net.inter_node_GBps is None:
        raise AccelKitError(f"system {system_id!r} gives no inter-node bandwidth; {devices} devices need "
                            f"{-(-devices // system.devices_per_node)} nodes")
    return Link(net.inter_node_GBps / system.devices_per_node, net.inter_node_latency_us or net.intra_node_latency_us,
                f"datasheet: {net.source}; the node's inter-node bandwidth shared by its {system.devices_per_node} "
                f"devices")


def probe_link(system_id: str, ranks: int = 2, *, save: bool = True, root: str | Path | None = None) -> Link:
    """Measure all-reduce times across ``ranks`` local processes on this system's device and fit alpha-beta.

    Each size runs ``PROBE_REPEATS`` times after one warm-up; the fastest counts (the link's
    capability, not the noise of a shared machine).
    """
    import subprocess
    import sys

    from accel_kit.systems import load_system

    load_system(system_id).adapter_instance()  # a one-line error when the device is missing
    with tempfile.TemporaryDirectory() as tmp, local_rendezvous() as rendezvous:
        # Fresh interpreters (not multiprocessing's spawn, which re-runs the caller's __main__ script).
        procs = [subprocess.Popen([sys.executable, "-m", "accel_kit.predict.links", system_id, str(rank), str(ranks),
                                   tmp], env=os.environ | rendezvous, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                  text=True)
                 for rank in range(ranks)]
        errors = [p.communicate(timeout=300)[1] for p in procs]
        if any(p.returncode for p in procs):
            last = next(e for p, e in zip(procs, errors) if p.returncode).strip().splitlines()
            raise AccelKitError(f"the all-reduce probe on {system_id!r} failed: {last[-1] if last else 'no output'}")
        times = json.loads((Path(tmp) / "times.json").read_text())
    sizes = [float(s) for s in times]
    link = fit_link(sizes, [times[s] for s in times], ranks,
                    source=f"measured: all-reduce probe over {ranks} processes, "
                           f"{int(min(sizes))}-{int(max(sizes))} bytes, {time.strftime('%Y-%m-%d')}")
    if save:
        from accel_kit.atomic import write_json_atomic

        path = link_cache_path(system_id, root)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, {"bandwidth_GBps": link.bandwidth_GBps, "latency_us": link.latency_us,
                                 "source": link.source, "ranks": ranks, "times_s": times})
    return link


def _probe_rank(rank: int, world: int, system_id: str, out_dir: str) -> None:
    import torch
    import torch.distributed as dist

    from accel_kit.systems import load_system

    adapter = load_system(system_id).adapter_instance()
    threads = adapter.threads_per_rank(world)
    if threads:
        torch.set_num_threads(threads)
    device = adapter.collective_device(adapter.prepare(rank))
    dist.init_process_group(adapter.distributed_backend(), rank=rank, world_size=world)
    best: dict[int, float] = {}
    try:
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
        if rank == 0:
            Path(out_dir, "times.json").write_text(json.dumps(dict(zip(map(str, PROBE_SIZES_BYTES), t.tolist()))))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":  # one rank of the probe: SYSTEM RANK WORLD OUT_DIR (the rendezvous in its environment)
    import sys

    _system, _rank, _world, _out = sys.argv[1:5]
    _probe_rank(int(_rank), int(_world), _system, _out)
