"""The memory estimate per parallel layout (``accel_kit.models.memory``): each layout's parts against the
formula's own pieces, and the fit check before allocation taking the point's layout."""
from __future__ import annotations

import math

import pytest

from accel_kit.mesh import ParallelLayout
from accel_kit.models import count_params, estimate_training_memory, family_of, fits, get_config

GiB = 2**30
B, S = 8, 1024  # GPT-2 XL at the paper's sequence, micro-batch 8
# GPT-2 XL as the CS-2 model zoo shapes it (16 heads, which tp 4 divides; the released 25 do not), 1.56B
XL = "gpt2-xl-16h"


@pytest.fixture(scope="module")
def xl():
    cfg = get_config(XL)
    return cfg, count_params(XL), family_of(cfg)


def _est(xl, layout=ParallelLayout(), precision="bf16", **kw):
    cfg, n, _ = xl
    return estimate_training_memory(cfg, n, kw.pop("micro_batch", B), S, precision, layout=layout, **kw)


def test_dp_only_layouts_keep_the_replica_figures(xl):
    cfg, n, family = xl
    one = _est(xl)
    # bf16: 4 + 2 weights, 4 + 2 gradients, 8 moments per parameter; 34 sbh per layer; logits (2 + 4 + 4 + 4) sbV
    assert (one.weights_bytes, one.grads_bytes, one.optimizer_bytes) == (6 * n, 6 * n, 8 * n)
    assert one.activations_bytes == family.shape(cfg).n_layers * 34 * S * B * 1600
    assert one.logits_bytes == B * S * family.shape(cfg).vocab_size_model * 14
    assert _est(xl, ParallelLayout(devices=8)) == one  # DDP: every replica whole
    zero = _est(xl, ParallelLayout(devices=8, engine="deepspeed"))
    assert zero.optimizer_bytes == 8 * n // 8 and zero.weights_bytes == one.weights_bytes


def test_gpt2_xl_on_40_gib_fits_only_sharded(xl):
    cfg, n, family = xl
    layers, block = family.shape(cfg).n_layers, family.layer_weight_count(cfg)
    rest = n - layers * block  # embedding, head, norms, biases: whole on every tensor-parallel rank
    one = _est(xl)
    device = 40 * GiB
    assert not fits(one, device)

    fsdp = _est(xl, ParallelLayout(devices=8, engine="fsdp"))
    # fp32 shards of weights, gradients and moments over 8, plus the bf16 root and two gathered blocks,
    # the root's bf16 gradient and one block's (bf16, then fp32 for the reduce-scatter)
    assert fsdp.weights_bytes == n * 4 // 8 + 2 * (rest + 2 * block)
    assert fsdp.grads_bytes == n * 4 // 8 + 2 * rest + (2 + 4) * block
    assert fsdp.optimizer_bytes == n * 8 // 8
    assert (fsdp.activations_bytes, fsdp.logits_bytes) == (one.activations_bytes, one.logits_bytes)
    assert fits(fsdp, device)

    tp = _est(xl, ParallelLayout(devices=4, tp=4))
    local = layers * block // 4 + rest
    assert (tp.weights_bytes, tp.grads_bytes, tp.optimizer_bytes) == (6 * local, 6 * local, 8 * local)
    # Korthikanti et al. section 4.2: sbh (10 + 24 / t) per layer, the logits whole (the head is replicated)
    assert tp.activations_bytes == layers * S * B * 1600 * (10 + 24 // 4)
    assert tp.logits_bytes == one.logits_bytes
    assert fits(tp, device)


def test_tensor_parallel_splits_only_the_inner_activations():
    for preset in ("gpt2-debug", "llama3-debug"):
        cfg = get_config(preset)
        family = family_of(cfg)
        one, two, four = (family.activation_bytes_per_layer(cfg, 2, 64, flash_attention=False, tp=t) for t in (1, 2, 4))
        whole = 2 * two - one  # the part no rank splits: one = whole + split, two = whole + split / 2
        assert 0 < whole < one and four == whole + (one - whole) // 4, preset


def test_pipeline_keeps_its_stage_and_its_chunks_in_flight(xl):
    cfg, n, family = xl
    layers = family.shape(cfg).n_layers
    per_layer = family.activation_bytes_per_layer(cfg, B // 4, S, flash_attention=True)
    gpipe = _est(xl, ParallelLayout(devices=4, pp=4, pp_microbatches=4))
    # GPipe: all 4 chunks of B/4 in flight on a stage of 48/4 blocks, the whole micro-batch's activations
    assert gpipe.activations_bytes == 4 * math.ceil(layers / 4) * per_layer
    ofb = _est(xl, ParallelLayout(devices=4, pp=4, pp_microbatches=8, pp_schedule="1f1b"))
    # 1F1B: the first stage (the worst) keeps pp = 4 chunks of B/8
    assert ofb.activations_bytes == 4 * math.ceil(layers / 4) * family.activation_bytes_per_layer(
        cfg, B // 8, S, flash_attention=True)
    one = _est(xl)
    assert ofb.total_bytes < gpipe.total_bytes < one.total_bytes
    # a stage's weights: a quarter of the blocks and one end (the head with its tied projection, or the
    # embedding with its position table): far below the whole model, above a quarter of it
    assert n // 4 < gpipe.weights_bytes / 6 < n // 2


def test_context_parallel_divides_the_activations_and_logits(xl):
    one, cp = _est(xl), _est(xl, ParallelLayout(devices=2, cp=2))
    assert cp.activations_bytes == one.activations_bytes // 2 and cp.logits_bytes == one.logits_bytes // 2
    assert cp.weights_bytes == one.weights_bytes


def test_the_fit_check_takes_the_points_layout():
    # A point whose model fits its device only sharded: unsupported as one replica, let through under
    # FSDP over 8 (the check runs before anything is allocated, against the adapter's memory).
    from accel_kit.devices import get_adapter
    from accel_kit.engine.measurement import Context
    from accel_kit.engine.point import TrainPoint
    from accel_kit.engine.train_measure import TrainMeasurement

    class Fixed:  # the CPU adapter with a 40 GiB device
        def __init__(self):
            self.inner = get_adapter("cpu")

        def total_memory_bytes(self):
            return 40 * GiB

        def __getattr__(self, name):
            return getattr(self.inner, name)

    import torch

    def check(**layout):
        point = TrainPoint(system="cpu", preset=XL, precision="bf16", micro_batch_size=B, seq_len=S,
                           **layout)
        assert point.dp * point.replica_devices == point.devices  # the point is its own layout
        return TrainMeasurement(point, Context(Fixed(), torch.device("cpu"), world=point.devices)).fit()

    refused = check()
    assert refused["status"] == "unsupported" and refused["reason"].startswith("does not fit")
    assert "per device as pp 1 x dp 1 x cp 1 x tp 1 (ddp), device has 40.0 GiB" in refused["reason"]
    assert check(devices=8, engine="fsdp") is None and check(devices=4, tp=4) is None


def test_work_per_device_is_the_models_over_every_device_of_the_layout():
    # tokens and model FLOPs per device: the step's over all devices (dp x tp x pp), whatever the layout;
    # the model's FLOPs per token do not change with it
    from accel_kit.engine.measurement import Context
    from accel_kit.engine.point import TrainPoint
    from accel_kit.engine.train_measure import TrainMeasurement
    from accel_kit.devices import get_adapter
    import torch

    def measure(**layout):
        point = TrainPoint(system="cpu", preset="gpt2-debug", precision="fp32", micro_batch_size=4, seq_len=32,
                           **layout)
        return TrainMeasurement(point, Context(get_adapter("cpu"), torch.device("cpu"), world=point.devices))

    one = measure()
    for layout in ({"devices": 4, "tp": 2}, {"devices": 4, "pp": 2}, {"devices": 4, "tp": 4},
                   {"devices": 4, "engine": "fsdp"}):
        m, dp = measure(**layout), 4 // (layout.get("tp", 1) * layout.get("pp", 1))
        assert m.flops_per_token == one.flops_per_token and m.base["dp"] == dp, layout
        assert m.tokens_per_call == one.tokens_per_call * dp, layout  # the global batch: micro-batch x dp
        assert m.tokens_per_call_per_device * 4 == m.tokens_per_call, layout
        assert m.flops_per_call_per_device * 4 == m.flops_per_token * m.tokens_per_call, layout
