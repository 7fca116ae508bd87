"""CPU adapter: always available; the reference backend for tests and small presets."""
from __future__ import annotations

import os
import platform
import resource
import sys
import threading
from typing import Any

import torch

from accel_kit.devices.base import Availability, DeviceDescription


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
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss if sys.platform == "darwin" else rss * 1024  # Linux reports KiB


def _current_rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


class _RSSSampler(threading.Thread):
    """Tracks the peak resident set size of this process until stopped."""

    interval_s = 0.005

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self._stop_event = threading.Event()
        self.peak_bytes = _current_rss_bytes() or 0

    def run(self) -> None:
        while not self._stop_event.wait(self.interval_s):
            rss = _current_rss_bytes()
            if rss is None:  # not Linux: fall back to the process high-water mark
                self.peak_bytes = _max_rss_bytes()
                return
            self.peak_bytes = max(self.peak_bytes, rss)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=1)


class CPUAdapter:
    name = "cpu"

    def availability(self) -> Availability:
        return Availability(True)

    def torch_device(self, index: int = 0) -> torch.device:
        return torch.device("cpu")

    def synchronize(self) -> None:
        # CPU kernels run synchronously in the calling thread pool: nothing is queued.
        pass

    def supported_precisions(self) -> tuple[str, ...]:
        # fp16 matmul exists on CPU but is emulated (slow); it is still a real measurement.
        return ("fp32", "fp16", "bf16")

    def reset_peak_memory(self) -> None:
        # ru_maxrss is a process high-water mark that never resets, so a window's peak is
        # sampled instead: a daemon thread reads the resident set every few milliseconds.
        self._stop_sampler()
        self._sampler = _RSSSampler()
        self._sampler.start()

    def peak_memory_bytes(self) -> int | None:
        sampler = getattr(self, "_sampler", None)
        if sampler is None:
            return _max_rss_bytes()
        return sampler.peak_bytes

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

    def distributed_backend(self) -> str:
        return "gloo"

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
            },
        )

    def math_mode(self) -> dict[str, Any]:
        return {"fp32_matmul_precision": torch.get_float32_matmul_precision()}

    def set_tf32(self, enabled: bool) -> None:
        # On CPU "high" allows bf16-based fp32 matmul emulation; "highest" is true fp32.
        torch.set_float32_matmul_precision("high" if enabled else "highest")
