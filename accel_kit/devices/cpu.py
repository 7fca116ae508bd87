"""CPU adapter: always available; the reference backend for tests and small presets."""
from __future__ import annotations

import os
import platform
import resource
import sys
import threading
from typing import Callable

import psutil
import torch

from accel_kit.devices import probe
from accel_kit.devices.base import Availability, BaseAdapter, DeviceDescription, JobLaunch, PrecisionSupport, dtype_of
from accel_kit.json_types import JSONObject


def _cores() -> int:
    """The cores this process may run on (its affinity: a job's or a container's share, not the machine's)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _max_rss_bytes() -> int:
    """This process's peak resident set size since it started (getrusage: it never resets)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss if sys.platform == "darwin" else rss * 1024  # Linux reports KiB


def _current_rss_bytes(process: psutil.Process) -> int | None:
    try:
        return process.memory_info().rss
    except (psutil.Error, OSError):
        return None


# After a reset the peak equals the resident set; other threads may grow it meanwhile, so a peak
# this far above the resident set read beside it means the kernel accepted the write and ignored it
# (seen on a sandboxed CI kernel: the window then reported the process's lifetime peak).
_RESET_SLACK_BYTES = 16 << 20


def _reset_hwm() -> bool:
    """Reset this process's peak resident set size (Linux >= 4.0); False where that is not possible
    or the kernel did not do it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    hwm, rss = _status_bytes("VmHWM"), _status_bytes("VmRSS")
    return hwm is not None and rss is not None and hwm <= rss + _RESET_SLACK_BYTES


def _status_bytes(field: str) -> int | None:
    """A size field of /proc/self/status (``VmHWM``, ``VmRSS``) in bytes, or None."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    return None


def _hwm_bytes() -> int | None:
    """This process's peak resident set size since start or the last reset (VmHWM), or None.

    Read from /proc: psutil gives the resident set now (memory_info) but not this peak, and
    getrusage's ru_maxrss is the peak since the process started, which ``_reset_hwm`` does not reset.
    """
    return _status_bytes("VmHWM")


class _RSSSampler(threading.Thread):
    """Tracks the peak resident set size of this process until stopped.

    Only where the kernel's peak cannot be reset (not Linux, or no clear_refs): psutil reads the
    resident set now, and ru_maxrss keeps the peak since the process started (its setup, or an
    earlier point in it, could set it), so the window's own peak needs samples of the current one.
    """

    interval_s = 0.005

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self._stop_event = threading.Event()
        self._process = psutil.Process()  # this process (made here: a forked worker is another pid)
        self.peak_bytes = _current_rss_bytes(self._process) or 0

    def run(self) -> None:
        while not self._stop_event.wait(self.interval_s):
            rss = _current_rss_bytes(self._process)
            if rss is None:  # psutil cannot read this process: the peak since it started is what is left
                self.peak_bytes = _max_rss_bytes()
                return
            self.peak_bytes = max(self.peak_bytes, rss)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=1)


# glibc's malloc returns large freed blocks to the kernel (each one mmapped, and the heap's top
# trimmed), so every training step maps its logits and activations afresh: page faults and zeroed
# pages that cost more than the step's compute on small models (2.6x the step time of gpt2-debug at
# micro-batch 4; benchmarks/cpu_allocator.py measures it). Keeping freed memory in the process, as
# PyTorch's CPU tuning guides get from jemalloc or tcmalloc, needs only glibc's own settings. They
# are read when a process starts, so they go into each worker's environment.
MALLOC_TUNABLES = {"glibc.malloc.mmap_threshold": str(4 << 30),  # no mmap below 4 GiB: reuse the heap
                   "glibc.malloc.trim_threshold": str(16 << 30)}  # never hand the heap's top back


MALLOC_OPT_OUT = "ACCEL_KIT_CPU_MALLOC"  # set to "default" to run workers with glibc's own settings


def malloc_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """``GLIBC_TUNABLES`` with ``MALLOC_TUNABLES`` added; a setting the user already gave there wins,
    and ``ACCEL_KIT_CPU_MALLOC=default`` leaves glibc's defaults."""
    environ = os.environ if environ is None else environ
    choice = environ.get(MALLOC_OPT_OUT, "").strip().lower()
    if choice == "default":
        return {}
    if choice:
        from accel_kit.errors import ParameterError

        raise ParameterError(f"{MALLOC_OPT_OUT} must be 'default' (glibc's own malloc settings) or unset (the CPU "
                             f"adapter's), got {environ[MALLOC_OPT_OUT]!r}")
    have = environ.get("GLIBC_TUNABLES", "")
    given = {item.split("=", 1)[0] for item in have.split(":") if "=" in item}
    extra = [f"{k}={v}" for k, v in MALLOC_TUNABLES.items() if k not in given]
    return {"GLIBC_TUNABLES": ":".join(filter(None, [have, *extra]))} if extra else {}


def cpu_capability() -> str:
    """torch's view of the vector ISA its CPU kernels use (e.g. AVX2, AVX512, AMX)."""
    return str(torch.backends.cpu.get_cpu_capability())


# Flags of the units that compute each lower precision natively (a bf16/fp16 matmul is emulated without them).
NATIVE_FLAGS = {"bf16": {"amx_bf16", "avx512_bf16"}, "fp16": {"amx_fp16", "avx512_fp16"}}


def _isa_summary() -> str:
    flags = _cpu_flags()
    native = [name for flag, name in (("amx_bf16", "AMX-BF16"), ("amx_fp16", "AMX-FP16"), ("avx512_bf16", "AVX512-BF16"),
                                      ("avx512_fp16", "AVX512-FP16")) if flag in flags]
    return "has " + ", ".join(native) if native else "no native bf16/fp16 units in its flags"


class CPUAdapter(BaseAdapter):
    name = "cpu"

    def availability(self) -> Availability:
        return Availability(True)

    def torch_device(self, index: int = 0) -> torch.device:
        return torch.device("cpu")

    def is_host_cpu(self) -> bool:
        return True

    def synchronize(self) -> None:
        # CPU kernels run synchronously in the calling thread pool: nothing is queued.
        pass

    def unsupported_context_parallel(self) -> str | None:
        # Measured here (torch 2.13, gloo): under context_parallel the CPU's SDPA fails with "Operator
        # aten._scaled_dot_product_flash_attention_for_cpu.default does not have a sharding strategy registered".
        return ("context parallelism does not run on a CPU: torch's context_parallel shards CUDA's flash, "
                "memory-efficient and cuDNN SDPA kernels only (under torch 2.13 the CPU's, "
                "aten._scaled_dot_product_flash_attention_for_cpu, has no sharding strategy registered)")

    def supported_precisions(self) -> tuple[str, ...]:
        # All three run; whether bf16/fp16 run at speed is measured (precision_support).
        return ("fp32", "fp16", "bf16")

    def precision_support(self, precision: str) -> PrecisionSupport:
        # Measured, not read from the flags: torch may or may not have a native kernel for the
        # ISA (AMX and AVX-512 BF16 make bf16 fast; fp16 is often emulated even there).
        device = self.torch_device()
        rate = probe.matmul_gflops(device, dtype_of(precision), self.synchronize)
        if precision == "fp32":
            return PrecisionSupport("fp32", True, f"fp32: {rate:.0f} GFLOP/s", rate)
        fp32 = probe.matmul_gflops(device, torch.float32, self.synchronize)
        ratio = rate / fp32
        where = f"on this CPU ({cpu_capability()}, {_isa_summary()})"
        text = f"{rate:.1f} GFLOP/s against {fp32:.0f} in fp32 {where}"
        # Both must hold: the CPU has units for it (so a busy moment that slows the fp32 probe cannot
        # make an emulated path look native) and torch's kernels use them (so flags alone do not decide).
        units = NATIVE_FLAGS[precision] & _cpu_flags()
        if units and ratio >= probe.NATIVE_MIN_RATIO:
            return PrecisionSupport(precision, True, f"{precision} native: {text}", rate)
        return PrecisionSupport(precision, False, f"{precision} {1 / ratio:.0f}x slower than fp32: {text}", rate)

    def reset_peak_memory(self) -> None:
        # Linux resets the process's resident high-water mark (VmHWM) on "5" to clear_refs: the
        # window's peak is then read, exact and free. Elsewhere a daemon thread samples the
        # resident set every few milliseconds (ru_maxrss never resets); it competes with the
        # measured work for the cores, so it is the fallback only.
        self._stop_sampler()
        if _reset_hwm():
            return
        self._sampler = _RSSSampler()
        self._sampler.start()

    def peak_memory_bytes(self) -> int | None:
        sampler = getattr(self, "_sampler", None)
        if sampler is not None:
            return sampler.peak_bytes
        return _hwm_bytes() or _max_rss_bytes()

    def _stop_sampler(self) -> None:
        sampler = getattr(self, "_sampler", None)
        if sampler is not None:
            sampler.stop()
            self._sampler = None

    def total_memory_bytes(self) -> int | None:
        try:
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError):
            return None

    def peak_sizes(self) -> tuple[int, ...]:
        # Two cores are saturated by a few hundred rows; larger sizes are tried while one product
        # takes under about a second (peaks.measure_matmul_peak).
        return (512, 1024, 2048, 4096)

    def distributed_backend(self) -> str:
        return "gloo"

    def fused_optimizer(self) -> bool:
        return True  # torch's fused AdamW has a CPU kernel since 2.4

    def threads_per_rank(self, ranks: int) -> int | None:
        # Data-parallel ranks on a CPU share its cores: each gets an equal slice, not all of them.
        return max(1, _cores() // max(1, ranks))

    def job_launch(self, scheduler: str) -> JobLaunch:
        # A CPU node runs as many ranks as it has cores for this process, whatever the cpu system's nominal 8:
        # a job asking 8 tasks of a 2-core node waits in the queue forever (Slurm's PartitionConfig).
        return JobLaunch(devices_per_node=_cores())

    def deepspeed_settings(self) -> tuple[dict[str, str], JSONObject]:
        # DeepSpeed's CPU accelerator, and plain torch AdamW instead of a 45 s JIT build of its CPU Adam.
        return {"DS_ACCELERATOR": "cpu"}, {"torch_adam": True}

    def sparse_kernel(self, pattern: str, dtype: torch.dtype) -> tuple[str | None, str]:
        if pattern == "2:4":
            return None, "2:4 sparse kernels are NVIDIA tensor-core kernels; this is a CPU"
        if dtype not in (torch.float32, torch.float64):
            name = str(dtype).removeprefix("torch.")
            return None, f"torch has no CPU sparse matmul for {name} (its CSR products use MKL: fp32/fp64 only)"
        return "csr", "CSR products (MKL)"

    def nn_weight_gradient_pays(self, dtype: torch.dtype) -> bool:
        # oneDNN's bf16 TN GEMMs run at about half the speed of NN (accel_kit.models.gpt2.block measures it).
        return dtype == torch.bfloat16

    def few_rows_linears(self, dtype: torch.dtype) -> dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]:
        # torch's fp32 product on a few rows goes to MKL, which streamed Llama 3.2 1B's weights at 5 GB/s at 8 rows
        # and 21 GB/s at one on a 2-core AVX2 EPYC (triad 33-41 GB/s). The same product with the operands swapped
        # reached 11 GB/s at 8 rows; oneDNN's linear 14 at 8 and 27 at one. The decoder times them on its own
        # step and keeps the fastest; bf16 and fp16 go to oneDNN already.
        if dtype != torch.float32:
            return {}
        kernels = {"swapped": swapped_linear}
        if torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise"):
            kernels["onednn"] = onednn_linear
        return kernels

    def worker_env(self) -> dict[str, str]:
        return malloc_env()

    def energy_meter(self, index: int = 0):
        # RAPL package counters: the sockets' energy, shared by every rank (and process) on the host.
        from accel_kit.devices.power import rapl_meter

        return rapl_meter()

    def describe(self) -> DeviceDescription:
        flags = _cpu_flags()
        return DeviceDescription(
            adapter=self.name,
            device_model=_cpu_model(),
            device_count=1,
            versions={"torch": torch.__version__},
            extra={
                "threads": torch.get_num_threads(),
                "logical_cpus": os.cpu_count(),
                "isa": sorted(f for f in flags if f.startswith(("avx512", "amx"))),
                "torch_cpu_capability": cpu_capability(),
                # the allocator settings this process started with (worker_env): they change step times
                "glibc_tunables": os.environ.get("GLIBC_TUNABLES") or "glibc's defaults",
            },
        )

    def math_mode(self) -> JSONObject:
        return {"fp32_matmul_precision": torch.get_float32_matmul_precision()}

    def set_tf32(self, enabled: bool) -> None:
        # On CPU "high" allows bf16-based fp32 matmul emulation; "highest" is true fp32.
        torch.set_float32_matmul_precision("high" if enabled else "highest")


def swapped_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x @ W^T`` computed as ``(W @ x^T)^T``: the same product, the operands swapped."""
    return (weight @ x.T).T


def onednn_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x @ W^T`` by oneDNN's linear, the operator torch's own compiler emits for a CPU linear (torch's eager
    ``F.linear`` in fp32 goes to MKL instead)."""
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), weight.contiguous(), None, "none", [], "")
