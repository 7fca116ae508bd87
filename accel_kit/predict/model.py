"""What-if: one training step's time and memory predicted from a system's own measurements.

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
  | ``layer_launches`` | micro-batches x layers | per-kernel overhead, independent of size |
  | ``optimizer_params`` | parameters | the AdamW update, once per step (so GAS amortises it) |

  Activation checkpointing recomputes the forward: its work terms grow by 4/3. Without
  training records, a system's microbenchmark block rate or, failing that, its datasheet
  peak times a stated efficiency stands in for the fitted rates, and the prediction says so.

* **Communication** is the alpha-beta ring model (``accel_kit.predict.comm``) of the gradient
  all-reduce (DDP) or reduce-scatter + all-gather (ZeRO-1), once per optimizer step, over the
  system's link (``interconnect`` in its YAML, or a measured probe). The exposed fraction is
  fitted from the system's multi-rank records; without them it is taken as 1 (no overlap with
  backward), the conservative case, and listed among the assumptions.

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
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np

from accel_kit import flops as F
from accel_kit.predict.comm import Link, gradient_sync_s
from accel_kit.predict.links import system_link

GiB = 2**30
TERMS = ("matmul_flops", "attention_flops", "hidden_elementwise", "vocab_elementwise", "layer_launches",
         "optimizer_params")
# A term is kept only if it lowers the fit's relative RMS error by more than this fraction: with a
# handful of records per system, terms that are collinear for one model (every per-token term is
# proportional to tokens) would otherwise take arbitrary shares and extrapolate badly.
TERM_PENALTY = 0.03
MEMORY_TERMS = ("runtime_baseline", "estimate", "accumulation_working_set")
# Stated when a system has no training records: a GPT-2-sized model's MFU on a GPU is typically 30-50 %.
NO_RECORDS_EFFICIENCY = 0.4
SAME_PRESET_RECORDS = 3  # single-device records of the predicted preset that make a fit of its own
MIN_FIT_RECORDS = 1  # with one record, one rate: enough for the same shape on more devices


@dataclass(frozen=True)
class StepShape:
    """What one data-parallel rank computes per optimizer step."""

    preset: str
    n_layers: int
    hidden: int
    n_heads: int
    vocab: int  # padded vocabulary the LM head computes over
    n_params: int
    seq_len: int
    micro_batch_size: int
    gas: int = 1
    devices: int = 1
    precision: str = "bf16"
    engine: str = "ddp"
    activation_checkpointing: bool = False
    flash_attention: bool = True

    @property
    def tokens_per_step_per_device(self) -> int:
        return self.micro_batch_size * self.seq_len * self.gas

    @property
    def flops_per_step_per_device(self) -> float:
        return self.tokens_per_step_per_device * F.gpt_flops_per_token(self.n_layers, self.hidden, self.seq_len,
                                                                        self.vocab)

    def work(self) -> np.ndarray:
        """Work per optimizer step for each of ``TERMS``."""
        tokens = self.tokens_per_step_per_device
        recompute = 4 / 3 if self.activation_checkpointing else 1.0
        backward = 1 + F.BACKWARD_TO_FORWARD
        matmul = tokens * (self.n_layers * F.block_matmul_flops_per_token(self.hidden) + 2 * self.hidden * self.vocab)
        attention = tokens * self.n_layers * F.attention_flops_per_token(self.hidden, self.seq_len)
        return np.array([matmul * backward * recompute, attention * backward * recompute,
                         tokens * self.n_layers * self.hidden * recompute, tokens * self.vocab,
                         self.gas * self.n_layers, self.n_params], dtype=float)

    def grad_bytes(self) -> int:
        """Bytes of gradients each rank synchronises per step (bf16 models keep bf16 gradients)."""
        per = 2 if self.precision == "bf16" or (self.engine == "deepspeed" and self.precision == "fp16") else 4
        return self.n_params * per

    def memory_estimate(self):
        """``accel_kit.models.MemoryEstimate`` of one device at this shape."""
        from accel_kit.models import estimate_training_memory, get_config

        cfg = get_config(self.preset, seq_len=self.seq_len, vocab_size=self.vocab)
        return estimate_training_memory(cfg, self.n_params, self.micro_batch_size, self.seq_len, self.precision,
                                        activation_checkpointing=self.activation_checkpointing,
                                        flash_attention=self.flash_attention,
                                        zero_shards=self.devices if self.engine == "deepspeed" else 1)

    def memory_estimate_bytes(self) -> int:
        return self.memory_estimate().total_bytes

    def memory_work(self) -> np.ndarray:
        """Bytes for each of ``MEMORY_TERMS``."""
        est = self.memory_estimate()
        working_set = est.activations_bytes + est.logits_bytes if self.gas > 1 else 0
        return np.array([1.0, est.total_bytes, working_set], dtype=float)


def shape_for(preset: str, *, seq_len: int, micro_batch_size: int, gas: int = 1, devices: int = 1,
              precision: str = "bf16", engine: str = "ddp", activation_checkpointing: bool = False,
              vocab_size: int | None = None, flash_attention: bool = True) -> StepShape:
    """The step shape of a model preset at these settings."""
    from accel_kit.models import count_params, get_config

    overrides: dict[str, Any] = {"seq_len": seq_len}
    if vocab_size:
        overrides["vocab_size"] = vocab_size
    cfg = get_config(preset, **overrides)
    return StepShape(preset, cfg.n_layers, cfg.hidden_size, cfg.n_heads, cfg.padded_vocab_size,
                     count_params(preset, **overrides), seq_len, micro_batch_size, gas, devices, precision, engine,
                     activation_checkpointing, flash_attention)


def shape_of_record(record: dict) -> StepShape:
    """The step shape a training record measured."""
    p, m = record["params"], record["metrics"]
    return shape_for(p["preset"], seq_len=p["seq_len"], micro_batch_size=p["micro_batch_size"], gas=p["gas"],
                     devices=p["devices"], precision=p["precision"], engine=p.get("engine", "ddp"),
                     activation_checkpointing=p.get("activation_checkpointing", False),
                     vocab_size=p.get("vocab_size"), flash_attention=m.get("attention_kernel_ran", "flash") != "math")


def host_threads(record: dict) -> int | None:
    """Threads each rank computed with, where the device is the host CPU (ranks share its cores)."""
    return (record.get("env") or {}).get("device", {}).get("threads")


def usable(record: dict) -> bool:
    """An ok, dense training record with a step time: what the compute fit learns from."""
    p, m = record.get("params", {}), record.get("metrics", {})
    return (record.get("status") == "ok" and p.get("kind", "train") == "train" and "preset" in p
            and not p.get("sparsity") and not p.get("dense_finetune_steps") and m.get("step_time_s"))


def group_key(record: dict) -> tuple:
    """Records whose rates are comparable: same system, precision and host threads per rank."""
    return record["system"], record["params"]["precision"], host_threads(record)


# --------------------------------------------------------------------------- fitting

def nnls_relative(work: np.ndarray, times_s: np.ndarray) -> tuple[np.ndarray, float]:
    """Non-negative rates minimising the relative error of ``work @ rates`` against ``times_s``.

    Exhaustive over subsets of terms (six at most), keeping the smallest subset whose
    relative RMS error is within ``TERM_PENALTY`` of the best: exact and dependency-free.
    Returns (seconds per unit of work for each term, relative RMS error).
    """
    n, k = work.shape
    A = work / times_s[:, None]  # rows scaled so the residual is relative
    scale = np.where(A.max(axis=0) > 0, A.max(axis=0), 1.0)
    A = A / scale
    ones = np.ones(n)
    best: list[tuple[float, int, np.ndarray]] = []
    for size in range(1, min(k, n) + 1):
        for subset in itertools.combinations(range(k), size):
            cols = list(subset)
            if not np.any(A[:, cols]):
                continue
            coef, *_ = np.linalg.lstsq(A[:, cols], ones, rcond=None)
            if np.any(coef < 0):
                continue
            rates = np.zeros(k)
            rates[cols] = coef
            rms = float(np.sqrt(np.mean((A @ rates - 1) ** 2)))
            best.append((rms, size, rates))
    if not best:
        raise ValueError("no non-negative fit exists for these records")
    floor = min(b[0] for b in best)
    # Each extra term must pay for itself: penalised error, then fewer terms.
    rms, _, rates = min(best, key=lambda b: (b[0] + TERM_PENALTY * b[1] * max(floor, 1e-3), b[1]))
    return rates / scale, rms


@dataclass
class ComputeFit:
    """Fitted seconds per unit of each work term for one (system, precision, threads) group."""

    system: str
    precision: str
    threads: int | None
    rates: np.ndarray
    fit_rms: float
    record_ids: list[str]
    basis: str

    def compute_s(self, shape: StepShape) -> float:
        return float(shape.work() @ self.rates)

    def terms_s(self, shape: StepShape) -> dict[str, float]:
        return {t: float(w * r) for t, w, r in zip(TERMS, shape.work(), self.rates) if r > 0}


def _single_rank_time(record: dict) -> float:
    return float(record["metrics"]["step_time_s"])


def fit_compute(records: list[dict]) -> ComputeFit:
    """Fit the compute rates from single-rank training records of one group."""
    one = [r for r in records if r["params"]["devices"] == 1]
    if len(one) < MIN_FIT_RECORDS:
        raise ValueError(f"{len(one)} single-device records; the fit needs at least {MIN_FIT_RECORDS}")
    work = np.stack([shape_of_record(r).work() for r in one])
    times = np.array([_single_rank_time(r) for r in one])
    rates, rms = nnls_relative(work, times)
    system, precision, threads = group_key(one[0])
    return ComputeFit(system, precision, threads, rates, rms, [r["record_id"] for r in one],
                      f"fitted on {len(one)} single-device training record{'s' if len(one) > 1 else ''} of {system} ({precision}"
                      + (f", {threads} host threads per rank" if threads else "") + ")")


def fit_exposure(records: list[dict], compute: ComputeFit, link: Link) -> tuple[float, str]:
    """The fraction of the modelled communication that shows in the step time, from multi-rank records."""
    ratios = []
    for r in records:
        shape = shape_of_record(r)
        if shape.devices < 2:
            continue
        comm = gradient_sync_s(shape.grad_bytes(), shape.devices, link.bandwidth_Bps, link.latency_s,
                               zero1=shape.engine == "deepspeed")
        if comm > 0:
            ratios.append(max(0.0, (_single_rank_time(r) - compute.compute_s(shape)) / comm))
    if not ratios:
        return 1.0, "exposed communication: all of it (no multi-device records to fit the overlap; assumed, conservative)"
    value = float(np.median(ratios))
    return value, f"exposed communication: {value:.2f} of the modelled time (median over {len(ratios)} multi-device records)"


@dataclass
class MemoryFit:
    """Fitted multiples of each of ``MEMORY_TERMS`` (the estimate alone where no peak was measured)."""

    coefs: np.ndarray
    fit_rms: float
    records: int

    def bytes(self, shape: StepShape) -> float:
        return float(shape.memory_work() @ self.coefs)

    def describe(self) -> str:
        if not self.records:
            return "memory: the estimate alone (no measured peaks to fit the runtime's baseline)"
        base, scale, accum = self.coefs
        parts = [f"{base / GiB:.2f} GiB runtime baseline"] if base else []
        parts.append(f"{scale:.2f} x the estimate")
        if accum:
            parts.append(f"{accum:.2f} x a micro-batch's activations and logits where GAS > 1")
        return (f"memory: {' + '.join(parts)} (fitted on the measured peaks of {self.records} records; relative "
                f"RMS error {self.fit_rms:.1%})")


def fit_memory(records: list[dict]) -> MemoryFit:
    """The memory terms fitted on the records with a measured peak; the estimate alone without any."""
    measured = [r for r in records if r["metrics"].get("mem_peak_gib")]
    if not measured:
        return MemoryFit(np.array([0.0, 1.0, 0.0]), float("nan"), 0)
    work = np.stack([shape_of_record(r).memory_work() for r in measured])
    peaks = np.array([r["metrics"]["mem_peak_gib"] * GiB for r in measured])
    try:
        coefs, rms = nnls_relative(work, peaks)
    except ValueError:
        return MemoryFit(np.array([0.0, 1.0, 0.0]), float("nan"), 0)
    return MemoryFit(coefs, rms, len(measured))


# --------------------------------------------------------------------------- prediction

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
