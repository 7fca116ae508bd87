"""What a training point adds to the shared measurement path (``accel_kit.engine.measurement``).

Its shape and FLOPs from the model preset's family, its fit check (the memory estimate, first with
fused attention as the least it could need, then with the kernel the probe found), its
model, sparsity and trainer from the programming model (eager PyTorch or the vendor's,
``accel_kit.engine.eager``), and its metrics: tokens/s, samples/s, TFLOP/s per device,
losses and the sparsity figures.
"""
from __future__ import annotations

from accel_kit import flops as F
from accel_kit.devices.base import BaseAdapter
from accel_kit.data import tokenizer_of
from accel_kit.engine.attention import AttentionKernelUnavailable, attention_context, probe_attention_kernel
from accel_kit.engine.eager import point_batches, programming_model
from accel_kit.engine import measurement
from accel_kit.engine.kinds import register_kind
from accel_kit.engine.layout import data_rank, unsupported_on_device
from accel_kit.engine.measurement import Context, GiB, KindMeasurement, Window
from accel_kit.engine.point import TrainPoint
from accel_kit.engine.result import Result
from accel_kit.models import count_params, estimate_training_memory, family_of, fits, get_config
from accel_kit.precision import dtype_of, spec
from accel_kit.timing import Timing


# A step that spends a tenth of its time waiting on its batches reports the loader's speed as much as the
# device's: beyond the few-% spread that marks a measurement noisy (accel_kit.timing), so flagged.
INPUT_BOUND_SHARE = 0.1


def share(total: int, devices: int) -> int | float:
    """``total`` per device: an integer where it divides evenly (FLOPs and tokens stay exact)."""
    return total // devices if total % devices == 0 else total / devices


class TrainMeasurement(KindMeasurement):
    """One training point: warm-up and timed optimizer steps of its model on its data."""

    work = "tokens"

    def __init__(self, point: TrainPoint, ctx: Context):
        super().__init__(point, ctx)  # training's fp32 is true fp32 (its datasheet peak is the fp32 one)
        dtype = dtype_of(point.precision)
        self.family = family_of(point.preset)
        self.overrides = {"seq_len": point.seq_len, "pad_vocab_multiple": point.pad_vocab_multiple,
                          **self.family.kernel_overrides(ctx.adapter, dtype)}
        if point.vocab_size:
            self.overrides["vocab_size"] = point.vocab_size
        self.cfg = cfg = get_config(point.preset, **self.overrides)
        self.shape = self.family.shape(cfg)
        self.n_params = count_params(point.preset, **self.overrides)
        # A MoE model's tokens each multiply only their routed experts' weights: its FLOPs are counted on these.
        self.n_params_active = self.n_params - self.family.inactive_weight_count(cfg)
        # Our families' formulas, or (hf:) one forward and backward of the micro-batch counted on fake tensors.
        self.flop_terms = self.family.flop_terms(cfg, point.seq_len, micro_batch=point.micro_batch_size)
        self.flops_per_token = self.flop_terms.total()
        # One timed call (trainer.step()) runs ``steps_per_call`` optimizer steps of the global batch
        # (micro-batch x gas x replicas), shared by the point's devices: with torch's data parallelism
        # (one replica per device, one step per call) each device's micro-batch x gas. The adapter's
        # layout says otherwise where replicas and devices differ (a pipeline, a replica per half device).
        self.samples_per_call = point.global_batch_size * point.steps_per_call
        self.tokens_per_call = self.samples_per_call * point.seq_len
        self.tokens_per_call_per_device = share(self.tokens_per_call, point.devices)
        self.flops_per_call_per_device = share(self.flops_per_token * self.tokens_per_call, point.devices)
        # The shape that ran: presets of one name may differ between vendors (GPT-2 XL: 25 heads here and in
        # transformers, 16 in the Cerebras ModelZoo's gpt2_xl; preset gpt2-xl-16h).
        self.base = self.shape.record() | {"n_params": self.n_params, "n_params_active": self.n_params_active,
                     "flops": self.flops_per_call_per_device, "flops_per_token": self.flops_per_token,
                     "global_batch_size": point.global_batch_size,
                     "dp": point.dp, "mesh": point.mesh_label(),
                     "tokens_per_step": point.global_batch_size * point.seq_len,
                     "flops_source": self.family.flops_source(cfg, point.seq_len, micro_batch=point.micro_batch_size)}
        self.out["model"] = point.preset
        self.base["tokenizer"] = tokenizer_of(point.data_path)  # None: synthetic tokens
        self.device_bytes = ctx.adapter.total_memory_bytes()
        self.losses: list[float] = []
        self.finetune_losses: list[float] = []

    # --- preflight

    def _estimate(self, flash: bool):
        p = self.point
        return estimate_training_memory(self.cfg, self.n_params, p.micro_batch_size, p.seq_len, p.precision,
                                        activation_checkpointing=p.activation_checkpointing,
                                        layout=p, flash_attention=flash)

    def _not_fit(self, est) -> Result | None:
        if fits(est, self.device_bytes):
            return None
        p = self.point
        return self.result("unsupported", f"does not fit: needs about {est.describe()} per device as "
                                          f"{self.base['mesh']} ({p.engine}), device has "
                                          f"{self.device_bytes / GiB:.1f} GiB", mem_estimate_gib=est.total_bytes / GiB)

    def fit(self) -> Result | None:
        # Before anything is allocated (the attention probe allocates the point's shape): the
        # estimate with fused attention is the least the point needs.
        return self._not_fit(self._estimate(flash=True))

    def total_flops(self) -> float:
        p = self.point
        return self.flops_per_call_per_device * (p.warmup_steps + p.steps + p.dense_finetune_steps)

    # --- setup

    def _attention(self) -> Result | None:
        """Which attention kernel runs (recorded); a forced kernel the device lacks makes the point unsupported.
        A device whose graph compiler lowers attention itself says so instead of a probe of torch's dispatch."""
        p, attention = self.point, self.shape.attention
        known = self.ctx.adapter.attention_kernel(p)
        try:
            self.base |= known if known is not None else probe_attention_kernel(
                p.attention_kernel, n_heads=attention.n_heads, n_kv_heads=attention.n_kv_heads,
                head_dim=attention.head_dim, seq_len=p.seq_len,
                device=self.ctx.device, dtype=spec(p.precision).dtype if spec(p.precision).mixed else None)
        except AttentionKernelUnavailable as exc:
            return self.result("unsupported", str(exc))
        full = self._estimate(flash=self.base["attention_kernel_ran"] != "math")
        self.base["mem_estimate_gib"] = full.total_bytes / GiB
        return self._not_fit(full)

    def setup(self) -> Window | Result:
        import torch

        p, ctx = self.point, self.ctx
        early = self._attention()
        if early is not None:
            return early
        if p.sparsity > 0 and p.engine == "deepspeed":
            return self.result("unsupported", "weight sparsity re-applies its masks after each optimizer step "
                                              "(Trainer.after_step); the DeepSpeed engine here has no such hook")
        torch.manual_seed(p.seed)
        runtime = programming_model(ctx.adapter)  # eager PyTorch, or the vendor's own
        # Built on the point's device (the host where a vendor's toolchain takes the model from there; the meta
        # device where the layout shards it first), in fp32: every training precision starts from fp32 weights
        # (bf16's master weights, fp16's autocast, FSDP's and DeepSpeed's mixed precision); prepare_model casts it
        # as the device trains it.
        model = runtime.prepare_model(runtime.build_model(p, ctx.device, **self.overrides), p, ctx.device)
        self.model = model  # the family reads what only the model knows after the steps (``Family.ran_fields``)
        # Weight sparsity: prune, keep the masks through training, pick the execution path (the adapter's way).
        self.sparse = runtime.make_sparsity(model, p, ctx.device)
        batches = point_batches(p, self.shape.vocab_size, data_rank(p, ctx.rank))
        self.trainer = runtime.make_trainer(p, model, batches, ctx.device, ctx.world,
                                            after_step=self.sparse.apply_masks if self.sparse.active else None)
        # trainer.step() returns the loss as a float, which syncs the device; the clock syncs around it too.
        # The attention context also covers checkpointed recomputation in backward.
        return Window(lambda: self.losses.append(self.trainer.step()), warmup=p.warmup_steps, trials=p.steps,
                      extra_iterations=p.dense_finetune_steps, context=attention_context(p.attention_kernel))

    def after_window(self, timing: Timing) -> None:
        self.sparse_metrics = self.sparse.metrics()  # measured after the last step: the masks held
        self.loader_s = self._time_loader()
        if self.point.dense_finetune_steps:  # "sparse pre-train, dense fine-tune": every weight trains again
            self.sparse.release()
            self.trainer.after_step = None
            self.finetune_losses = [self.trainer.step() for _ in range(self.point.dense_finetune_steps)]

    # --- the input pipeline, on its own

    def _readers(self) -> int:
        """Processes that read distinct batches: the ranks over the tensor x pipeline x context layout, since
        the ranks of one tensor- or context-parallel group and of one pipeline all read their replica's
        batches (``layout.data_rank``)."""
        p = self.point
        return max(1, p.ranks // p.replica_devices)

    def _loader_batches(self) -> int:
        """Micro-batches one process's loader delivered in the timed window: its share of each call's samples."""
        p = self.point
        return -(-self.samples_per_call // (self._readers() * p.micro_batch_size)) * p.steps

    def _time_loader(self) -> float:
        """Seconds a fresh loader on the same data (same seed and rank: the batches the window began with)
        takes to deliver the window's micro-batches with no step between them: once, so it costs no more
        than fetching them did in the window."""
        import time

        batches = iter(point_batches(self.point, self.shape.vocab_size, data_rank(self.point, self.ctx.rank)))
        start = time.perf_counter()
        for _ in range(self._loader_batches()):
            next(batches)
        return time.perf_counter() - start

    def input_metrics(self, step_s: float) -> dict:
        """The loader's rate alone against what the step consumed, per process; ``input_bound`` when the
        loader alone needs ``INPUT_BOUND_SHARE`` of the step's time or more (the step fetches its batches
        in line, so it waits that long on them)."""
        p = self.point
        loader_tokens = self._loader_batches() * p.micro_batch_size * p.seq_len
        consumed = self.tokens_per_call / self._readers() / step_s  # tokens per second one process's step took in
        loader = loader_tokens / self.loader_s if self.loader_s > 0 else float("inf")
        wait_pct = 100 * consumed / loader
        return {"loader_tokens_per_s": loader if loader != float("inf") else None,
                "step_input_tokens_per_s": consumed, "input_wait_pct": wait_pct,
                "input_bound": wait_pct >= 100 * INPUT_BOUND_SHARE}

    # --- finish

    def metrics(self, timing: Timing, mem_bytes: int | None) -> tuple[dict, float, float]:
        from accel_kit.sparsity import record_metrics

        p = self.point
        step_s = timing.median_s  # one trainer call
        achieved = F.tflops(self.flops_per_call_per_device, step_s)
        metrics = {
            "step_time_s": step_s / p.steps_per_call,  # one optimizer step
            "tokens_per_s": self.tokens_per_call / step_s,
            "tokens_per_s_per_device": self.tokens_per_call_per_device / step_s,
            "samples_per_s": self.samples_per_call / step_s,
            # GenSLM's own measure: global batch over the *mean* step time, warm-up excluded.
            "samples_per_s_mean": self.samples_per_call / timing.mean_s,
            "tflops_per_device": achieved,
            "loss_first": self.losses[0],
            "loss_last": self.losses[-1],
            "losses": self.losses,
        }
        metrics |= self.input_metrics(step_s) | self.family.ran_fields(self.model)
        metrics |= record_metrics(self.sparse_metrics, self.flop_terms, self.flops_per_call_per_device,
                                  self.tokens_per_call_per_device, step_s, self.finetune_losses)
        extra = getattr(self.trainer, "extra_metrics", None)  # a runtime's own figures (e.g. cstorch's rate tracker)
        if extra is not None:
            metrics |= extra(timing)
        # every device's energy over the timed steps, against every token they trained on
        return metrics, achieved, self.tokens_per_call * p.steps

    def summary(self, metrics: dict) -> str:
        return f"{metrics['tokens_per_s']:.0f} tok/s"


def measure_train(point: TrainPoint, ctx: Context) -> Result:
    return measurement.run(TrainMeasurement(point, ctx))


def unsupported_train(adapter: BaseAdapter, point: TrainPoint) -> str | None:
    """The programming model's answer, then whether the device can take the point's parallel layout."""
    return adapter.unsupported("train", point) or unsupported_on_device(point, adapter)


register_kind("train", TrainPoint, measure_train, unsupported=unsupported_train)
