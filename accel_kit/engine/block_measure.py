"""What a microbenchmark point adds to the shared measurement path (``accel_kit.engine.measurement``).

One layer of the point's model preset (ours, ours under ``torch.compile``, or transformers'
layer of the same shape with SDPA attention: the family builds each), built on the device in
the point's precision (weights and activations, as the paper's microbenchmark does), timed
forward or forward and backward as the device's programming model runs one iteration. fp32
means true fp32 (TF32 off) unless the point sets ``tf32``.
"""
from __future__ import annotations

import torch

from accel_kit import flops as F
from accel_kit.engine.eager import programming_model
from accel_kit.engine import measurement
from accel_kit.engine.kinds import register_kind
from accel_kit.engine.measurement import Context, GiB, KindMeasurement, Window
from accel_kit.engine.point import BlockPoint
from accel_kit.engine.result import Result
from accel_kit.models import building_on, family_of, get_config
from accel_kit.models.memory import estimate_block_memory
from accel_kit.precision import dtype_of
from accel_kit.timing import Timing


def build_block(impl: str, cfg: object) -> torch.nn.Module:
    """One layer of ``cfg``'s family (a family's config, ``get_config``'s): ours (``native``, ``compiled``: compiled
    by the caller) or transformers'."""
    return family_of(cfg).build_layer(cfg, "hf" if impl == "hf" else "native")


BLOCK_SHAPE_FIELDS = ("family", "hidden_size", "n_heads", "n_kv_heads", "ffn_hidden_size")


class BlockMeasurement(KindMeasurement):
    """One block point: ``warmup`` then ``trials`` timed iterations in one direction."""

    work = "flops"

    def __init__(self, point: BlockPoint, ctx: Context):
        super().__init__(point, ctx, tf32=point.tf32)  # the block's fp32 is true fp32 unless asked
        self.dtype = dtype_of(point.precision)
        self.family = family_of(point.preset)
        # the layer's position tables (RoPE) cover the point's sequence
        overrides = {"seq_len": point.seq_len, **self.family.kernel_overrides(ctx.adapter, self.dtype)}
        self.cfg = get_config(point.preset, **overrides)
        self.shape = self.family.shape(self.cfg)
        tokens = point.batch_size * point.seq_len
        self.flops = tokens * self.family.layer_flop_terms(self.cfg, point.seq_len).total(point.direction)
        # FLOPs of one timed iteration (tflops == flops / time_median_s / 1e12), and the layer's shape.
        shape = self.shape.record()
        self.base = {"flops": self.flops} | {k: shape[k] for k in BLOCK_SHAPE_FIELDS}
        self.out["model"] = f"{self.shape.family}-block-h{self.shape.hidden_size}"

    def fit(self) -> Result | None:
        p = self.point
        need = estimate_block_memory(self.cfg, p.batch_size, p.seq_len, self.dtype.itemsize,
                                     backward=p.direction == "forward_backward")
        device_bytes = self.ctx.adapter.total_memory_bytes()
        if device_bytes is not None and need > 0.9 * device_bytes:
            return self.result("unsupported", f"does not fit: needs at least {need / GiB:.1f} GiB, device has "
                                              f"{device_bytes / GiB:.1f} GiB", mem_estimate_gib=need / GiB)
        return None

    def total_flops(self) -> float:
        return self.flops * (self.point.warmup + self.point.trials)

    def setup(self) -> Window:
        p, device = self.point, self.ctx.device
        torch.manual_seed(p.seed)
        with building_on(device, self.dtype):  # made on the device in the point's dtype: no host copy, no fp32 copy
            module = build_block(p.impl, self.cfg)
        if p.torch_compile or p.impl == "compiled":
            module = torch.compile(module)
        backward = p.direction == "forward_backward"
        x = torch.randn(p.batch_size, p.seq_len, self.shape.hidden_size, device=device, dtype=self.dtype,
                        requires_grad=backward)
        # One iteration as the device's programming model runs it (eager PyTorch by default).
        step = programming_model(self.ctx.adapter).make_block_step(p, module, x,
                                                                   torch.randn_like(x) if backward else None)
        return Window(step, warmup=p.warmup, trials=p.trials, noisy_cv=p.noisy_cv)

    def metrics(self, timing: Timing, mem_bytes: int | None) -> tuple[dict, float, float]:
        achieved = F.tflops(self.flops, timing.median_s)
        tokens_per_s = self.point.batch_size * self.point.seq_len / timing.median_s
        # the device's energy over the timed iterations, against the FLOPs they computed
        return {"tflops": achieved, "tokens_per_s": tokens_per_s}, achieved, self.flops * self.point.trials

    def summary(self, metrics: dict) -> str:
        return f"{metrics['tflops']:.3f} TFLOP/s"


def measure_block(point: BlockPoint, ctx: Context) -> Result:
    return measurement.run(BlockMeasurement(point, ctx))


register_kind("block", BlockPoint, measure_block)
