"""How long a point's model takes to build where it runs, in the precision it runs in (issue 40).

Times ``accel_kit.models.materialize`` (the path every kind's setup takes): the model made on the meta device,
allocated on the device in the point's dtype and drawn there by parameter name (``accel_kit.models.init``),
seeded, with no host copy and no fp32 copy. Prints the build's seconds, the bf16 weights' bytes and how far the
process's peak RSS rose (on the CPU, where the weights are host memory), the CPU's kernel capability and the
load average (a shared machine's other work slows the generator's draws, which are most of the time). The
model's shape alone on the meta device is timed first, as ``count_params`` builds it.

    python benchmarks/build_time.py                                  # llama3.1-8b, bf16, on the CPU
    python benchmarks/build_time.py llama3.2-3b --dtype fp32 --device cuda
    python benchmarks/build_time.py llama3.1-8b --layers 4; ... --layers 8   # a host short of 16 GB: extrapolate

Refuses, in one line, where the host has not the memory for the weights (Llama 3.1 8B in bf16: 16 GB).

Measured (2-core AVX2 EPYC VM, ``get_cpu_capability()`` AVX2, torch 2.13 CPU, 23 GiB, shared with other
work), ``python benchmarks/build_time.py``: llama3.1-8b bf16 on the CPU, 8.03 B params, materialise 54.1 s at
load average 3.3-4.4 (peak RSS up 15.28 GiB = 1.02x its bf16 weights); ``llama3.2-3b``: 27.2 s at load 3.8-4.5,
1.05x. Before (each nn.Linear's kaiming_uniform_ then the family's normal_, bf16 draws one at a time on one
thread) the 8B build took 320 s at load 6.9 and the 3B 134 s. The draws are fp32 in chunks cast into the bf16
weights (torch's CPU normal_ is vectorised for fp32: about twice its bf16 rate), several parameters at once on
a pool of torch.get_num_threads() threads; on this loaded host two threads drew 131-190 M params/s against
105-124 M on one (Llama 3.1 8B's shape at 2 layers). Built under ``torch.device("cuda")`` the draws run on
the GPU.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

import torch  # noqa: E402

from accel_kit.models import family_of, get_config, materialize  # noqa: E402
from accel_kit.precision import dtype_of  # noqa: E402

GiB = 2**30


def available_bytes() -> int | None:
    """MemAvailable of /proc/meminfo (Linux), None elsewhere."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("preset", nargs="?", default="llama3.1-8b")
    ap.add_argument("--dtype", default="bf16", choices=("fp32", "fp16", "bf16"))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--seq-len", type=int, default=None,
                    help="the point's context (RoPE tables); the preset's by default")
    ap.add_argument("--layers", type=int, default=None,
                    help="build the preset with this many of its layers (a host without the memory for the whole "
                         "model times two depths and extrapolates: the build's time is linear in the layers)")
    args = ap.parse_args()
    dtype = dtype_of(args.dtype)
    overrides = {"seq_len": args.seq_len} if args.seq_len else {}
    cfg = get_config(args.preset, **overrides)
    if args.layers:
        cfg = dataclasses.replace(cfg, n_layers=args.layers)

    with torch.device("meta"):
        family_of(cfg).build(cfg)  # once for the imports and first calls a build makes
        start = time.perf_counter()
        family_of(cfg).build(cfg)
        meta_s = time.perf_counter() - start
    with torch.device("meta"):
        n = family_of(cfg).build(cfg).num_params()
    weight_bytes = n * dtype.itemsize
    avail = available_bytes()
    if torch.device(args.device).type == "cpu" and avail is not None and avail < weight_bytes + 2 * GiB:
        print(f"{args.preset} {args.dtype}: not built: its weights need {weight_bytes / GiB:.1f} GiB, "
              f"the host has {avail / GiB:.1f} GiB available")
        return 1

    rss_before = int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    torch.manual_seed(0)
    start = time.perf_counter()
    model = materialize(cfg, device=args.device, dtype=dtype)
    if torch.device(args.device).type == "cuda":
        torch.cuda.synchronize()
    build_s = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    assert {p.dtype for p in model.parameters()} == {dtype}

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    layers = f" with {args.layers} layers" if args.layers else ""
    print(f"{args.preset}{layers} {args.dtype} on {args.device}: {n / 1e9:.2f} B params, "
          f"{weight_bytes / GiB:.2f} GiB of weights; "
          f"meta build {meta_s:.2f} s; materialise {build_s:.1f} s; peak RSS rose "
          f"{(peak - rss_before) / GiB:.2f} GiB ({(peak - rss_before) / weight_bytes:.2f}x the weights); "
          f"CPU {torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} threads, load average {load:.1f}; "
          f"torch {torch.__version__}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
