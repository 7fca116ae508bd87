"""Every registered model family answers the protocol consistently with its own modules.

Each check binds a family's declared figures (FLOPs, GEMM shapes, layer weights, stages) to the
model it builds, so a family that miscounts fails here whatever its formulas say; family-
specific figures (published counts, transformers equivalence) are in each family's own tests.
"""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from accel_kit.errors import ParameterError
from accel_kit.models import FAMILIES, PRESETS, count_params, family_of, family_of_model, get_config

# Each family's tiny debug preset (the first whose name ends so): the one its tests build.
DEBUG = {name: next(p for p in family.presets if p.endswith("-debug")) for name, family in FAMILIES.items()}


@pytest.fixture(params=sorted(FAMILIES))
def family_and_preset(request):
    return FAMILIES[request.param], DEBUG[request.param]


def _built(preset: str, **overrides):
    cfg = get_config(preset, **overrides)
    torch.manual_seed(0)
    return cfg, family_of(cfg).build(cfg)


def test_presets_are_unique_and_each_has_a_source():
    assert sum(len(f.presets) for f in FAMILIES.values()) == len(PRESETS)
    for family in FAMILIES.values():
        assert set(family.sources) == set(family.presets), family.name
        assert all(text.strip() for text in family.sources.values())


def test_matmul_flops_are_two_per_weight_of_the_linears_flops_count(family_and_preset):
    family, preset = family_and_preset
    cfg, model = _built(preset)
    seq = 32
    terms = family.flop_terms(cfg, seq)
    block_weights = sum(linear.weight.numel() for _, linear in family.prunable_linears(model))
    # every block linear's 2 FLOPs per weight, but for those weight sparsity leaves dense (MoE's router, experts)
    assert terms.matmul - terms.matmul_unpruned == 2 * block_weights
    shape = family.shape(cfg)
    assert terms.logits == 2 * shape.hidden_size * shape.vocab_size_model
    # The score and weighted-sum products: 2 x 2 FLOPs x seq per query-head dimension, every layer.
    assert terms.attention == shape.n_layers * 4 * seq * shape.n_heads * shape.head_dim
    assert terms.total() == 3 * terms.forward and terms.total("forward") == terms.forward
    assert terms.sparse(block_weights) == terms.total()


def test_gemm_shapes_are_the_products_of_one_layer(family_and_preset):
    family, preset = family_and_preset
    cfg = get_config(preset)
    tokens, seq = 64, 32
    products = sum(2 * m * k * n for m, k, n in family.gemm_shapes(cfg, tokens))
    assert products == tokens * family.layer_flop_terms(cfg, seq).matmul
    assert all(m == tokens for m, _, _ in family.gemm_shapes(cfg, tokens))


def test_one_layer_is_what_the_model_stacks(family_and_preset):
    family, preset = family_and_preset
    cfg, model = _built(preset)
    stages = family.pipeline_stages(model)
    blocks = getattr(model, stages.blocks)
    assert isinstance(blocks, nn.ModuleList) and len(blocks) == family.shape(cfg).n_layers
    assert all(hasattr(model, name) for name in stages.embedding + stages.head)
    layer = family.build_layer(cfg)

    def matrices(module: nn.Module) -> int:  # the weights of its linears, and of MoE's 3-D expert tensors
        return sum(p.numel() for p in module.parameters() if p.dim() >= 2)

    # the layer is one the model stacks (a MoE model's dense layers are another kind)
    assert matrices(layer) == family.layer_weight_count(cfg) in [matrices(block) for block in blocks]
    x = torch.randn(2, 8, family.shape(cfg).hidden_size)
    assert layer(x).shape == x.shape


def test_the_model_is_built_of_the_shared_decoder_pieces(family_and_preset):
    """Each family's model is the shared skeleton (``models.common``): its stages are the model's own
    declaration, each block the pre-norm layout, each attention the shared forward and cached forward."""
    from accel_kit.models.common.attention import SelfAttention
    from accel_kit.models.common.block import PreNormBlock
    from accel_kit.models.common.lm import CausalLM

    family, preset = family_and_preset
    _, model = _built(preset)
    assert isinstance(model, CausalLM) and family.pipeline_stages(model) == type(model).stages
    assert all(isinstance(block, PreNormBlock) and isinstance(block.parts()[1], SelfAttention)
               for block in model.blocks)


def test_the_model_trains_and_its_family_is_found_through_a_wrapper(family_and_preset):
    family, preset = family_and_preset
    cfg, model = _built(preset)
    vocab = family.shape(cfg).vocab_size
    idx = torch.randint(0, vocab, (2, 16))
    logits, loss = model(idx, idx)
    assert logits.shape[:2] == (2, 16) and logits.shape[-1] == family.shape(cfg).vocab_size_model
    loss.backward()
    assert family_of_model(nn.Sequential(model)) is family  # as under DDP's .module or compile's _orig_mod
    assert model.num_params() == count_params(preset)


def test_transformers_model_of_the_family(family_and_preset):
    family, preset = family_and_preset
    cfg, model = _built(preset)
    hf = family.to_hf(model)
    assert type(hf).__name__ == family.hf_model_class
    back = family.from_hf(hf)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), back.state_dict().values()))


def test_an_override_the_family_does_not_have_is_one_line(family_and_preset):
    family, preset = family_and_preset
    with pytest.raises(ParameterError, match=f"not one the {family.name} family has") as info:
        get_config(preset, n_layers=3)
    assert "\n" not in str(info.value)


def test_configs_round_trip_as_data(family_and_preset):
    family, preset = family_and_preset
    cfg = get_config(preset)
    assert family.config_from_dict(family.config_dict(cfg)) == cfg


def test_a_training_point_of_the_family_runs_sparse_and_records_its_shape(family_and_preset):
    from accel_kit.engine.point import TrainPoint
    from accel_kit.engine.worker import run_point

    family, preset = family_and_preset
    point = TrainPoint(system="cpu", preset=preset, precision="fp32", micro_batch_size=2, seq_len=32, steps=2,
                       warmup_steps=1, sparsity=0.5, sparsity_pattern="2:4")
    result = run_point(point, rank=0, world=1, local_rank=0)
    assert result["status"] == "ok", result.get("reason")
    m = result["metrics"]
    cfg = get_config(preset, seq_len=32)
    shape = family.shape(cfg)
    assert {k: m[k] for k in ("family", "n_kv_heads", "ffn_hidden_size", "n_layers")} == {
        "family": family.name, "n_kv_heads": shape.n_kv_heads, "ffn_hidden_size": shape.ffn_hidden_size,
        "n_layers": shape.n_layers}
    terms = family.flop_terms(cfg, 32)
    assert m["flops_per_token"] == terms.total()
    pruned = (terms.matmul - terms.matmul_unpruned) // 2  # the prunable weights
    assert m["flops_per_token_effective"] == terms.sparse(pruned // 2)  # half of them, 2 FLOPs each
    assert m["tokenizer"] is None  # synthetic tokens
    assert all(math.isfinite(loss) for loss in m["losses"])


def test_one_layer_of_the_family_is_timed_with_its_own_flops(family_and_preset):
    from accel_kit.engine.point import BlockPoint
    from accel_kit.engine.worker import run_point

    family, preset = family_and_preset
    point = BlockPoint(system="cpu", impl="native", precision="fp32", preset=preset, seq_len=16, batch_size=2,
                       direction="forward_backward", warmup=1, trials=2, tf32=False, torch_compile=False,
                       noisy_cv=0.5, seed=0)
    result = run_point(point, rank=0, world=1, local_rank=0)
    assert result["status"] == "ok", result.get("reason")
    cfg = get_config(preset, seq_len=16)
    assert result["metrics"]["flops"] == 2 * 16 * family.layer_flop_terms(cfg, 16).total("forward_backward")
    assert result["metrics"]["family"] == family.name


def test_grouped_query_attention_without_enable_gqa_repeats_kv_to_the_same_result(monkeypatch):
    """torch 2.4 (the Cerebras environment's) has no enable_gqa: the fallback repeats k and v per query head."""
    from accel_kit.models import sdpa
    from numerics import eps

    torch.manual_seed(0)
    q, k, v = torch.randn(2, 8, 32, 16), torch.randn(2, 2, 32, 16), torch.randn(2, 2, 32, 16)
    if not sdpa.HAS_ENABLE_GQA:
        pytest.skip("this torch has only the fallback")
    native = sdpa.causal_attention(q, k, v)
    monkeypatch.setattr(sdpa, "HAS_ENABLE_GQA", False)
    repeated = sdpa.causal_attention(q, k, v)
    # The same products in either path; a different kernel may order the sums over the 32 keys differently:
    # each output is a weighted mean of v, off by at most ~2 roundings per key.
    assert torch.allclose(native, repeated, rtol=0, atol=2 * 32 * eps(torch.float32) * v.abs().max().item())


def test_kernel_overrides_are_each_familys_own_config_fields():
    """The engine passes what ``kernel_overrides`` answers to ``get_config``: every family's answer is
    overridable there, and GPT-2's output-projection path follows the CPU adapter's bf16 answer."""
    from accel_kit.devices import get_adapter

    cpu = get_adapter("cpu")
    for name, family in FAMILIES.items():
        preset = next(p for p in PRESETS if family_of(p) is family)
        for dtype in (torch.float32, torch.bfloat16):
            overrides = family.kernel_overrides(cpu, dtype)
            assert set(overrides) <= set(family.overridable), name
            get_config(preset, **overrides)  # accepted as a point's override
    gpt2 = FAMILIES["gpt2"]
    assert gpt2.kernel_overrides(cpu, torch.bfloat16) == {"narrow_linear_fast_path": True}
    assert gpt2.kernel_overrides(cpu, torch.float32) == {"narrow_linear_fast_path": False}
    assert get_config("gpt2-debug", **gpt2.kernel_overrides(cpu, torch.bfloat16)).narrow_linear_fast_path
