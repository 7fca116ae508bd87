"""What a microbenchmark point adds to the shared measurement path (``accel_kit.engine.measurement``).

One transformer block (ours, or transformers' ``GPT2Block`` of the same shape with SDPA
attention), cast to the point's precision (weights and activations, as the paper's
microbenchmark does), timed forward or forward and backward as the device's programming
model runs one iteration. fp32 means true fp32 (TF32 off) unless the point sets ``tf32``.
"""
from __future__ import annotations

from typing import Any

import torch

from accel_kit import flops as F
from accel_kit.engine.eager import programming_model
from accel_kit.engine.measurement import GiB, KindMeasurement, Window
from accel_kit.models.block import Block, BlockConfig
from accel_kit.models.memory import estimate_block_memory
from accel_kit.precision import dtype_of
from accel_kit.timing import Timing


def build_block(impl: str, cfg: BlockConfig, seq_len: int) -> torch.nn.Module:
    """Our block, or transformers' GPT2Block (SDPA attention) of the same shape."""
    if impl == "native":
        return Block(cfg)
    from transformers import GPT2Config
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block

    hf_cfg = GPT2Config(n_embd=cfg.hidden_size, n_head=cfg.n_heads, n_inner=cfg.mlp_ratio * cfg.hidden_size,
                        n_positions=seq_len, layer_norm_epsilon=cfg.layer_norm_eps, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0)
    hf_cfg._attn_implementation = "sdpa"
    return GPT2Block(hf_cfg, layer_idx=0)


class BlockMeasurement(KindMeasurement):
    """One block point: ``warmup`` then ``trials`` timed iterations in one direction."""

    work = "flops"

    def __init__(self, point: Any, ctx: Any):
        super().__init__(point, ctx, tf32=point.tf32)  # the block's fp32 is true fp32 unless asked
        self.dtype = dtype_of(point.precision)
        self.cfg = BlockConfig(point.hidden_size, point.n_heads, point.mlp_ratio,
                               narrow_linear_fast_path=ctx.adapter.narrow_linear_fast_path(self.dtype))
        self.flops = F.block_flops(point.batch_size, point.seq_len, self.cfg.hidden_size, mlp_ratio=self.cfg.mlp_ratio,
                                   direction=point.direction)
        self.base = {"flops": self.flops}  # FLOPs of one timed iteration: tflops == flops / time_median_s / 1e12
        self.out["model"] = f"gpt2-block-h{point.hidden_size}"

    def fit(self) -> dict | None:
        p = self.point
        need = estimate_block_memory(p.batch_size, p.seq_len, self.cfg.hidden_size, self.cfg.mlp_ratio,
                                     self.dtype.itemsize, backward=p.direction == "forward_backward")
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
        module = build_block(p.impl, self.cfg, p.seq_len).to(device=device, dtype=self.dtype)
        if p.torch_compile:
            module = torch.compile(module)
        backward = p.direction == "forward_backward"
        x = torch.randn(p.batch_size, p.seq_len, self.cfg.hidden_size, device=device, dtype=self.dtype,
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
