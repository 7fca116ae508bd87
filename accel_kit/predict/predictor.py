"""The predictor: a system's records in, a predicted training step (time, memory, what it rests on) out.

Step time on one data-parallel rank = compute + exposed communication:

* **Compute** is a sum of terms, each a count of work per optimizer step times a rate fitted
  (non-negative least squares, on relative error) from the system's training records at the
  same precision and host threads:

  | term | work per optimizer step | what it stands for |
  |---|---|---|
  | ``matmul_flops`` | weight-matrix and LM-head FLOPs (forward + backward) | the matrix units |
  | ``attention_flops`` | score and weighted-sum FLOPs (grow with s^2) | attention kernels |
  | ``hidden_elementwise`` | tokens x layers x hidden | LayerNorm, GELU, residuals, dropout |
  | ``vocab_elementwise`` | tokens x vocabulary | softmax and cross-entropy over the logits |
  | ``layer_launches`` | micro-batches x (layers + local experts) | per-kernel overhead, independent of size |
  | ``optimizer_params`` | parameters | the AdamW update, once per step (so GAS amortises it) |

  Activation checkpointing recomputes the forward: its work terms grow by 4/3. Without
  training records, a system's microbenchmark block rate or, failing that, its datasheet
  peak times a stated efficiency stands in for the fitted rates, and the prediction says so.

* **Communication** is the alpha-beta ring model (``accel_kit.predict.comm``) of the gradient
  all-reduce (DDP) or reduce-scatter + all-gather (ZeRO-1), once per optimizer step, over the
  system's link (``interconnect`` in its YAML, or a measured probe). The exposed fraction is
  fitted from the system's multi-rank records whose data-parallel traffic overlaps the same way
  (``fits.exposure_class``); without them it is taken as 1 (no overlap with backward), the
  conservative case, and listed among the assumptions.

* **The layout** (dp x tp x pp x cp devices, ``StepShape``): a device computes its replica's work
  over tp x cp for a stage's blocks (``StepShape.work``); engine fsdp replaces the gradient sync by
  two all-gathers of the parameters per micro-batch and a reduce-scatter per step over dp;
  tensor parallelism adds four all-reduces of a chunk's activations per block (Megatron-LM's two
  in forward, two in backward) over the tensor-parallel group's link, exposed whole; expert
  parallelism (ep ranks within dp) adds four all-to-alls of a chunk's token copies per MoE layer
  (dispatch and combine, forward and backward) over the ep group's link, exposed whole too (the
  experts wait on their rows), and holds 1/ep of the routed experts; a pipeline stretches the
  stage's compute and tensor-parallel time by its bubble:

      step = (compute + tensor-parallel + expert-parallel) / (1 - (pp - 1) / (m + pp - 1)) + exposed x data-parallel

* **Memory** per device starts from ``accel_kit.models.estimate_training_memory`` (the live
  tensors at the peak) and fits, over the system's measured peaks, the terms of ``MEMORY_TERMS``:

  | term | bytes | what it stands for |
  |---|---|---|
  | ``runtime_baseline`` | 1 | interpreter, libraries, device context |
  | ``estimate`` | the estimate | the live tensors, times what the allocator holds beyond them |
  | ``accumulation_working_set`` | one micro-batch's activations and logits, where GAS > 1 | memory the allocator keeps from one micro-batch while the accumulated gradients are allocated among it |

  An allocator that caches freed blocks (PyTorch's on a GPU; glibc's with the CPU adapter's
  settings) holds more than the live peak, in proportion to it: a constant baseline alone
  misses that. The same subset selection as for compute keeps only the terms the records
  ask for.

Where each part lives: the step shape and its work and memory terms in ``shape``, reading
records in ``records``, the generic solver in ``nnls``, the three fits in ``fits``, the
collectives in ``comm``, link figures in ``links``, and the predictor on top of them here:
``Predictor.predict`` picks the comparable records for a shape (same precision and host threads,
the model's own where there are enough), fits on them and adds the layout's communication.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Iterable

import numpy as np

from accel_kit.json_types import JSONObject
from accel_kit.predict.comm import (Link, collective_s, expert_parallel_s, fsdp_sync_s, gradient_sync_s,
                                   tensor_parallel_s)
from accel_kit.predict.fits import (MIN_FIT_RECORDS, ComputeFit, exposure_class, fit_compute, fit_exposure,
                                    fit_memory)
from accel_kit.predict.links import system_link
from accel_kit.predict.records import group_key, host_threads, usable
from accel_kit.predict.shape import GiB, TERMS, StepShape
from accel_kit.results import Record

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
    tensor_parallel_s: float = 0.0  # the tp all-reduces, in comm_s and exposed_comm_s
    bubble_s: float = 0.0  # a pipeline's idle time, in step_time_s
    expert_parallel_s: float = 0.0  # the ep all-to-alls, in comm_s and exposed_comm_s

    def row(self) -> JSONObject:
        s, lay = self.shape, self.shape.layout
        return {"system": self.system, "preset": s.preset, "devices": lay.devices, "dp": lay.dp, "tp": lay.tp,
                "pp": lay.pp, "cp": lay.cp, "ep": lay.ep, "engine": lay.engine, "seq_len": s.seq_len,
                "micro_batch_size": lay.micro_batch_size, "gas": lay.gas, "precision": s.precision,
                "tokens_per_s": self.tokens_per_s, "step_time_s": self.step_time_s, "compute_s": self.compute_s,
                "exposed_comm_s": self.exposed_comm_s, "tensor_parallel_s": self.tensor_parallel_s,
                "expert_parallel_s": self.expert_parallel_s,
                "bubble_s": self.bubble_s, "scaling_efficiency": self.scaling_efficiency,
                "memory_per_device_gib": self.memory_per_device_gib, "fits": self.fits, "basis": self.basis}


class Predictor:
    """Predictions for one system from its records (those of other systems are ignored)."""

    def __init__(self, system: str, records: Iterable[Record], *, link: Link | None = None,
                 link_root: str | None = None, probe: bool = True, devices_per_node: int | None = None,
                 host_cores: int | None = None):
        self.system = system
        self.records = [r for r in records if r.system == system]
        self.train = [r for r in self.records if usable(r)]
        self._link_override = link
        self.link_root = link_root  # where a probed link is kept (beside the records)
        self.probe = probe  # measure a link that is neither kept nor in the system's YAML
        self.devices_per_node = devices_per_node  # how the devices share nodes; None: the system's
        # The cores of the host whose ranks share them (a CPU system's devices are processes on its cores: the
        # adapter's threads_per_rank(1)); None: each device computes on its own (``host_share``), and one link
        # serves rings of every size.
        self.host_cores = host_cores
        self._links: dict[tuple[int, int | None], Link] = {}  # (group, host ranks): each read or probed once

    def groups(self) -> dict[tuple, list[Record]]:
        out: dict[tuple, list[Record]] = {}
        for r in self.train:
            out.setdefault(group_key(r), []).append(r)
        return out

    def _group_for(self, shape: StepShape, threads: int | None, exclude: set[str]) -> list[Record] | None:
        """The comparable records for ``shape``: its precision and, where given, host threads per rank;
        among several host-thread groups, the one with records at its device count, else the largest."""
        groups = []
        for (_, precision, group_threads), g in self.groups().items():
            g = [r for r in g if r.record_id not in exclude]
            if precision != shape.precision or (threads is not None and group_threads != threads):
                continue
            if sum(r.params["devices"] == 1 for r in g) >= MIN_FIT_RECORDS:
                groups.append(g)
        if not groups:
            return None

        # Where ranks share the host's cores, records made with a rank's own thread count first: a rank's compute
        # is then theirs stretched by its share of the cores alone (``host_share``), where records with more
        # threads carry how well this model's kernels use them (a small MoE's two threads ran 1.35x one).
        # Then records at this device count; else those nearest below it (on a CPU, ranks share the host's
        # cores, so records of several ranks say how a rank computes among others); then the most.
        devices = shape.layout.devices
        own_threads = max(1, self.host_cores // devices) if self.host_cores else None

        def rank(g: list[Record]) -> tuple:
            counts = [r.params["devices"] for r in g]
            return (own_threads is not None and host_threads(g[0]) == own_threads, devices in counts,
                    max((c for c in counts if c <= devices), default=0), len(g))

        best = max(groups, key=rank)
        # The model's own records where there are enough of them: a rate fitted across models (a codon
        # vocabulary, another width) carries their differences into this one's prediction.
        same = [r for r in best if r.params["preset"] == shape.preset]
        if sum(r.params["devices"] == 1 for r in same) >= SAME_PRESET_RECORDS:
            return same
        return best

    def link(self, devices: int, host_ranks: int | None = None) -> Link:
        """The link of a group of ``devices``; ``host_ranks``: the ranks sharing the host's cores, where the
        group's are among them (each call then waits for a core: the call cost measured with that many ranks)."""
        if self._link_override:
            return self._link_override
        key = (devices, host_ranks if self.oversubscribed(host_ranks) and host_ranks != devices else None)
        if key not in self._links:
            # Ranks sharing the host's cores (host_cores): a ring measured at its own size (links.shared_host_ring).
            link = system_link(self.system, devices, root=self.link_root, probe=self.probe,
                               devices_per_node=self.devices_per_node, own_size=self.host_cores is not None)
            if key[1]:
                busy = self.link(key[1])  # (the host's ring of its own size: its call cost)
                link = replace(link, call_us=busy.call_us, source=f"{link.source}; {busy.call_us:.3g} us a call "
                                                                  f"while {key[1]} ranks compute ({busy.source})")
            self._links[key] = link
        return self._links[key]

    def host_ranks(self, shape: StepShape, per_node: int) -> int | None:
        """The ranks of ``shape`` that share one host's cores (None: each device computes on its own)."""
        return min(shape.layout.devices, per_node) if self.host_cores else None

    def oversubscribed(self, host_ranks: int | None) -> bool:
        """Whether more ranks than cores share the host: a waiting rank's core then goes to another rank."""
        return bool(host_ranks and self.host_cores and host_ranks > self.host_cores)

    def comm_s(self, shape: StepShape, dp_link: Link, host_ranks: int | None = None) -> tuple[float, float]:
        """(data-parallel, tensor- and expert-parallel) seconds of ``shape``'s modelled traffic per step: the
        first over ``dp_link`` (``dp_comm_s``), the second exposed whole (``layer_comm_s``)."""
        return self.dp_comm_s(shape, dp_link), sum(self.layer_comm_s(shape, host_ranks))

    @staticmethod
    def dp_comm_s(shape: StepShape, dp_link: Link) -> float:
        """Seconds per step of ``shape``'s data-parallel traffic over ``dp_link``."""
        lay = shape.layout
        if lay.dp == 1:
            return 0.0
        bw, lat, call = dp_link.bandwidth_Bps, dp_link.latency_s, dp_link.call_s
        if lay.engine == "fsdp":
            return fsdp_sync_s(*shape.fsdp_messages(), lay.dp, bw, lat, units=shape.fsdp_units, call_s=call)
        return gradient_sync_s(shape.grad_bytes(), lay.dp, bw, lat, zero1=lay.engine == "deepspeed", call_s=call)

    def layer_comm_s(self, shape: StepShape, host_ranks: int | None = None) -> tuple[float, float]:
        """(tensor-parallel, expert-parallel) seconds per step of the exchanges inside the blocks, each over its
        group's link (its ranks are neighbours on the mesh, within one node where it has room)."""
        tp_s = ep_s = 0.0
        tp, ep = shape.layout.tp, shape.layout.ep
        if tp > 1:
            link = self.link(tp, host_ranks)
            tp_s = tensor_parallel_s(*shape.tensor_parallel_messages(), tp, link.bandwidth_Bps, link.latency_s,
                                     link.call_s)
        if ep > 1:
            link = self.link(ep, host_ranks)
            ep_s = (expert_parallel_s(*shape.expert_parallel_messages(), ep, link.bandwidth_Bps, link.latency_s,
                                      link.call_s)
                    + shape.expert_parallel_count_gathers() * collective_s("all_gather", 0, ep, link.bandwidth_Bps,
                                                                           link.latency_s, link.call_s))
        return tp_s, ep_s

    def host_share(self, ranks: int, fit_threads: int | None) -> tuple[float, str]:
        """How much longer a rank computes than the records' process did, where ``ranks`` ranks share the host's
        ``host_cores``: each gets ``cores // ranks`` threads, and no more than ``cores / ranks`` of a core's time
        where there are more ranks than cores; the records ran at ``fit_threads`` per process. Linear in cores (a
        small model's matmuls scale worse than that, so this errs towards too short a step)."""
        cores = self.host_cores or 1
        threads = min(max(1, cores // ranks), cores / ranks)
        share = (fit_threads or threads) / threads
        return share, (f"compute: {ranks} ranks share the host's {cores} cores, {threads:.3g} core(s) each against "
                       f"the records' {fit_threads or '?'} thread(s): x{share:.3g} (linear in cores)")

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
            seen = sorted({r.params["preset"] for r in group})
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
        dp_s = tp_s = ep_s = exposure = 0.0
        lay = shape.layout
        host_ranks = self.host_ranks(shape, self.devices_per_node or system.devices_per_node)
        share = 1.0
        if host_ranks and group and lay.devices > 1:
            share, why = self.host_share(host_ranks, host_threads(group[0]))
            compute_s *= share
            assumptions.append(why)
        if lay.devices > 1:
            link = self.link(lay.devices, host_ranks)
            dp_s = self.dp_comm_s(shape, link)
            tp_s, ep_s = self.layer_comm_s(shape, host_ranks)
            inputs += self._link_inputs(shape, link, host_ranks)
            if dp_s > 0:
                kind = exposure_class(shape)
                exposure, why = (fit_exposure(group, fit, lambda s: self.comm_s(s, link, host_ranks), kind)
                                 if group else (1.0, "exposed communication: all of it (assumed, no records)"))
                (inputs if "median" in why else assumptions).append(why)
        # A pipeline's stage computes (and all-reduces over tp) for m chunk times of every m + pp - 1 the
        # step lasts; the data-parallel traffic follows, its unoverlapped share exposed.
        bubble = shape.bubble_fraction
        stage_s = (compute_s + tp_s + ep_s) / (1 - bubble)
        if bubble and self.oversubscribed(host_ranks):
            # More ranks than cores: a stage waiting in the bubble gives its core to another rank's work, so the
            # step is the host's work over its cores, unless one rank's own chain, computed at its threads'
            # whole pace, is longer (measured on 2 cores, 4 ranks: pp 2 ran 14-34 % faster than the bubble said).
            stage_s = max(compute_s, compute_s / share / (1 - bubble)) + tp_s + ep_s
            assumptions.append(f"pipeline bubble: filled by the other ranks' work ({host_ranks} ranks share "
                               f"{self.host_cores} cores)")
        step_s = stage_s + exposure * dp_s
        exposed = exposure * dp_s + tp_s + ep_s
        tokens_per_s = shape.tokens_per_step_per_replica * lay.dp / step_s
        efficiency = (compute_s / step_s) if lay.devices > 1 else 1.0
        memory = fit_memory(group)
        (inputs if memory.records else assumptions).append(memory.describe())
        mem_gib = memory.bytes(shape) / GiB
        device_gib = _device_memory_gib(system)
        assumptions += _layout_assumptions(shape)
        per_node = self.devices_per_node or system.devices_per_node
        if lay.devices > per_node:
            assumptions.append(f"{lay.devices} devices span {math.ceil(lay.devices / per_node)} "
                               f"nodes: the data-parallel ring runs at the inter-node link's per-device share")
        return Prediction(self.system, shape, step_s, compute_s, dp_s + tp_s + ep_s, exposed, tokens_per_s, efficiency,
                          mem_gib, device_gib, None if device_gib is None else mem_gib <= 0.9 * device_gib, basis,
                          fit.terms_s(shape), inputs, assumptions, tp_s, stage_s - (compute_s + tp_s + ep_s), ep_s)

    def _link_inputs(self, shape: StepShape, link: Link, host_ranks: int | None) -> list[str]:
        """The links ``shape`` crosses, as input lines with their sources."""
        lay = shape.layout
        out = [f"link: {link.bandwidth_GBps:.3g} GB/s per direction, {link.latency_us:.3g} us per ring "
               f"step{_call(link)} ({link.source})"]
        if lay.tp > 1:
            tp_link = self.link(lay.tp, host_ranks)
            out.append(f"tensor-parallel link ({lay.tp} devices): {tp_link.bandwidth_GBps:.3g} GB/s, "
                       f"{tp_link.latency_us:.3g} us per ring step{_call(tp_link)} ({tp_link.source})")
        if lay.ep > 1:
            ep_link = self.link(lay.ep, host_ranks)
            out.append(f"expert-parallel link ({lay.ep} devices): {ep_link.bandwidth_GBps:.3g} GB/s, "
                       f"{ep_link.latency_us:.3g} us per exchange step{_call(ep_link)} ({ep_link.source})")
        return out

    def _fallback_fit(self, shape: StepShape, system, inputs: list[str], assumptions: list[str]) -> ComputeFit:
        """Without training records: the system's block microbenchmark rate, else its datasheet peak x efficiency."""
        from accel_kit import peaks

        blocks = [r for r in self.records if r.status == "ok" and r.params.get("kind") == "block"
                  and r.params.get("direction") == "forward_backward" and r.params.get("impl", "native") ==
                  "native" and r.params.get("precision") == shape.precision and r.metrics.get("tflops")]
        rates = np.zeros(len(TERMS))
        if blocks:
            best = max(blocks, key=lambda r: r.params.get("batch_size", 0) * r.params.get("seq_len", 0))
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


def _call(link: Link) -> str:
    return f", {link.call_us:.3g} us a call" if link.call_us else ""


def _layout_assumptions(shape: StepShape) -> list[str]:
    """What the model takes of ``shape``'s layout, in words."""
    lay = shape.layout
    out = [f"layout dp {lay.dp} x tp {lay.tp} x pp {lay.pp} x cp {lay.cp}, engine {lay.engine}: each of "
           f"the {lay.dp} replica(s) computes its own micro-batches"
           + ("; the gradients synchronised over dp once per step" if lay.engine != "fsdp" else
              "; FSDP gathers every micro-batch's parameters in forward and backward and reduce-scatters the "
              "gradients once per step over dp")]
    if lay.tp > 1:
        out.append(f"tensor parallel {lay.tp}: a block's products split over its ranks, 4 all-reduces of a chunk's "
                   "activations per block (6 with checkpointing), not overlapped with compute; norms, residuals "
                   "and the head run whole on every rank (no sequence parallelism)")
    if lay.pp > 1:
        out.append(f"pipeline of {lay.pp} stages ({lay.pp_schedule}), {lay.microbatches} chunks per "
                   f"micro-batch: a bubble of (pp - 1) / (m + pp - 1) = {shape.bubble_fraction:.0%} of the step; "
                   f"the last stage ({shape.stage_layers} blocks and the head) sets the pace; the activations "
                   "sent between stages are not modelled")
    if lay.cp > 1:
        out.append(f"context parallel {lay.cp}: the sequence splits over its ranks; their exchange of keys and "
                   "values is not modelled")
    if lay.ep > 1:
        out.append(f"expert parallel {lay.ep} within dp: a rank holds 1/{lay.ep} of the routed experts; 4 "
                   "all-to-alls of a chunk's token copies per MoE layer (6 with checkpointing), not overlapped, "
                   "routing taken as uniform (a busier rank waits longer); the experts' gradients taken as "
                   "reduced over all of dp")
    return out


def _device_memory_gib(system) -> float | None:
    """One device's memory: the system YAML's figure, else what the adapter reports where it runs here."""
    if system.device_memory_gib:
        return float(system.device_memory_gib)
    from accel_kit.devices import get_adapter

    adapter = get_adapter(system.adapter, system.options)
    total = adapter.total_memory_bytes() if adapter.availability() else None
    return total / GiB if total else None
