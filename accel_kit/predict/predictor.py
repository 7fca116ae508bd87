"""The predictor: a system's records in, a predicted training step (time, memory, what it rests on) out.

``Predictor.predict`` picks the comparable records for a shape (same precision and host threads,
the model's own where there are enough), fits compute, exposure and memory on them
(``accel_kit.predict.fits``) and adds the ring model of the gradient sync over the system's link
(``comm``, ``links``). Without training records it falls back to the system's block
microbenchmark rate or its datasheet peak at an assumed efficiency, and says so.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np

from accel_kit.predict.comm import Link, gradient_sync_s
from accel_kit.predict.fits import MIN_FIT_RECORDS, ComputeFit, fit_compute, fit_exposure, fit_memory
from accel_kit.predict.links import system_link
from accel_kit.predict.records import group_key, usable
from accel_kit.predict.shape import GiB, TERMS, StepShape

# Stated when a system has no training records: a GPT-2-sized model's MFU on a GPU is typically 30-50 %.
NO_RECORDS_EFFICIENCY = 0.4
SAME_PRESET_RECORDS = 3  # single-device records of the predicted preset that make a fit of its own


@dataclass
class Prediction:
    """A predicted training step with everything it rests on."""

    system: str
    shape: StepShape
    step_time_s: float
    compute_s: float
    comm_s: float
    exposed_comm_s: float
    tokens_per_s: float
    scaling_efficiency: float  # tokens/s per device against the same per-device work on one device
    memory_per_device_gib: float
    device_memory_gib: float | None
    fits: bool | None
    basis: str  # "records" | "microbenchmark" | "datasheet"
    terms_s: dict[str, float]
    inputs: list[str] = field(default_factory=list)
    assumptions: list[str] = field(default_factory=list)

    def row(self) -> dict[str, Any]:
        s = self.shape
        return {"system": self.system, "preset": s.preset, "devices": s.devices, "seq_len": s.seq_len,
                "micro_batch_size": s.micro_batch_size, "gas": s.gas, "precision": s.precision,
                "tokens_per_s": self.tokens_per_s, "step_time_s": self.step_time_s, "compute_s": self.compute_s,
                "exposed_comm_s": self.exposed_comm_s, "scaling_efficiency": self.scaling_efficiency,
                "memory_per_device_gib": self.memory_per_device_gib, "fits": self.fits, "basis": self.basis}


class Predictor:
    """Predictions for one system from its records (those of other systems are ignored)."""

    def __init__(self, system: str, records: Iterable[dict], *, link: Link | None = None,
                 link_root: str | None = None, probe: bool = True):
        self.system = system
        self.records = [r for r in records if r.get("system") == system]
        self.train = [r for r in self.records if usable(r)]
        self._link_override = link
        self.link_root = link_root  # where a probed link is kept (beside the records)
        self.probe = probe  # measure a link that is neither kept nor in the system's YAML

    def groups(self) -> dict[tuple, list[dict]]:
        out: dict[tuple, list[dict]] = {}
        for r in self.train:
            out.setdefault(group_key(r), []).append(r)
        return out

    def _group_for(self, shape: StepShape, threads: int | None, exclude: set[str]) -> list[dict] | None:
        """The comparable records for ``shape``: its precision and, where given, host threads per rank;
        among several host-thread groups, the one with records at its device count, else the largest."""
        groups = []
        for (_, precision, group_threads), g in self.groups().items():
            g = [r for r in g if r["record_id"] not in exclude]
            if precision != shape.precision or (threads is not None and group_threads != threads):
                continue
            if sum(r["params"]["devices"] == 1 for r in g) >= MIN_FIT_RECORDS:
                groups.append(g)
        if not groups:
            return None

        # Records at this device count first; else those nearest below it (on a CPU, ranks share the
        # host's cores, so records of several ranks say how a rank computes among others); then the most.
        def rank(g: list[dict]) -> tuple:
            counts = [r["params"]["devices"] for r in g]
            return (shape.devices in counts, max((c for c in counts if c <= shape.devices), default=0), len(g))

        best = max(groups, key=rank)
        # The model's own records where there are enough of them: a rate fitted across models (a codon
        # vocabulary, another width) carries their differences into this one's prediction.
        same = [r for r in best if r["params"]["preset"] == shape.preset]
        if sum(r["params"]["devices"] == 1 for r in same) >= SAME_PRESET_RECORDS:
            return same
        return best

    def link(self, devices: int) -> Link:
        return self._link_override or system_link(self.system, devices, root=self.link_root, probe=self.probe)

    def predict(self, shape: StepShape, *, exclude: set[str] = frozenset(), threads: int | None = None) -> Prediction:
        """Predict ``shape`` on this system, never using the records whose ids are in ``exclude``;
        ``threads``: only records made with that many host threads per rank (CPU ranks share cores)."""
        from accel_kit.systems import load_system

        system = load_system(self.system)
        inputs: list[str] = []
        assumptions: list[str] = []
        group = self._group_for(shape, threads, set(exclude))
        if group:
            fit = fit_compute(group)
            basis = "records"
            inputs.append(f"compute: {fit.basis}; relative RMS error of the fit {fit.fit_rms:.1%}")
            seen = sorted({r["params"]["preset"] for r in group})
            if shape.preset not in seen:
                assumptions.append(f"compute: {shape.preset} extrapolated from the rates of {', '.join(seen)}; "
                                   "a larger model fills the matrix units better, so expect a pessimistic step time")
        else:
            if threads is not None and self._group_for(shape, None, set(exclude)):
                from accel_kit.errors import AccelKitError

                raise AccelKitError(f"no other single-device {shape.precision} training records of {self.system} at "
                                    f"{threads} host thread(s) per rank, the setting this point ran with (ranks "
                                    "share the host's cores, so records at other thread counts are not comparable)")
            fit = self._fallback_fit(shape, system, inputs, assumptions)
            basis = fit.basis.split(":", 1)[0]
            group = []
        compute_s = fit.compute_s(shape)
        comm_s = 0.0
        if shape.devices > 1:
            link = self.link(shape.devices)
            comm_s = gradient_sync_s(shape.grad_bytes(), shape.devices, link.bandwidth_Bps, link.latency_s,
                                     zero1=shape.engine == "deepspeed")
            inputs.append(f"link: {link.bandwidth_GBps:.3g} GB/s per direction, {link.latency_us:.3g} us per ring "
                          f"step ({link.source})")
            exposure, why = fit_exposure(group, fit, link) if group else (1.0, "exposed communication: all of it "
                                                                           "(assumed, no records)")
            (inputs if "median" in why else assumptions).append(why)
        else:
            exposure = 0.0
        exposed = exposure * comm_s
        step_s = compute_s + exposed
        tokens_per_s = shape.tokens_per_step_per_device * shape.devices / step_s
        efficiency = (compute_s / step_s) if shape.devices > 1 else 1.0
        memory = fit_memory(group)
        (inputs if memory.records else assumptions).append(memory.describe())
        mem_gib = memory.bytes(shape) / GiB
        device_gib = _device_memory_gib(system)
        assumptions.append("data parallelism only (no tensor or pipeline parallelism); every rank computes the "
                           "same micro-batches")
        if shape.devices > system.devices_per_node:
            assumptions.append(f"{shape.devices} devices span {math.ceil(shape.devices / system.devices_per_node)} "
                               f"nodes: the ring runs at the inter-node link's per-device share")
        return Prediction(self.system, shape, step_s, compute_s, comm_s, exposed, tokens_per_s, efficiency, mem_gib,
                          device_gib, None if device_gib is None else mem_gib <= 0.9 * device_gib, basis,
                          fit.terms_s(shape), inputs, assumptions)

    def _fallback_fit(self, shape: StepShape, system, inputs: list[str], assumptions: list[str]) -> ComputeFit:
        """Without training records: the system's block microbenchmark rate, else its datasheet peak x efficiency."""
        from accel_kit import peaks

        blocks = [r for r in self.records if r.get("status") == "ok" and r["params"].get("kind") == "block"
                  and r["params"].get("direction") == "forward_backward" and r["params"].get("impl", "native") ==
                  "native" and r["params"].get("precision") == shape.precision and r["metrics"].get("tflops")]
        rates = np.zeros(len(TERMS))
        if blocks:
            best = max(blocks, key=lambda r: r["params"].get("batch_size", 0) * r["params"].get("seq_len", 0))
            tflops = best["metrics"]["tflops"]
            rates[0] = rates[1] = 1 / (tflops * 1e12)
            why = (f"microbenchmark: no training records at {shape.precision}; every FLOP at the block "
                   f"microbenchmark's forward+backward rate, {tflops:.3g} TFLOP/s (record {best['record_id'][:8]})")
            assumptions.append("compute: elementwise work, launches and the optimizer are not modelled "
                               "(the block rate stands for all of it); expect an optimistic step time")
        else:
            peak, source = peaks.datasheet_peak_tflops(system.device_model, shape.precision)
            if peak is None:
                from accel_kit.errors import AccelKitError

                raise AccelKitError(f"system {self.system!r} has no training or microbenchmark records at "
                                    f"{shape.precision} and no datasheet peak ({source}): nothing to predict from")
            rates[0] = rates[1] = 1 / (peak * 1e12 * NO_RECORDS_EFFICIENCY)
            why = (f"datasheet: no records of {self.system} at {shape.precision}; datasheet peak {peak:.4g} TFLOP/s "
                   f"x an assumed {NO_RECORDS_EFFICIENCY:.0%} model-FLOPs utilisation")
            assumptions.append(f"compute: an assumed MFU of {NO_RECORDS_EFFICIENCY:.0%}, typical of GPT training on "
                               f"GPUs; not measured on {self.system}")
        inputs.append(why)
        return ComputeFit(self.system, shape.precision, None, rates, float("nan"), [], why)


def _device_memory_gib(system) -> float | None:
    """One device's memory: the system YAML's figure, else what the adapter reports where it runs here."""
    if system.device_memory_gib:
        return float(system.device_memory_gib)
    from accel_kit.devices import get_adapter

    adapter = get_adapter(system.adapter, system.options)
    total = adapter.total_memory_bytes() if adapter.availability() else None
    return total / GiB if total else None
